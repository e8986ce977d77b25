"""Loss functions, fused and numerically stable; they run in float32 under autocast."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from everyo.dispatch import FLOAT32, primitive
from everyo.errors import EveryODTypeError, EveryOShapeError
from everyo.functional import _t
from everyo.half import is_low_precision
from everyo.tensor import Tensor

if TYPE_CHECKING:
    from everyo._typing import TensorLike

__all__ = ["mse_loss", "cross_entropy", "binary_cross_entropy_with_logits"]


def _float32_at_least(*tensors: Tensor) -> tuple[Tensor, ...]:
    """Losses always run in float32 or wider, with or without autocast.

    The spec's loop computes the loss *after* the autocast block, on float16
    predictions; a float16 log-sum-exp or mean over a batch is exactly where 16
    bits run out of range. The cast is a graph node, so the gradient flowing
    back into float16 predictions is still float16. (The op table's FLOAT32
    category has already routed them through the precision policy.)
    """
    return tuple(t.astype("float32") if is_low_precision(t.data.dtype) else t for t in tensors)


def _reduce(per_element, reduction, name):
    if reduction == "mean":
        if per_element.size == 0:
            # Decision (issue 13.5): the mean over no elements is NaN, as in
            # PyTorch, but returned deliberately (no "Mean of empty slice"
            # RuntimeWarning); its gradient is the empty array. Use
            # reduction="sum" (0 over nothing) where empty batches are expected.
            return np.full((), np.nan, dtype=per_element.dtype), 0.0
        return per_element.mean(), 1.0 / per_element.size
    if reduction == "sum":
        return per_element.sum(), 1.0
    raise ValueError(f"{name}: reduction must be 'mean' or 'sum', got {reduction!r}")


def _same_shape(pred, target, name):
    if pred.data.shape != target.data.shape:
        raise EveryOShapeError(
            f"{name}: predictions have shape {pred.data.shape} but targets have shape "
            f"{target.data.shape}; they must match (reshape the targets, e.g. y.reshape(-1, 1))"
        )


@primitive("mse_loss", FLOAT32, kind="loss", inputs=("pred", "target"))
def mse_loss(pred: TensorLike, target: TensorLike, reduction: str = "mean") -> Tensor:
    """Mean squared error ``mean((pred - target) ** 2)``.

    Over zero elements (an empty batch) the mean is NaN, as in PyTorch, without
    a warning, and the gradient is empty; ``reduction="sum"`` gives 0.
    """
    pred, target = _float32_at_least(_t(pred), _t(target))
    _same_shape(pred, target, "mse_loss")
    diff = pred.data - target.data
    out, scale = _reduce(diff * diff, reduction, "mse_loss")

    def backward(g):
        gp = g * (2 * scale) * diff
        return gp, (-gp if target.requires_grad else None)

    return Tensor._from_op(np.asarray(out, dtype=diff.dtype), (pred, target), backward)


@primitive("cross_entropy", FLOAT32, kind="loss", inputs=("logits", "targets"))
def cross_entropy(logits: TensorLike, targets: TensorLike, reduction: str = "mean") -> Tensor:
    """Softmax cross-entropy from raw ``logits`` (N, C) and integer class ``targets`` (N,).

    Fused: log-softmax and the negative log-likelihood in one op whose
    gradient is ``softmax(logits) - one_hot(targets)``, which never overflows.
    Extra leading axes are allowed: logits (N, T, C) with targets (N, T).
    Over zero rows (an empty batch) the mean is NaN, as in PyTorch, without a
    warning, and the gradient is empty; ``reduction="sum"`` gives 0.
    """
    (logits,) = _float32_at_least(_t(logits))
    t = targets.data if isinstance(targets, Tensor) else np.asarray(targets)
    z = logits.data
    if not np.issubdtype(t.dtype, np.integer):
        raise EveryODTypeError(
            f"cross_entropy: targets must be integer class indices, got dtype {t.dtype} "
            f"(convert with targets.astype('int64'))"
        )
    if z.ndim < 1 or t.shape != z.shape[:-1]:
        raise EveryOShapeError(
            f"cross_entropy: logits of shape {z.shape} need targets of shape {z.shape[:-1]}, got {t.shape}"
        )
    classes = z.shape[-1]
    if t.size and (t.min() < 0 or t.max() >= classes):
        raise ValueError(f"cross_entropy: targets must be in [0, {classes}), got values from {t.min()} to {t.max()}")
    z2 = z.reshape(-1, classes)
    t2 = t.reshape(-1)
    shifted = z2 - z2.max(axis=1, keepdims=True)
    log_norm = np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    rows = np.arange(len(t2))
    nll = log_norm[:, 0] - shifted[rows, t2]
    out, scale = _reduce(nll, reduction, "cross_entropy")

    def backward(g):
        grad = np.exp(shifted - log_norm)
        grad[rows, t2] -= 1
        grad *= g * scale
        return (grad.reshape(z.shape),)

    return Tensor._from_op(np.asarray(out, dtype=z.dtype), (logits,), backward)


@primitive("binary_cross_entropy_with_logits", FLOAT32, kind="loss", inputs=("logits", "targets"))
def binary_cross_entropy_with_logits(logits: TensorLike, targets: TensorLike, reduction: str = "mean") -> Tensor:
    """Sigmoid + binary cross-entropy in one stable op:
    ``max(x, 0) - x * y + log1p(exp(-|x|))``.

    Over zero elements the mean is NaN, as in PyTorch, without a warning, and
    the gradient is empty; ``reduction="sum"`` gives 0."""
    logits, targets = _float32_at_least(_t(logits), _t(targets))
    _same_shape(logits, targets, "binary_cross_entropy_with_logits")
    x, y = logits.data, targets.data
    per = np.maximum(x, 0) - x * y + np.log1p(np.exp(-np.abs(x)))
    out, scale = _reduce(per, reduction, "binary_cross_entropy_with_logits")

    def backward(g):
        sig = np.exp(-np.logaddexp(0, -x))
        gx = g * scale * (sig - y)
        gy = (g * scale * -x) if targets.requires_grad else None
        return gx, gy

    return Tensor._from_op(np.asarray(out, dtype=x.dtype), (logits, targets), backward)
