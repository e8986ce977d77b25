"""Multi-class losses: ``nll_loss`` on log-probabilities and the fused
``cross_entropy`` on raw logits, with PyTorch's ``weight``, ``ignore_index``
and ``label_smoothing``.

Classes are on the **last** axis (EveryO's channels-last layout): logits
(N, C) or (N, d1, ..., C) with targets (N,) or (N, d1, ...); PyTorch puts
them on axis 1, which is the same thing for (N, C).

With class indices, one formula serves every option (PyTorch's)::

    w_i    = weight[t_i], or 0 where t_i == ignore_index
    nll_i  = -w_i * logp[i, t_i]
    soft_i = -sum_c weight[c] * logp[i, c]        (0 where ignored)
    loss_i = (1 - eps) * nll_i + eps / C * soft_i
    mean   = sum_i loss_i / sum_i w_i

so a weighted mean divides by the sum of the targets' weights, ignored
targets are left out of it, and the mean over nothing is NaN.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from everyo import _buffers
from everyo.casting import is_floating
from everyo.dispatch import FLOAT32, primitive
from everyo.errors import EveryODTypeError, EveryOShapeError
from everyo.functional import _t
from everyo.losses._common import (
    check_reduction,
    constant,
    float32_at_least,
    positional_reduction,
    reduce,
    same_shape,
    spread,
)
from everyo.tensor import Tensor

if TYPE_CHECKING:
    from everyo._typing import Array, TensorLike

__all__ = ["cross_entropy", "nll_loss"]


def _log_softmax(z: Array) -> tuple[Array, Array]:
    """``(log_softmax(z), softmax(z))`` over the last axis, stably."""
    with np.errstate(invalid="ignore", over="ignore"):
        # The same operations as (shifted - log(total), e / total), each written into an
        # array of ours: recycled ones where z allows (_buffers.out_for), else fresh.
        shifted = np.subtract(z, z.max(axis=-1, keepdims=True), out=_buffers.out_for(z))
        e = np.exp(shifted, out=_buffers.out_for(shifted))
        total = e.sum(axis=-1, keepdims=True)
        return np.subtract(shifted, np.log(total), out=shifted), np.divide(e, total, out=e)


def _class_targets(name: str, t: Array, lead: tuple[int, ...], classes: int, ignore_index: int) -> tuple[Array, Array]:
    """Checked targets, flattened: ``(index, valid)`` with ignored rows at index 0."""
    if not np.issubdtype(t.dtype, np.integer):
        raise EveryODTypeError(
            f"{name}: targets must be integer class indices (or, for cross_entropy, floating class "
            f"probabilities of the logits' shape), got dtype {t.dtype} of shape {t.shape} "
            f"(convert with targets.astype('int64'))"
        )
    if t.shape != lead:
        raise EveryOShapeError(
            f"{name}: inputs of shape {lead + (classes,)} need targets of shape {lead}, got {t.shape}"
        )
    t = t.reshape(-1).astype(np.int64)
    valid = t != ignore_index
    bad = valid & ((t < 0) | (t >= classes))
    if bad.any():
        raise ValueError(
            f"{name}: targets must be in [0, {classes}) or equal ignore_index={ignore_index}, got {t[bad][:5].tolist()}"
        )
    return np.where(valid, t, 0), valid


def _indexed(name, logp, t, weight, ignore_index, reduction, smoothing):
    """The loss over class indices from flat ``logp`` (M, C), and
    ``dloss_dlogp(g)``: its gradient with respect to ``logp``."""
    classes = logp.shape[-1]
    lead = logp.shape[:-1]
    lp = logp.reshape(-1, classes)
    index, valid = _class_targets(name, t, lead, classes, ignore_index)
    w = constant(weight, name, "weight", lp, shape=(classes,))
    rows = np.arange(len(index))
    wt = valid.astype(lp.dtype) if w is None else w[index] * valid
    # np.where, not a product with 0: an ignored row's -inf log-probability gives 0, not NaN.
    per = np.where(valid, -wt * lp[rows, index], 0)
    if smoothing:
        soft = np.where(valid, -(lp.sum(axis=1) if w is None else (lp * w).sum(axis=1)), 0)
        per = (1 - smoothing) * per + (smoothing / classes) * soft
    out, scale = reduce(per, reduction, wt.sum())
    out = out.reshape(lead) if reduction == "none" else out

    def dloss_dlogp(g):
        gi = spread(g.reshape(-1) if reduction == "none" else g, scale, per.shape)
        grad = _buffers.out_for(lp)
        if grad is None:
            grad = np.zeros_like(lp)
        else:
            grad.fill(0)
        grad[rows, index] = -(1 - smoothing) * wt * gi
        if smoothing:
            grad -= (smoothing / classes) * (gi * valid)[:, None] * (1.0 if w is None else w)
        return grad.reshape(logp.shape)

    return out, dloss_dlogp


@primitive("nll_loss", FLOAT32, kind="loss", inputs=("log_probs", "targets"))
def nll_loss(
    log_probs: TensorLike,
    targets: TensorLike,
    weight: TensorLike | None = None,
    *,
    ignore_index: int = -100,
    reduction: str = "mean",
) -> Tensor:
    """Negative log-likelihood ``-weight[t] * log_probs[..., t]`` (PyTorch's ``nll_loss``).

    Args:
        log_probs: (N, C) or (N, d1, ..., C) log-probabilities, e.g. from
            :func:`everyo.log_softmax` (classes last).
        targets: integer class indices of shape (N,) or (N, d1, ...).
        weight: optional (C,) class weights (a constant: no gradient flows into it).
        ignore_index: targets equal to it contribute nothing, not even to the
            mean's denominator.
        reduction: ``"mean"`` (the sum divided by the sum of the targets'
            weights), ``"sum"`` or ``"none"`` (one value per target).

    Examples:
        >>> logp = eo.log_softmax(eo.tensor([[2.0, 0.0], [0.0, 2.0]]))
        >>> round(eo.nll_loss(logp, [0, -100]).item(), 4)  # the second target is ignored
        0.1269
    """
    check_reduction("nll_loss", reduction)
    (log_probs,) = float32_at_least(_t(log_probs))
    t = targets.data if isinstance(targets, Tensor) else np.asarray(targets)
    out, dloss = _indexed("nll_loss", log_probs.data, t, weight, ignore_index, reduction, 0.0)
    return Tensor._from_op(np.asarray(out, log_probs.data.dtype), (log_probs,), lambda g: (dloss(g),))


@primitive("cross_entropy", FLOAT32, kind="loss", inputs=("logits", "targets"))
def cross_entropy(
    logits: TensorLike,
    targets: TensorLike,
    weight: TensorLike | None = None,
    *,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
) -> Tensor:
    """Softmax cross-entropy from raw ``logits`` (PyTorch's ``cross_entropy``).

    Fused: log-softmax and the negative log-likelihood in one op whose
    gradient never overflows.

    Args:
        logits: (N, C) or (N, d1, ..., C) (classes last).
        targets: integer class indices of shape (N,) or (N, d1, ...), or class
            probabilities of the logits' shape (a floating array).
        weight: optional (C,) class weights (a constant).
        ignore_index: with class indices, targets equal to it contribute
            nothing, not even to the mean's denominator.
        reduction: ``"mean"``, ``"sum"`` or ``"none"``. With class indices the
            mean divides by the sum of the targets' weights (the number of
            targets not ignored, without ``weight``); with probabilities, by
            the number of rows. Over nothing it is NaN, as in PyTorch.
        label_smoothing: ``eps`` in [0, 1]: the target becomes
            ``(1 - eps) * one_hot + eps / C`` (weighted as PyTorch does).

    Examples:
        >>> z = eo.tensor([[2.0, 0.0, 0.0], [0.0, 0.0, 3.0]])
        >>> [round(v, 4) for v in eo.cross_entropy(z, [0, 2], reduction="none").tolist()]
        [0.2395, 0.0949]
        >>> round(eo.cross_entropy(z, [0, 2], label_smoothing=0.1).item(), 4)
        0.3339
    """
    weight, reduction = positional_reduction(weight, reduction)
    check_reduction("cross_entropy", reduction)
    if isinstance(label_smoothing, bool) or not 0.0 <= float(label_smoothing) <= 1.0:
        raise ValueError(f"cross_entropy: label_smoothing must be in [0, 1], got {label_smoothing!r}")
    eps = float(label_smoothing)
    (logits,) = float32_at_least(_t(logits))
    z = logits.data
    if z.ndim < 1:
        raise EveryOShapeError(f"cross_entropy: logits need a class axis (last), got shape {z.shape}")
    logp, p = _log_softmax(z)
    t = targets.data if isinstance(targets, Tensor) else np.asarray(targets)
    if t.shape == z.shape and (t.dtype.kind == "f" or is_floating(t.dtype)):
        return _probabilities(logits, logp, p, targets, weight, ignore_index, reduction, eps)
    out, dloss = _indexed("cross_entropy", logp, t, weight, ignore_index, reduction, eps)

    def backward(g):
        d = dloss(g)
        step = np.multiply(p, d.sum(axis=-1, keepdims=True), out=_buffers.out_for(p, d))
        return (np.subtract(d, step, out=step),)

    return Tensor._from_op(np.asarray(out, z.dtype), (logits,), backward)


def _probabilities(logits, logp, p, targets, weight, ignore_index, reduction, eps):
    """cross_entropy with class-probability targets (PyTorch's rule: the mean
    divides by the number of rows, whatever the weights)."""
    if ignore_index != -100:
        raise ValueError("cross_entropy: ignore_index is not supported with class-probability targets (as in PyTorch)")
    (targets,) = float32_at_least(_t(targets))
    same_shape(logits, targets, "cross_entropy")
    classes = logp.shape[-1]
    y = targets.data * (1 - eps) + eps / classes if eps else targets.data
    w = constant(weight, "cross_entropy", "weight", logp, shape=(classes,))
    yw = y if w is None else y * w
    per = -(logp * yw).sum(axis=-1)
    out, scale = reduce(per, reduction, per.size)

    def backward(g):
        gi = spread(g, scale, per.shape)[..., None]
        d = -yw * gi
        gz = d - p * d.sum(axis=-1, keepdims=True)
        gy = None
        if targets.requires_grad:
            gy = -(1 - eps) * logp * gi * (1.0 if w is None else w)
        return gz, gy

    return Tensor._from_op(np.asarray(out, logp.dtype), (logits, targets), backward)
