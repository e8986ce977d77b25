"""Binary (multi-label) losses: ``binary_cross_entropy`` on probabilities and
the stable ``binary_cross_entropy_with_logits``, with PyTorch's ``weight``
(per element, broadcast) and ``pos_weight`` (per class, on the last axis)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from everyo.dispatch import FLOAT32, primitive
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
    from everyo._typing import TensorLike

__all__ = ["binary_cross_entropy", "binary_cross_entropy_with_logits"]

# PyTorch clamps each log at -100 (so a probability of exactly 0 or 1 gives a
# finite loss) and divides the gradient by max(p * (1 - p), 1e-12).
_LOG_FLOOR = -100.0
_GRAD_EPS = 1e-12


@primitive("binary_cross_entropy", FLOAT32, kind="loss", inputs=("probs", "targets"))
def binary_cross_entropy(
    probs: TensorLike, targets: TensorLike, weight: TensorLike | None = None, *, reduction: str = "mean"
) -> Tensor:
    """``-weight * (y * log(p) + (1 - y) * log(1 - p))`` on probabilities (PyTorch's
    ``binary_cross_entropy``: each log clamped at -100).

    Prefer :func:`binary_cross_entropy_with_logits` on raw scores: it is
    stable where ``sigmoid`` has rounded to 0 or 1.

    Args:
        probs: probabilities in [0, 1] (anything outside raises).
        targets: the same shape.
        weight: optional weights broadcast to ``probs`` (a constant).
        reduction: ``"mean"`` (over every element), ``"sum"`` or ``"none"``.

    Examples:
        >>> round(eo.binary_cross_entropy(eo.tensor([0.9, 0.2]), eo.tensor([1.0, 0.0])).item(), 4)
        0.1643
    """
    check_reduction("binary_cross_entropy", reduction)
    probs, targets = float32_at_least(_t(probs), _t(targets))
    same_shape(probs, targets, "binary_cross_entropy")
    p, y = probs.data, targets.data
    outside = (p < 0) | (p > 1)
    if outside.any():
        raise ValueError(
            f"binary_cross_entropy: probabilities must be in [0, 1], got {p[outside][:3].tolist()} "
            "(pass raw scores to binary_cross_entropy_with_logits instead)"
        )
    w = constant(weight, "binary_cross_entropy", "weight", p)
    with np.errstate(divide="ignore"):
        log_p, log_q = np.maximum(np.log(p), _LOG_FLOOR), np.maximum(np.log1p(-p), _LOG_FLOOR)
    per = -(y * log_p + (1 - y) * log_q)
    if w is not None:
        per = per * w
    out, scale = reduce(per, reduction)

    def backward(g):
        gi = spread(g, scale, per.shape) if w is None else spread(g, scale, per.shape) * w
        gp = gi * (p - y) / np.maximum(p * (1 - p), _GRAD_EPS)
        gy = gi * (log_q - log_p) if targets.requires_grad else None
        return gp, gy

    return Tensor._from_op(np.asarray(out, p.dtype), (probs, targets), backward)


@primitive("binary_cross_entropy_with_logits", FLOAT32, kind="loss", inputs=("logits", "targets"))
def binary_cross_entropy_with_logits(
    logits: TensorLike,
    targets: TensorLike,
    weight: TensorLike | None = None,
    *,
    reduction: str = "mean",
    pos_weight: TensorLike | None = None,
) -> Tensor:
    """Sigmoid and binary cross-entropy in one stable op (PyTorch's
    ``binary_cross_entropy_with_logits``)::

        loss = weight * ((1 - y) * x + (1 + (pos_weight - 1) * y) * softplus(-x))

    Args:
        logits: raw scores ``x``.
        targets: ``y`` of the same shape (probabilities; need not be 0 or 1).
        weight: optional weights broadcast to ``logits`` (a constant).
        reduction: ``"mean"`` (over every element), ``"sum"`` or ``"none"``.
        pos_weight: optional weight of the positive term, broadcast along the
            last axis (one per class: (C,)), e.g. ``negatives / positives``.

    Examples:
        >>> x, y = eo.tensor([[2.0, -1.0]]), eo.tensor([[1.0, 1.0]])
        >>> [round(v, 4) for v in eo.binary_cross_entropy_with_logits(x, y, reduction="none")[0].tolist()]
        [0.1269, 1.3133]
        >>> round(eo.binary_cross_entropy_with_logits(x, y, pos_weight=[1.0, 3.0], reduction="sum").item(), 4)
        4.0667
    """
    weight, reduction = positional_reduction(weight, reduction)
    name = "binary_cross_entropy_with_logits"
    check_reduction(name, reduction)
    logits, targets = float32_at_least(_t(logits), _t(targets))
    same_shape(logits, targets, name)
    x, y = logits.data, targets.data
    w = constant(weight, name, "weight", x)
    pw = constant(pos_weight, name, "pos_weight", x)
    softplus_neg = np.maximum(-x, 0) + np.log1p(np.exp(-np.abs(x)))  # log(1 + exp(-x)), stably
    lw = 1.0 if pw is None else 1 + (pw - 1) * y
    per = (1 - y) * x + lw * softplus_neg
    if w is not None:
        per = per * w
    out, scale = reduce(per, reduction)

    def backward(g):
        gi = spread(g, scale, per.shape) if w is None else spread(g, scale, per.shape) * w
        sig_neg = np.exp(-np.logaddexp(0, x))  # sigmoid(-x)
        gx = gi * ((1 - y) - lw * sig_neg)
        gy = None
        if targets.requires_grad:
            gy = gi * (-x + (0.0 if pw is None else (pw - 1) * softplus_neg))
        return gx, gy

    return Tensor._from_op(np.asarray(out, x.dtype), (logits, targets), backward)
