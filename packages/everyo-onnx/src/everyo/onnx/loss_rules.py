"""Rules for core's losses, so a model whose forward() returns a loss (e.g. a
scorer exported with its targets as a second input) exports too.

Each follows core's formula (``everyo.losses``), with every option core has:
``reduction`` ``"none"`` (no reduce), ``"mean"`` or ``"sum"``; class
``weight``, ``ignore_index`` and ``label_smoothing`` (cross_entropy,
nll_loss); element ``weight`` and ``pos_weight`` (the binary losses); and
kl_div's ``batchmean`` and ``log_target``. Weights are constants of the graph.
``softplus(-|x|)`` stands for core's ``log1p(exp(-|x|))`` (ONNX has no Log1p).
"""

import numpy as np

from everyo.onnx.registry import rule

F32 = np.float32


def _reduce(t, node, per, ndim, denominator=None):
    reduction = node.attrs.get("reduction", "mean")
    if reduction == "none":
        t.set(node.outputs[0], t.g.node("Identity", [per]))
        return
    axes = list(range(ndim))
    if reduction == "sum" or denominator is not None:
        total = t.g.reduce("ReduceSum", per, axes, False) if ndim else t.g.node("Identity", [per])
        if denominator is not None:
            total = t.g.node("Div", [total, denominator])
        t.set(node.outputs[0], total)
        return
    if reduction == "batchmean":
        total = t.g.reduce("ReduceSum", per, axes, False)
        batch = t.g.cast(t.dim(per, 0), F32)
        t.set(node.outputs[0], t.g.node("Div", [total, t.g.squeeze(batch, [0])]))
        return
    t.set(node.outputs[0], t.g.reduce("ReduceMean", per, axes, False) if ndim else t.g.node("Identity", [per]))


def _weight(t, value, base):
    if value is None:
        return None
    return t.g.constant(np.asarray(getattr(value, "data", value), dtype=F32), base)


def _c(t, value):
    return t.g.scalar(value, F32)


# --- regression ---------------------------------------------------------------------
def _diff(t, node):
    pred, target = node.inputs
    return t.g.node("Sub", [t.name(pred, F32, 0), t.name(target, F32, 1)]), pred.data.ndim


def mse_loss(t, node):
    d, ndim = _diff(t, node)
    _reduce(t, node, t.g.node("Mul", [d, d]), ndim)


def l1_loss(t, node):
    d, ndim = _diff(t, node)
    _reduce(t, node, t.g.node("Abs", [d]), ndim)


def _smooth(t, d, threshold, scale):
    """``0.5 d^2 / threshold * scale`` inside, ``(|d| - 0.5 threshold) * scale`` outside."""
    g = t.g
    a = g.node("Abs", [d])
    inside = g.node("Mul", [g.node("Mul", [d, d]), _c(t, 0.5 / threshold * scale)])
    outside = g.node("Mul", [g.node("Sub", [a, _c(t, 0.5 * threshold)]), _c(t, scale)])
    return g.node("Where", [g.node("Less", [a, _c(t, threshold)]), inside, outside])


def smooth_l1_loss(t, node):
    d, ndim = _diff(t, node)
    beta = float(node.attrs.get("beta", 1.0))
    _reduce(t, node, t.g.node("Abs", [d]) if beta == 0 else _smooth(t, d, beta, 1.0), ndim)


def huber_loss(t, node):
    d, ndim = _diff(t, node)
    delta = float(node.attrs.get("delta", 1.0))
    _reduce(t, node, _smooth(t, d, delta, delta), ndim)


# --- classification ------------------------------------------------------------------
def _indexed(t, node, logp):
    """nll with weight, ignore_index and label smoothing, as core computes it."""
    g = t.g
    targets = node.inputs[1]
    ndim = targets.data.ndim
    classes = node.inputs[0].data.shape[-1]
    eps = float(node.attrs.get("label_smoothing", 0.0))
    tgt = t.name(targets, np.int64, 1)
    valid = g.node("Not", [g.node("Equal", [tgt, g.scalar(int(node.attrs.get("ignore_index", -100)), np.int64)])])
    index = g.node("Where", [valid, tgt, g.scalar(0, np.int64)])
    picked = g.squeeze(g.node("GatherElements", [logp, g.unsqueeze(index, [ndim])], axis=ndim), [ndim])
    w = _weight(t, node.attrs.get("weight"), "class_weight")
    valid_f = g.cast(valid, F32)
    wt = valid_f if w is None else g.node("Mul", [g.node("Gather", [w, index], axis=0), valid_f])
    per = g.node("Neg", [g.node("Mul", [picked, wt])])
    if eps:
        weighted = logp if w is None else g.node("Mul", [logp, w])
        soft = g.node("Neg", [g.node("Mul", [g.reduce("ReduceSum", weighted, [ndim], False), valid_f])])
        per = g.node("Add", [g.node("Mul", [per, _c(t, 1 - eps)]), g.node("Mul", [soft, _c(t, eps / classes)])])
    den = None
    if node.attrs.get("reduction", "mean") == "mean":
        den = g.reduce("ReduceSum", wt, list(range(ndim)), False) if ndim else wt
    _reduce(t, node, per, ndim, den)


def nll_loss(t, node):
    _indexed(t, node, t.name(node.inputs[0], F32, 0))


def cross_entropy(t, node):
    logits, targets = node.inputs
    logp = t.g.node("LogSoftmax", [t.name(logits, F32, 0)], axis=-1)
    if targets.dtype.kind != "f":
        _indexed(t, node, logp)
        return
    g = t.g
    eps = float(node.attrs.get("label_smoothing", 0.0))
    classes = logits.data.shape[-1]
    y = t.name(targets, F32, 1)
    if eps:
        y = g.node("Add", [g.node("Mul", [y, _c(t, 1 - eps)]), _c(t, eps / classes)])
    w = _weight(t, node.attrs.get("weight"), "class_weight")
    if w is not None:
        y = g.node("Mul", [y, w])
    ndim = logits.data.ndim - 1
    per = g.node("Neg", [g.reduce("ReduceSum", g.node("Mul", [logp, y]), [ndim], False)])
    _reduce(t, node, per, ndim)


# --- binary ----------------------------------------------------------------------------
def binary_cross_entropy_with_logits(t, node):
    logits, targets = node.inputs
    g = t.g
    x, y = t.name(logits, F32, 0), t.name(targets, F32, 1)
    # softplus(-x) = relu(-x) + softplus(-|x|)
    softplus_neg = g.node(
        "Add", [g.node("Relu", [g.node("Neg", [x])]), g.node("Softplus", [g.node("Neg", [g.node("Abs", [x])])])]
    )
    pw = _weight(t, node.attrs.get("pos_weight"), "pos_weight")
    if pw is not None:
        lw = g.node("Add", [_c(t, 1.0), g.node("Mul", [g.node("Sub", [pw, _c(t, 1.0)]), y])])
        softplus_neg = g.node("Mul", [lw, softplus_neg])
    per = g.node("Add", [g.node("Mul", [g.node("Sub", [_c(t, 1.0), y]), x]), softplus_neg])
    w = _weight(t, node.attrs.get("weight"), "weight")
    _reduce(t, node, per if w is None else g.node("Mul", [per, w]), logits.data.ndim)


def binary_cross_entropy(t, node):
    probs, targets = node.inputs
    g = t.g
    p, y = t.name(probs, F32, 0), t.name(targets, F32, 1)
    floor = _c(t, -100.0)
    log_p = g.node("Max", [g.node("Log", [p]), floor])
    log_q = g.node("Max", [g.node("Log", [g.node("Sub", [_c(t, 1.0), p])]), floor])
    terms = g.node("Add", [g.node("Mul", [y, log_p]), g.node("Mul", [g.node("Sub", [_c(t, 1.0), y]), log_q])])
    per = g.node("Neg", [terms])
    w = _weight(t, node.attrs.get("weight"), "weight")
    _reduce(t, node, per if w is None else g.node("Mul", [per, w]), probs.data.ndim)


def kl_div(t, node):
    log_probs, target = node.inputs
    g = t.g
    x, y = t.name(log_probs, F32, 0), t.name(target, F32, 1)
    if node.attrs.get("log_target"):
        per = g.node("Mul", [g.node("Exp", [y]), g.node("Sub", [y, x])])
    else:
        ylogy = g.node("Where", [g.node("Equal", [y, _c(t, 0.0)]), _c(t, 0.0), g.node("Mul", [y, g.node("Log", [y])])])
        per = g.node("Sub", [ylogy, g.node("Mul", [y, x])])
    _reduce(t, node, per, log_probs.data.ndim)


for _fn in (
    mse_loss,
    l1_loss,
    smooth_l1_loss,
    huber_loss,
    nll_loss,
    cross_entropy,
    binary_cross_entropy,
    binary_cross_entropy_with_logits,
    kl_div,
):
    rule(_fn.__name__)(_fn)
