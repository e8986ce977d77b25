"""PyTorch's everyday tensor functions, built from EveryO's primitives.

Each function here is a composite: it calls primitives of the op table
(:mod:`everyo.dispatch`), so autograd, autocast and ONNX export follow from
theirs, with nothing new to differentiate or export. Arguments follow PyTorch
(``dim``, ``split_size_or_sections``, ``*dims``); see "Coming from PyTorch"
in the docs for where PyTorch and EveryO spell things differently.

Examples:
    >>> x = eo.arange(6.0).reshape(2, 3)
    >>> [p.shape for p in x.split(2, dim=1)]
    [(2, 2), (2, 1)]
    >>> x.permute(1, 0).shape
    (3, 2)
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from everyo import comparisons
from everyo.axes import check_permutation, normalize_axis
from everyo.errors import EveryOShapeError
from everyo.functional import _t, mul, reshape, transpose
from everyo.normalization_ops import normalize
from everyo.random import generator_for
from everyo.sequence_ops import split as _split_sizes
from everyo.tensor import Tensor

if TYPE_CHECKING:
    from collections.abc import Sequence

    from everyo._typing import TensorLike

__all__ = [
    "split",
    "chunk",
    "permute",
    "swapaxes",
    "view",
    "view_as",
    "contiguous",
    "eq",
    "ne",
    "lt",
    "le",
    "gt",
    "ge",
    "multinomial",
    "layer_norm",
]

# PyTorch's short names of the comparisons (the same functions, elementwise).
eq = comparisons.equal
ne = comparisons.not_equal
lt = comparisons.less
le = comparisons.less_equal
gt = comparisons.greater
ge = comparisons.greater_equal


def split(x: TensorLike, split_size_or_sections: int | Sequence[int], dim: int = 0) -> tuple[Tensor, ...]:
    """PyTorch's ``split``: pieces of ``split_size_or_sections`` elements along
    ``dim`` (an int: every piece that size, the last one smaller if the length
    does not divide; a list: those sizes, which must add up to the length).

    Unlike NumPy's ``np.split(x, 3)`` (three pieces), an int is a piece *size*;
    for a number of pieces use :func:`chunk`.

    Examples:
        >>> [p.shape for p in eo.split(eo.zeros(5, 2), 2)]
        [(2, 2), (2, 2), (1, 2)]
    """
    x = _t(x)
    shape = x.data.shape
    axis = normalize_axis(dim, shape, "split")
    n = shape[axis]
    if isinstance(split_size_or_sections, (int, np.integer)):
        size = int(split_size_or_sections)
        if size <= 0:
            raise EveryOShapeError(f"split: split_size must be a positive int, got {size}")
        sizes = [size] * (n // size) + ([n % size] if n % size else [])
    else:
        sizes = [int(s) for s in split_size_or_sections]
        if any(s < 0 for s in sizes) or sum(sizes) != n:
            raise EveryOShapeError(
                f"split: sizes {sizes} must be non-negative and add up to {n}, the length of axis {axis} "
                f"of shape {shape}"
            )
    if len(sizes) <= 1:
        return (x,)
    return tuple(_split_sizes(x, sizes, axis=axis))


def chunk(x: TensorLike, chunks: int, dim: int = 0) -> tuple[Tensor, ...]:
    """PyTorch's ``chunk``: split along ``dim`` into at most ``chunks`` pieces
    of ``ceil(length / chunks)`` elements (the last smaller; fewer pieces when
    the length is short, as PyTorch).

    Examples:
        >>> [p.shape[0] for p in eo.chunk(eo.zeros(5), 3)]
        [2, 2, 1]
    """
    if isinstance(chunks, bool) or not isinstance(chunks, (int, np.integer)) or chunks <= 0:
        raise EveryOShapeError(f"chunk: chunks must be a positive int, got {chunks!r}")
    x = _t(x)
    n = x.data.shape[normalize_axis(dim, x.data.shape, "chunk")]
    return split(x, max(1, math.ceil(n / int(chunks))), dim)


def permute(x: TensorLike, *dims: int | Sequence[int]) -> Tensor:
    """PyTorch's ``permute``: the axes in the order ``dims`` (every axis once),
    which is NumPy's ``transpose(axes)``.

    Examples:
        >>> eo.zeros(2, 3, 4).permute(2, 0, 1).shape
        (4, 2, 3)
    """
    order = tuple(dims[0]) if len(dims) == 1 and isinstance(dims[0], (tuple, list)) else dims
    x = _t(x)
    return transpose(x, check_permutation(order, x.data.shape, "permute"))  # type: ignore[arg-type]


def swapaxes(x: TensorLike, axis0: int, axis1: int) -> Tensor:
    """``x`` with two axes exchanged (NumPy's ``swapaxes``, PyTorch's ``transpose(d0, d1)``).

    Examples:
        >>> eo.zeros(2, 3).swapaxes(0, 1).shape
        (3, 2)
    """
    x = _t(x)
    shape = x.data.shape
    a, b = normalize_axis(axis0, shape, "swapaxes"), normalize_axis(axis1, shape, "swapaxes")
    order = list(range(len(shape)))
    order[a], order[b] = order[b], order[a]
    return transpose(x, tuple(order))


def view(x: TensorLike, *shape: int | Sequence[int]) -> Tensor:
    """PyTorch's ``view``: ``x`` in a new shape (one entry may be -1).

    EveryO's values are NumPy arrays, and ``view`` is ``reshape``: the result
    shares memory with ``x`` where NumPy can reshape without copying, and is a
    copy otherwise (PyTorch refuses a ``view`` of non-contiguous memory
    instead). Either way it is differentiable, and in-place writes to one are
    not a way to change the other: change values out of place.

    Examples:
        >>> eo.zeros(2, 6).view(3, -1).shape
        (3, 4)
    """
    return reshape(_t(x), *shape)


def view_as(x: TensorLike, other: TensorLike) -> Tensor:
    """``x`` in ``other``'s shape (:func:`view` to ``other.shape``)."""
    return reshape(_t(x), np.shape(other.data if isinstance(other, Tensor) else other))


def contiguous(x: TensorLike) -> Tensor:
    """``x`` itself: PyTorch's ``contiguous()`` before a ``view``, which EveryO
    never needs (:func:`view` copies when the memory layout requires it).

    Examples:
        >>> x = eo.zeros(2, 3)
        >>> x.contiguous() is x
        True
    """
    return _t(x)


def multinomial(
    input: TensorLike,
    num_samples: int,
    replacement: bool = False,
    *,
    seed: int | np.random.Generator | None = None,
) -> Tensor:
    """Draw category indices with probabilities proportional to the rows of
    ``input`` (1-d: one distribution; 2-d: one per row), as PyTorch's
    ``multinomial``. Weights need not sum to 1 but must be non-negative and
    finite, with a positive sum. Without replacement each row gives distinct
    indices (drawn one after another from the remaining weight), so
    ``num_samples`` may not exceed the row's non-zero entries.

    ``seed=`` (an int or a ``numpy.random.Generator``) makes the draw
    reproducible; without it the draw comes from the global generator, which
    ``eo.manual_seed`` seeds. The result is an int64 Tensor of shape
    ``(num_samples,)`` or ``(rows, num_samples)``, outside the graph.

    Examples:
        >>> eo.multinomial(eo.tensor([0.0, 1.0, 0.0]), 2, replacement=True, seed=0).tolist()
        [1, 1]
    """
    w = np.asarray(input.data if isinstance(input, Tensor) else input, dtype=np.float64)
    if w.ndim not in (1, 2) or w.shape[-1] == 0:
        raise EveryOShapeError(f"multinomial: input must be 1-d or 2-d with at least one category, got shape {w.shape}")
    if isinstance(num_samples, bool) or not isinstance(num_samples, (int, np.integer)) or num_samples <= 0:
        raise ValueError(f"multinomial: num_samples must be a positive int, got {num_samples!r}")
    rows = w.reshape(-1, w.shape[-1])
    if not np.isfinite(rows).all() or (rows < 0).any() or (rows.sum(axis=1) <= 0).any():
        raise ValueError("multinomial: every row of weights must be finite and non-negative, with a positive sum")
    if not replacement and num_samples > int((rows > 0).sum(axis=1).min()):
        raise ValueError(
            f"multinomial: cannot draw {num_samples} distinct samples without replacement from a row with "
            f"{int((rows > 0).sum(axis=1).min())} non-zero weights; pass replacement=True or fewer samples"
        )
    rng = generator_for(seed)
    k = rows.shape[1]
    out = np.stack([rng.choice(k, size=int(num_samples), replace=replacement, p=r / r.sum()) for r in rows])
    return Tensor(out.astype(np.int64).reshape(w.shape[:-1] + (int(num_samples),)))


def layer_norm(
    input: TensorLike,
    normalized_shape: int | Sequence[int],
    weight: TensorLike | None = None,
    bias: TensorLike | None = None,
    eps: float = 1e-5,
) -> Tensor:
    """PyTorch's functional ``layer_norm``: normalise over the trailing
    ``normalized_shape`` axes, then scale by ``weight`` and shift by ``bias``
    (each optional, of ``normalized_shape``). The same op as :class:`~everyo.nn.LayerNorm`.

    Examples:
        >>> y = eo.layer_norm(eo.tensor([[1.0, 2.0, 3.0]]), 3)
        >>> np.round(y.data, 3)
        array([[-1.225,  0.   ,  1.225]], dtype=float32)
    """
    x = _t(input)
    trailing = (int(normalized_shape),) if isinstance(normalized_shape, (int, np.integer)) else tuple(normalized_shape)
    k = len(trailing)
    if x.data.ndim < k or x.data.shape[x.data.ndim - k :] != trailing:
        raise EveryOShapeError(
            f"layer_norm: normalized_shape {trailing} must be the input's trailing shape, got input shape "
            f"{x.data.shape}"
        )
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None and np.shape(p.data if isinstance(p, Tensor) else p) != trailing:
            got = np.shape(p.data if isinstance(p, Tensor) else p)
            raise EveryOShapeError(f"layer_norm: {name} must have shape {trailing}, got {got}")
    if not eps > 0:
        raise ValueError(f"layer_norm: eps must be > 0, got {eps!r}")
    axes = tuple(range(x.data.ndim - k, x.data.ndim))
    if weight is not None and bias is not None:
        return normalize(x, _t(weight), _t(bias), axes, eps)
    out = normalize(x, axis=axes, eps=eps)
    if weight is not None:
        out = mul(out, weight)
    return out if bias is None else out + bias


for _name in (
    "split",
    "chunk",
    "permute",
    "swapaxes",
    "view",
    "view_as",
    "contiguous",
    "eq",
    "ne",
    "lt",
    "le",
    "gt",
    "ge",
):
    setattr(Tensor, _name, globals()[_name])
