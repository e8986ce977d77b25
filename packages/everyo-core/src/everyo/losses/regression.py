"""Regression losses on predictions and targets of the same shape: squared
error, absolute error, and the two losses between them (smooth L1, Huber)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from everyo import _buffers
from everyo.dispatch import FLOAT32, primitive
from everyo.functional import _t
from everyo.losses._common import check_reduction, float32_at_least, reduce, same_shape, spread
from everyo.tensor import Tensor

if TYPE_CHECKING:
    from collections.abc import Callable

    from everyo._typing import Array, TensorLike

__all__ = ["mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss"]


def _pointwise(
    name: str,
    pred: TensorLike,
    target: TensorLike,
    reduction: str,
    value: Callable[[Array], Array],
    slope: Callable[[Array], Array],
) -> Tensor:
    """``reduce(value(pred - target))``; ``slope`` is value's derivative."""
    check_reduction(name, reduction)
    pred, target = float32_at_least(_t(pred), _t(target))
    same_shape(pred, target, name)
    diff = np.subtract(pred.data, target.data, out=_buffers.out_for(pred.data, target.data))
    out, scale = reduce(value(diff), reduction)

    def backward(g):
        factor, s = spread(g, scale, diff.shape), slope(diff)
        into = _buffers.out_for(diff) if np.result_type(factor, s) == diff.dtype else None
        gp = np.multiply(factor, s, out=into)
        return gp, (-gp if target.requires_grad else None)

    return Tensor._from_op(np.asarray(out, dtype=diff.dtype), (pred, target), backward)


def _square(d: Array) -> Array:
    return np.multiply(d, d, out=_buffers.out_for(d))  # d * d


def _twice(d: Array) -> Array:
    return np.multiply(2, d, out=_buffers.out_for(d))  # 2 * d


@primitive("mse_loss", FLOAT32, kind="loss", inputs=("pred", "target"))
def mse_loss(pred: TensorLike, target: TensorLike, reduction: str = "mean") -> Tensor:
    """Squared error ``(pred - target) ** 2``, reduced.

    Args:
        pred: predictions.
        target: targets of the same shape (PyTorch broadcasts them with a
            warning; EveryO refuses, naming both shapes).
        reduction: ``"mean"`` (default), ``"sum"`` or ``"none"`` (one value
            per element). Over zero elements the mean is NaN, as in PyTorch,
            without a warning; ``"sum"`` gives 0.

    Examples:
        >>> eo.mse_loss(eo.tensor([1.0, 2.0]), eo.tensor([0.0, 0.0]), reduction="none").tolist()
        [1.0, 4.0]
    """
    return _pointwise("mse_loss", pred, target, reduction, _square, _twice)


@primitive("l1_loss", FLOAT32, kind="loss", inputs=("pred", "target"))
def l1_loss(pred: TensorLike, target: TensorLike, reduction: str = "mean") -> Tensor:
    """Absolute error ``|pred - target|``, reduced as in :func:`mse_loss`; the
    gradient at a zero difference is 0 (PyTorch's ``sign``).

    Examples:
        >>> eo.l1_loss(eo.tensor([1.0, -2.0]), eo.tensor([0.0, 0.0])).item()
        1.5
    """
    return _pointwise("l1_loss", pred, target, reduction, np.abs, np.sign)


def _check_positive(name: str, arg: str, value: float, allow_zero: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or (value == 0 and not allow_zero):
        raise ValueError(
            f"{name}: {arg} must be a {'non-negative' if allow_zero else 'positive'} number, got {value!r}"
        )
    return float(value)


@primitive("smooth_l1_loss", FLOAT32, kind="loss", inputs=("pred", "target"))
def smooth_l1_loss(pred: TensorLike, target: TensorLike, reduction: str = "mean", beta: float = 1.0) -> Tensor:
    """Smooth L1: ``0.5 * d**2 / beta`` where ``|d| < beta``, else ``|d| - 0.5 * beta``
    (``d = pred - target``; PyTorch's ``smooth_l1_loss``; ``beta=0`` is the L1 loss).

    Examples:
        >>> eo.smooth_l1_loss(eo.tensor([0.5, 3.0]), eo.tensor([0.0, 0.0]), reduction="none").tolist()
        [0.125, 2.5]
    """
    beta = _check_positive("smooth_l1_loss", "beta", beta, allow_zero=True)
    if beta == 0:
        return _pointwise("smooth_l1_loss", pred, target, reduction, np.abs, np.sign)
    return _pointwise(
        "smooth_l1_loss",
        pred,
        target,
        reduction,
        lambda d: np.where(np.abs(d) < beta, 0.5 * d * d / beta, np.abs(d) - 0.5 * beta),
        lambda d: np.where(np.abs(d) < beta, d / beta, np.sign(d)),
    )


@primitive("huber_loss", FLOAT32, kind="loss", inputs=("pred", "target"))
def huber_loss(pred: TensorLike, target: TensorLike, reduction: str = "mean", delta: float = 1.0) -> Tensor:
    """Huber: ``0.5 * d**2`` where ``|d| < delta``, else ``delta * (|d| - 0.5 * delta)``
    (PyTorch's ``huber_loss``: ``smooth_l1_loss`` times ``beta``).

    Examples:
        >>> eo.huber_loss(eo.tensor([0.5, 3.0]), eo.tensor([0.0, 0.0]), reduction="none", delta=2.0).tolist()
        [0.125, 4.0]
    """
    delta = _check_positive("huber_loss", "delta", delta, allow_zero=False)
    return _pointwise(
        "huber_loss",
        pred,
        target,
        reduction,
        lambda d: np.where(np.abs(d) < delta, 0.5 * d * d, delta * (np.abs(d) - 0.5 * delta)),
        lambda d: np.clip(d, -delta, delta),
    )
