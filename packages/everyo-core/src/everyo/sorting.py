"""Sorting: ``sort`` and ``topk`` return values (differentiable) and int64
indices (no gradient), as PyTorch does. The gradient of the values goes back
to the positions they were taken from."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from everyo.axes import normalize_axis
from everyo.dispatch import primitive
from everyo.functional import _t
from everyo.tensor import Tensor

if TYPE_CHECKING:
    from everyo._typing import TensorLike

__all__ = ["sort", "topk"]


def _gathered(a, order, axis):
    """(values, indices) Tensors for ``a`` taken at ``order`` along ``axis``."""
    x = a.data
    values = np.take_along_axis(x, order, axis=axis)

    def backward(g):
        # The indices along the axis are distinct, so assignment is the scatter.
        full = np.zeros(x.shape, dtype=g.dtype)
        np.put_along_axis(full, order, g, axis=axis)
        return (full,)

    return Tensor._from_op(values, (a,), backward), Tensor._from_op(order.astype(np.int64, copy=False), (), None)


@primitive("sort", kind="indexing")
def sort(a: TensorLike, axis: int = -1, descending: bool = False) -> tuple[Tensor, Tensor]:
    """Sort along ``axis``; returns ``(values, indices)``.

    Ascending sorting is stable (equal values keep their order); NaNs sort
    as the largest values (last, or first when ``descending``).

    Examples:
        >>> values, indices = eo.sort(eo.tensor([3.0, 1.0, 2.0]))
        >>> values.tolist(), indices.tolist()
        ([1.0, 2.0, 3.0], [1, 2, 0])
    """
    a = _t(a)
    axis = normalize_axis(axis, a.data.shape, "sort")
    order = np.argsort(a.data, axis=axis, kind="stable")
    if descending:
        order = np.flip(order, axis=axis)
    return _gathered(a, order, axis)


@primitive("topk", kind="indexing")
def topk(a: TensorLike, k: int, axis: int = -1, largest: bool = True, sorted: bool = True) -> tuple[Tensor, Tensor]:
    """The ``k`` largest (or smallest) values along ``axis``; returns
    ``(values, indices)``, values in descending (ascending) order.

    ``sorted=False`` is accepted for PyTorch compatibility; the result is
    always sorted.

    Examples:
        >>> values, indices = eo.topk(eo.tensor([1.0, 5.0, 3.0]), 2)
        >>> values.tolist(), indices.tolist()
        ([5.0, 3.0], [1, 2])
    """
    a = _t(a)
    axis = normalize_axis(axis, a.data.shape, "topk")
    n = a.data.shape[axis]
    if not isinstance(k, (int, np.integer)) or not 0 <= k <= n:
        raise ValueError(f"topk: k must be an integer in [0, {n}] for axis {axis} of shape {a.data.shape}, got {k!r}")
    order = np.argsort(a.data, axis=axis, kind="stable")
    if largest:
        order = np.flip(order, axis=axis)
    order = np.take(order, np.arange(k), axis=axis)
    return _gathered(a, order, axis)


# setattr: the Tensor class declares these methods for type checkers.
for _name in __all__:
    setattr(Tensor, _name, globals()[_name])
