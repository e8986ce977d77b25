"""Reductions beyond sum/mean/var/max/min: argmax, argmin, cumsum, prod, std,
logsumexp and vector norms.

Axis arguments follow NumPy (``axis=None`` means every axis, negative axes
count from the end) and are checked by :mod:`everyo.axes`. Reductions that
add many values run in float32 under autocast (category ``FLOAT32``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from everyo.axes import normalize_axes, normalize_axis
from everyo.dispatch import FLOAT32, primitive
from everyo.functional import _expand, _t
from everyo.tensor import Tensor

if TYPE_CHECKING:
    from typing import Literal

    from everyo._typing import Axis, TensorLike

__all__ = ["argmax", "argmin", "cumsum", "prod", "std", "logsumexp", "norm"]


def _count(shape, axes):
    return int(np.prod([shape[i] for i in axes])) if axes else 1


def _constant(data):
    return Tensor._from_op(np.asarray(data), (), None)


def _arg(a, axis, keepdims, finder, op):
    a = _t(a)
    x = a.data
    if axis is not None:
        axis = normalize_axis(axis, x.shape, op)  # None: an index into the flattened tensor, as NumPy
    return _constant(finder(x, axis=axis, keepdims=keepdims))


@primitive("argmax", kind="reduction", differentiable=False)
def argmax(a: TensorLike, axis: int | None = None, keepdims: bool = False) -> Tensor:
    """Index of the largest value (the first one on ties) along ``axis``, as int64.

    ``axis=None`` gives the index into the flattened tensor.

    Examples:
        >>> eo.argmax(eo.tensor([[1.0, 3.0], [4.0, 2.0]]), axis=1).tolist()
        [1, 0]
    """
    return _arg(a, axis, keepdims, np.argmax, "argmax")


@primitive("argmin", kind="reduction", differentiable=False)
def argmin(a: TensorLike, axis: int | None = None, keepdims: bool = False) -> Tensor:
    """Index of the smallest value (the first one on ties) along ``axis``, as int64."""
    return _arg(a, axis, keepdims, np.argmin, "argmin")


@primitive("cumsum", FLOAT32, kind="reduction")
def cumsum(a: TensorLike, axis: int | None = None) -> Tensor:
    """Running sum along ``axis`` (``None``: over the flattened tensor, as NumPy).

    Examples:
        >>> eo.cumsum(eo.tensor([1.0, 2.0, 3.0])).tolist()
        [1.0, 3.0, 6.0]
    """
    a = _t(a)
    x = a.data
    if axis is None:
        out = np.cumsum(x.reshape(-1))

        def flat_backward(g):
            return (np.flip(np.cumsum(np.flip(g))).reshape(x.shape),)

        return Tensor._from_op(out, (a,), flat_backward)
    axis = normalize_axis(axis, x.shape, "cumsum")

    def backward(g):
        # Each input feeds every later output: the gradient is a reversed running sum.
        return (np.flip(np.cumsum(np.flip(g, axis), axis=axis), axis),)

    return Tensor._from_op(np.cumsum(x, axis=axis), (a,), backward)


@primitive("prod", FLOAT32, kind="reduction")
def prod(a: TensorLike, axis: Axis = None, keepdims: bool = False) -> Tensor:
    """Product over ``axis``. The gradient of each factor is the product of
    the others, computed from running products (no division), so it is
    exact when factors are zero.

    Examples:
        >>> eo.prod(eo.tensor([[1.0, 2.0], [3.0, 0.0]]), axis=1).tolist()
        [2.0, 0.0]
    """
    a = _t(a)
    x = a.data
    shape, axes = x.shape, normalize_axes(axis, x.shape, "prod")
    out = np.asarray(np.prod(x, axis=axes, keepdims=keepdims))
    if not axes:
        return Tensor._from_op(out, (a,), lambda g: (g,))

    def backward(g):
        if x.size == 0:  # an empty product is 1; no factor to pass a gradient to
            return (np.zeros_like(x),)
        k = len(axes)
        last = tuple(range(x.ndim - k, x.ndim))
        moved = np.moveaxis(x, axes, last)
        flat = moved.reshape(moved.shape[: x.ndim - k] + (-1,))
        one = np.ones(flat.shape[:-1] + (1,), dtype=flat.dtype)
        before = np.concatenate([one, np.cumprod(flat[..., :-1], axis=-1)], axis=-1)
        after = np.flip(np.concatenate([one, np.cumprod(np.flip(flat, -1)[..., :-1], axis=-1)], axis=-1), -1)
        others = np.moveaxis((before * after).reshape(moved.shape), last, axes)
        return (_expand(g, shape, axes, keepdims) * others,)

    return Tensor._from_op(out, (a,), backward)


@primitive("std", FLOAT32, kind="reduction")
def std(a: TensorLike, axis: Axis = None, keepdims: bool = False, ddof: float = 0) -> Tensor:
    """Standard deviation, ``sqrt(var(a, axis, ddof=ddof))`` (``ddof=0``: the
    biased estimate, like NumPy; PyTorch's default is ``ddof=1``).
    Where the deviation is zero the gradient is zero (as in PyTorch); where
    no divisor is left (``ddof=1`` over one element) the result
    and its gradient are NaN, as in PyTorch.

    Examples:
        >>> round(eo.std(eo.tensor([1.0, 3.0])).item(), 6)
        1.0
    """
    a = _t(a)
    x = a.data
    shape, axes = x.shape, normalize_axes(axis, x.shape, "std")
    count = _count(shape, axes)
    den = np.asarray(count - ddof if count > ddof else 0, x.dtype)  # PyTorch's divisor (see var)
    with np.errstate(invalid="ignore", divide="ignore"):
        centered = x - x.mean(axis=axes, keepdims=True)
        out = np.sqrt((centered * centered).sum(axis=axes, keepdims=True) / den)

    def backward(g):
        with np.errstate(invalid="ignore", divide="ignore"):
            # 0 where the deviation is 0 with a divisor left (the documented
            # convention); NaN where the std itself is NaN (no divisor left).
            scale = np.where((out == 0) & (den > 0), 0.0, 1.0 / (den * out)).astype(out.dtype, copy=False)
            return (_expand(g, shape, axes, keepdims) * centered * scale,)

    result = out if keepdims else np.squeeze(out, axis=axes)
    return Tensor._from_op(np.asarray(result), (a,), backward)


@primitive("logsumexp", FLOAT32, kind="reduction")
def logsumexp(a: TensorLike, axis: Axis = None, keepdims: bool = False) -> Tensor:
    """``log(sum(exp(a)))`` over ``axis`` without overflow (the maximum is
    subtracted first). A slice of ``-inf`` gives ``-inf`` and a zero gradient.

    Examples:
        >>> round(eo.logsumexp(eo.tensor([1000.0, 1000.0])).item(), 3)
        1000.693
    """
    a = _t(a)
    x = a.data
    shape, axes = x.shape, normalize_axes(axis, x.shape, "logsumexp")
    peak = np.max(x, axis=axes, keepdims=True) if x.size else np.zeros((1,) * x.ndim, x.dtype)
    peak = np.where(np.isfinite(peak), peak, 0).astype(x.dtype, copy=False)
    e = np.exp(x - peak)
    total = e.sum(axis=axes, keepdims=True)
    with np.errstate(divide="ignore"):
        out = np.log(total) + peak
    with np.errstate(invalid="ignore"):
        weights = e / np.where(total == 0, 1, total)  # a NaN/inf total reaches the whole slice (see softmax)

    def backward(g):
        return (_expand(g, shape, axes, keepdims) * weights,)

    result = out if keepdims else np.squeeze(out, axis=axes)
    return Tensor._from_op(np.asarray(result, dtype=x.dtype), (a,), backward)


@primitive("norm", FLOAT32, kind="reduction")
def norm(a: TensorLike, ord: float | Literal["fro"] = 2, axis: Axis = None, keepdims: bool = False) -> Tensor:
    """Vector ``ord``-norm over ``axis`` (all axes when ``None``), as
    ``torch.linalg.vector_norm``: ``ord`` is a positive number, ``inf``, or
    ``'fro'`` (the 2-norm over the given axes). At a zero vector the gradient
    is zero.

    Examples:
        >>> eo.norm(eo.tensor([3.0, 4.0])).item()
        5.0
    """
    a = _t(a)
    x = a.data
    if ord == "fro":
        ord = 2
    if not (ord == np.inf or (isinstance(ord, (int, float)) and ord > 0)):
        raise ValueError(f"norm: ord must be a positive number, inf or 'fro', got {ord!r}")
    shape, axes = x.shape, normalize_axes(axis, x.shape, "norm")
    mag = np.abs(x)
    if ord == np.inf:
        out = mag.max(axis=axes, keepdims=True) if x.size else np.zeros((1,) * x.ndim, x.dtype)
    elif ord == 1:
        out = mag.sum(axis=axes, keepdims=True)
    elif ord == 2:
        out = np.sqrt((x * x).sum(axis=axes, keepdims=True))
    else:
        out = np.power(np.power(mag, ord).sum(axis=axes, keepdims=True), 1.0 / ord)

    def backward(g):
        g = _expand(g, shape, axes, keepdims)
        if ord == np.inf:
            hit = mag == out  # ties share the gradient, as max does
            return (g * np.sign(x) * hit / np.maximum(hit.sum(axis=axes, keepdims=True), 1),)
        if ord == 1:
            return (g * np.sign(x),)
        # d/dx (sum |x|^p)^(1/p) = sign(x) |x|^(p-1) / norm^(p-1)
        denom = out if ord == 2 else np.power(out, ord - 1)
        # 0 at a zero vector (documented); a NaN norm gives NaN, never 0.
        scale = np.divide(1.0, denom, out=np.zeros_like(denom), where=denom != 0)
        grow = x if ord == 2 else np.sign(x) * np.power(mag, ord - 1)
        return (g * grow * scale,)

    result = out if keepdims else np.squeeze(out, axis=axes)
    return Tensor._from_op(np.asarray(result, dtype=x.dtype), (a,), backward)


for _name in __all__:
    setattr(Tensor, _name, globals()[_name])
