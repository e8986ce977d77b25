"""More shape ops: ``squeeze``, ``expand_dims`` (PyTorch: ``unsqueeze``),
``moveaxis``, and ``clone`` (a differentiable copy)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from everyo.axes import normalize_axes, normalize_axis
from everyo.dispatch import primitive
from everyo.errors import EveryOShapeError
from everyo.functional import _t
from everyo.tensor import Tensor

if TYPE_CHECKING:
    from collections.abc import Sequence

    from everyo._typing import Axis, TensorLike

__all__ = ["squeeze", "expand_dims", "moveaxis", "clone"]


def _axis_list(axis):
    return [axis] if isinstance(axis, (int, np.integer)) else list(axis)


@primitive("squeeze", kind="shape")
def squeeze(a: TensorLike, axis: Axis = None) -> Tensor:
    """Remove axes of length 1 (all of them when ``axis`` is None).

    Examples:
        >>> eo.squeeze(eo.zeros(2, 1, 3), axis=1).shape
        (2, 3)
    """
    a = _t(a)
    shape = a.data.shape
    if axis is None:
        axes = tuple(i for i, n in enumerate(shape) if n == 1)
    else:
        axes = normalize_axes(axis, shape, "squeeze")
        wide = [i for i in axes if shape[i] != 1]
        if wide:
            raise EveryOShapeError(f"squeeze: axis {wide[0]} of shape {shape} has length {shape[wide[0]]}, not 1")
    return Tensor._from_op(np.squeeze(a.data, axis=axes), (a,), lambda g: (g.reshape(shape),))


@primitive("expand_dims", kind="shape")
def expand_dims(a: TensorLike, axis: int | Sequence[int]) -> Tensor:
    """Insert axes of length 1 at ``axis`` (an int or a tuple, positions in the result).

    Examples:
        >>> eo.expand_dims(eo.zeros(2, 3), 0).shape
        (1, 2, 3)
    """
    a = _t(a)
    shape = a.data.shape
    axes = _axis_list(axis)
    normalized = [normalize_axis(a, shape, "expand_dims", extra=len(axes)) for a in axes]
    if len(set(normalized)) != len(normalized):
        raise EveryOShapeError(f"expand_dims: axis {axis} repeats an axis")
    return Tensor._from_op(np.expand_dims(a.data, normalized), (a,), lambda g: (g.reshape(shape),))


@primitive("moveaxis", kind="shape")
def moveaxis(a: TensorLike, source: int | Sequence[int], destination: int | Sequence[int]) -> Tensor:
    """Move axes to new positions, the others keeping their order (NumPy's ``moveaxis``).

    Examples:
        >>> eo.moveaxis(eo.zeros(2, 3, 4), 0, -1).shape
        (3, 4, 2)
    """
    a = _t(a)
    shape = a.data.shape
    src = [normalize_axis(s, shape, "moveaxis") for s in _axis_list(source)]
    dst = [normalize_axis(d, shape, "moveaxis") for d in _axis_list(destination)]
    if len(src) != len(dst):
        raise EveryOShapeError(f"moveaxis: source {source} and destination {destination} need the same number of axes")
    if len(set(src)) != len(src) or len(set(dst)) != len(dst):
        raise EveryOShapeError(f"moveaxis: source {source} and destination {destination} may not repeat an axis")
    return Tensor._from_op(np.moveaxis(a.data, src, dst), (a,), lambda g: (np.moveaxis(g, dst, src),))


@primitive("clone", kind="shape")
def clone(a: TensorLike) -> Tensor:
    """A copy with its own memory that stays in the graph (gradients flow
    through it), unlike :meth:`Tensor.detach`.

    Examples:
        >>> x = eo.tensor([1.0], requires_grad=True)
        >>> eo.clone(x).requires_grad
        True
    """
    a = _t(a)
    return Tensor._from_op(a.data.copy(), (a,), lambda g: (g,))


for _name in __all__:
    setattr(Tensor, _name, globals()[_name])
for _name, _method in (("unsqueeze", expand_dims),):  # PyTorch's name (a loop: setattr, see functional)
    setattr(Tensor, _name, _method)
