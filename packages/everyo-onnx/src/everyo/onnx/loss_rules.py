"""Rules for core's fused losses, so a model whose forward() returns a loss
(e.g. a scorer exported with its targets as a second input) exports too.

Each follows core's formula: ``mse = reduce((pred - target)^2)``,
``cross_entropy = reduce(-log_softmax(logits)[target])``,
``bce = reduce(relu(x) - x*y + softplus(-|x|))`` (``softplus(-|x|)`` is core's
``log1p(exp(-|x|))``; ONNX has no Log1p), with ``reduce`` the mean or sum over
every element.
"""

import numpy as np

from everyo.onnx.registry import rule


def _reduce(t, node, per_element, ndim):
    op = "ReduceMean" if node.attrs.get("reduction", "mean") == "mean" else "ReduceSum"
    if ndim == 0:
        return t.g.node("Identity", [per_element])
    return t.g.reduce(op, per_element, list(range(ndim)), False)


def mse_loss(t, node):
    pred, target = node.inputs
    diff = t.g.node("Sub", [t.name(pred, np.float32, 0), t.name(target, np.float32, 1)])
    t.set(node.outputs[0], _reduce(t, node, t.g.node("Mul", [diff, diff]), pred.data.ndim))


def cross_entropy(t, node):
    logits, targets = node.inputs
    g = t.g
    log_p = g.node("LogSoftmax", [t.name(logits, np.float32, 0)], axis=-1)
    index = g.unsqueeze(t.name(targets, np.int64, 1), [targets.data.ndim])
    picked = g.squeeze(g.node("GatherElements", [log_p, index], axis=targets.data.ndim), [targets.data.ndim])
    t.set(node.outputs[0], _reduce(t, node, g.node("Neg", [picked]), targets.data.ndim))


def binary_cross_entropy_with_logits(t, node):
    logits, targets = node.inputs
    g = t.g
    x, y = t.name(logits, np.float32, 0), t.name(targets, np.float32, 1)
    softplus = g.node("Softplus", [g.node("Neg", [g.node("Abs", [x])])])
    per = g.node("Add", [g.node("Sub", [g.node("Relu", [x]), g.node("Mul", [x, y])]), softplus])
    t.set(node.outputs[0], _reduce(t, node, per, logits.data.ndim))


for _fn in (mse_loss, cross_entropy, binary_cross_entropy_with_logits):
    rule(_fn.__name__)(_fn)
