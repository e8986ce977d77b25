"""Indexing ops: ``take_along_axis`` (PyTorch: ``gather``), ``masked_fill``
and ``one_hot``. Indices are checked: out of range is an
:class:`~everyo.errors.EveryOIndexError` naming the op, the axis and its size."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from everyo.axes import normalize_axis
from everyo.dispatch import primitive
from everyo.errors import EveryODTypeError, EveryOIndexError, EveryOShapeError
from everyo.functional import _t
from everyo.tensor import Tensor

if TYPE_CHECKING:
    from everyo._typing import DType, TensorLike

__all__ = ["take_along_axis", "gather", "masked_fill", "one_hot"]


def _integer_array(indices, op):
    idx = indices.data if isinstance(indices, Tensor) else np.asarray(indices)
    if not np.issubdtype(idx.dtype, np.integer):
        raise EveryODTypeError(f"{op}: indices must be integers, got dtype {idx.dtype} (convert with .astype('int64'))")
    return idx


@primitive("take_along_axis", kind="indexing", inputs=("a", "indices"))
def take_along_axis(a: TensorLike, indices: TensorLike, axis: int) -> Tensor:
    """Pick values along ``axis`` at integer ``indices`` (NumPy's
    ``take_along_axis``; PyTorch's ``gather``). ``indices`` has ``a``'s rank;
    its other axes broadcast against ``a``'s. Negative indices count from the
    end, as in NumPy. Repeated indices accumulate their gradients.

    Shape:
        ``a`` (..., n, ...), ``indices`` (..., k, ...) -> (..., k, ...).

    Examples:
        >>> x = eo.tensor([[10.0, 20.0, 30.0]])
        >>> eo.take_along_axis(x, np.array([[2, 0]]), axis=1).tolist()
        [[30.0, 10.0]]
    """
    a = _t(a)
    x = a.data
    idx = _integer_array(indices, "take_along_axis")
    axis = normalize_axis(axis, x.shape, "take_along_axis")
    if idx.ndim != x.ndim:
        raise EveryOShapeError(
            f"take_along_axis: indices of shape {idx.shape} need the rank of the input, shape {x.shape}"
        )
    n = x.shape[axis]
    if idx.size and (idx.min() < -n or idx.max() >= n):
        bad = idx[(idx < -n) | (idx >= n)].flat[0]
        raise EveryOIndexError(
            f"take_along_axis: index {int(bad)} is out of range for axis {axis} of size {n} (input shape {x.shape})"
        )
    out = np.take_along_axis(x, idx, axis=axis)

    def backward(g):
        full = np.zeros(x.shape, dtype=g.dtype)
        grids = list(np.ogrid[tuple(slice(m) for m in g.shape)])
        grids[axis] = idx
        grids = np.broadcast_arrays(*grids)
        # Broadcast input axes of length 1 have index 0 along them.
        grids = [gr if x.shape[i] != 1 or i == axis else np.zeros_like(gr) for i, gr in enumerate(grids)]
        np.add.at(full, tuple(grids), g)
        return (full,)

    return Tensor._from_op(out, (a,), backward)


def gather(a: TensorLike, axis: int, index: TensorLike) -> Tensor:
    """PyTorch's name and argument order for :func:`take_along_axis`
    (``torch.gather(input, dim, index)``)."""
    return take_along_axis(a, index, axis)


@primitive("masked_fill", kind="elementwise", inputs=("a", "mask"))
def masked_fill(a: TensorLike, mask: TensorLike, value: TensorLike) -> Tensor:
    """``a`` with ``value`` where the boolean ``mask`` (broadcastable to
    ``a``) is True. No gradient flows to the filled places.

    Examples:
        >>> x = eo.tensor([1.0, 2.0, 3.0])
        >>> eo.masked_fill(x, x > 1.5, 0.0).tolist()
        [1.0, 0.0, 0.0]
    """
    a = _t(a)
    m = mask.data if isinstance(mask, Tensor) else np.asarray(mask)
    if m.dtype != np.bool_:
        raise EveryODTypeError(f"masked_fill: mask must be boolean, got dtype {m.dtype}")
    try:
        np.broadcast_shapes(m.shape, a.data.shape)
    except ValueError:
        raise EveryOShapeError(
            f"masked_fill: mask of shape {m.shape} does not broadcast to shape {a.data.shape}"
        ) from None
    if isinstance(value, Tensor):
        value = value.data
    out = np.where(m, np.asarray(value, dtype=a.data.dtype), a.data)
    if out.shape != a.data.shape:
        raise EveryOShapeError(f"masked_fill: mask of shape {m.shape} would change the shape {a.data.shape}")
    return Tensor._from_op(out, (a,), lambda g: (np.where(m, 0, g).astype(g.dtype, copy=False),))


@primitive("one_hot", kind="indexing", inputs=("indices",), differentiable=False)
def one_hot(indices: TensorLike, num_classes: int | None = None, dtype: DType = "float32") -> Tensor:
    """Integer class ids (any shape) -> one-hot vectors, shape ``indices.shape + (num_classes,)``.

    ``num_classes=None`` uses ``max(indices) + 1``. ``dtype`` defaults to
    float32 (Keras); ``dtype='int64'`` gives PyTorch's.

    Examples:
        >>> eo.one_hot(np.array([0, 2]), 3).tolist()
        [[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]]
    """
    idx = _integer_array(indices, "one_hot")
    if num_classes is None:
        num_classes = int(idx.max()) + 1 if idx.size else 0
    if idx.size and (idx.min() < 0 or idx.max() >= num_classes):
        raise EveryOIndexError(
            f"one_hot: class ids must be in [0, {num_classes}), got values from {int(idx.min())} to {int(idx.max())}"
        )
    out = (idx[..., None] == np.arange(num_classes)).astype(dtype)
    return Tensor._from_op(out, (), None)


# setattr: the Tensor class declares these methods for type checkers.
for _name in ("take_along_axis", "gather", "masked_fill"):
    setattr(Tensor, _name, globals()[_name])
