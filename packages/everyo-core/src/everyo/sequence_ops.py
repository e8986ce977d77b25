"""Primitive ops the sequence layers need and core's elementwise ops cannot give
cheaply: several outputs from one op, a split and an embedding gather.
(Masked softmax is core's ``softmax(x, blocked=...)``.)

Each is one autograd node with a hand-written backward, gradient-checked in
``tests/core/test_sequence_ops.py``.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import numpy as np

from everyo import _buffers, _passes, autograd, kernel_table
from everyo.axes import normalize_axis
from everyo.dispatch import primitive
from everyo.errors import EveryODTypeError, EveryOIndexError, EveryOShapeError
from everyo.tensor import Tensor

# The embedding backward's kernel: its dtypes, and the fewest gradient values it is used for.
_COMPILED, _KERNEL_MIN_SIZE = kernel_table.FLOAT_DTYPES, kernel_table.MIN_SIZE

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from everyo._typing import Array, TensorLike

__all__ = ["multi_output", "split", "embedding", "EveryOIndexError"]


def multi_output(
    datas: Sequence[Array],
    parents: Sequence[Tensor],
    backward: Callable[[list[Array | None]], Sequence[Array | None]],
) -> list[Tensor]:
    """Wrap the outputs of one op with several outputs as Tensors.

    ``backward(grads)`` gets one gradient per output (``None`` for an output
    that received none) and returns one gradient per parent.

    Autograd nodes have one output, so the first output is the op's node and
    every further output is a child of it whose backward only *relays* its
    gradient into a shared list. Children come after their parent in any
    topological order, so every relay has run before the op's backward reads
    the list. A relay hands its parent :data:`everyo.autograd.ZERO`, which makes
    sure the op's backward runs even when only a secondary output was used,
    and adds nothing to the first output's own gradient.
    """
    received = [None] * len(datas)

    def op_backward(g):
        received[0] = g
        grads = list(received)
        received[:] = [None] * len(received)  # drop references once consumed
        return backward(grads)

    first = Tensor._from_op(datas[0], tuple(parents), op_backward)
    outputs = [first]
    for i in range(1, len(datas)):
        outputs.append(Tensor._from_op(datas[i], (first,), _relay(received, i)))
    return outputs


def _relay(received, i):
    def backward(g):
        received[i] = g
        return (autograd.ZERO,)

    return backward


def _resolve_split(inputs, attrs):
    # Explicit piece sizes and a non-negative axis, as computed in the forward.
    shape = inputs[0].data.shape
    axis = normalize_axis(attrs["axis"], shape, "split")
    sections = attrs["sections"]
    sizes = [shape[axis] // sections] * sections if isinstance(sections, int) else [int(s) for s in sections]
    attrs.update(axis=axis, sizes=tuple(sizes))
    return attrs


def _concatenate(*pieces, axis, out):
    np.concatenate(pieces, axis=axis, out=out)


@primitive("split", kind="shape", resolve=_resolve_split)
def split(x: Tensor, sections: int | Sequence[int], axis: int = -1) -> list[Tensor]:
    """Split ``x`` along ``axis`` into pieces of the given sizes (or ``sections``
    equal pieces). The backward is one concatenation, not one zero-filled
    full-size array per piece as slicing would cost."""
    data = x.data
    axis = normalize_axis(axis, data.shape, "split")
    n = data.shape[axis]
    if isinstance(sections, int):
        if n % sections:
            raise EveryOShapeError(
                f"split: axis {axis} of shape {data.shape} does not divide into {sections} equal parts"
            )
        sizes = [n // sections] * sections
    else:
        sizes = [int(s) for s in sections]
        if sum(sizes) != n:
            raise EveryOShapeError(f"split: sizes {sizes} do not add up to axis {axis} of shape {data.shape}")
    bounds = np.cumsum(sizes)[:-1]
    pieces = np.split(data, bounds, axis=axis)

    def backward(grads):
        full = [np.zeros(p.shape, dtype=data.dtype) if g is None else g for g, p in zip(grads, pieces)]
        if data.dtype.kind == "f" and all(g.dtype == data.dtype for g in full):
            # Into a recycled buffer (everyo._buffers): the same values, no fresh pages each step;
            # along a later axis, in two halves of the first where that applies (everyo._passes).
            out = _buffers.empty(data.shape, data.dtype)
            if axis == 0:
                return (np.concatenate(full, axis=0, out=out),)
            return (_passes.run(functools.partial(_concatenate, axis=axis), full, out),)
        return (np.concatenate(full, axis=axis),)

    return multi_output(pieces, (x,), backward)


@primitive("embedding", kind="indexing", inputs=("indices", "weight"))
def embedding(indices: TensorLike, weight: Tensor, padding_idx: int | None = None) -> Tensor:
    """Rows of ``weight`` (num_embeddings, dim) picked by integer ``indices`` of any shape.

    The output has shape ``indices.shape + (dim,)``. The backward scatters the
    output gradient into the rows used; repeated indices accumulate. The row
    ``padding_idx`` gets no gradient. Indices outside ``[0, num_embeddings)``
    raise :class:`EveryOIndexError` (negative indices never wrap around).
    """
    idx = indices.data if isinstance(indices, Tensor) else np.asarray(indices)
    if not (np.issubdtype(idx.dtype, np.integer) or idx.dtype == np.bool_):
        raise EveryODTypeError(
            f"embedding indices must be integers, got dtype {idx.dtype} (convert token ids with .astype('int64'))"
        )
    num = weight.data.shape[0]
    if idx.size and (idx.min() < 0 or idx.max() >= num):
        bad = idx[(idx < 0) | (idx >= num)]
        raise EveryOIndexError(
            f"embedding index {int(bad.flat[0])} is out of range for an embedding table with "
            f"{num} rows (valid ids are 0..{num - 1}); {bad.size} of {idx.size} indices are out of range"
        )
    w = weight.data
    if type(w) is np.ndarray and w.dtype.kind == "f" and w.ndim == 2 and idx.dtype.kind in "iu":
        # The same rows into a recycled buffer (everyo._buffers). The indices are checked above,
        # so mode="clip" changes none; mode="raise" would copy through a temporary buffer.
        out = np.take(w, idx, axis=0, out=_buffers.empty(idx.shape + w.shape[1:], w.dtype), mode="clip")
    else:
        out = np.take(w, idx, axis=0)

    def backward(g):
        grad = np.zeros_like(w)
        rows = g.reshape(-1, w.shape[1])
        # everyo-kernels' embedding_backward: the same additions in the same order (bit-identical).
        step = None
        if g.size >= _KERNEL_MIN_SIZE and g.dtype == w.dtype and w.dtype in _COMPILED and idx.dtype.kind in "iu":
            step = kernel_table.get("embedding_backward")
        if step is not None and grad.flags.c_contiguous:
            step(grad, idx.reshape(-1), np.ascontiguousarray(rows))
        else:
            np.add.at(grad, idx.reshape(-1), rows)
        if padding_idx is not None:
            grad[padding_idx] = 0
        return (grad,)

    return Tensor._from_op(out, (weight,), backward)
