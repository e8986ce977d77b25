"""Axis arguments, checked once for every op that takes one.

NumPy's rule: an axis ``a`` of a rank-``n`` tensor is valid when
``-n <= a < n`` (negative axes count from the end); a tuple of axes may not
repeat one. Taking the axis modulo the rank instead (what 0.1 did) turns
``x.sum(axis=2)`` on a matrix into a silent sum over axis 0.

Errors are :class:`~everyo.errors.EveryOShapeError` naming the op, the axis,
the rank and the shape.
"""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING

from numpy.exceptions import AxisError
from numpy.lib.array_utils import normalize_axis_tuple

from everyo.errors import EveryOShapeError, EveryOSpellingError

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any, SupportsIndex

    from everyo._typing import Axis, Shape

__all__ = ["normalize_axis", "normalize_axes", "check_permutation", "torch_spelling"]


def _out_of_range(op, axis, shape, ndim):
    if ndim != len(shape):  # an op that adds axes (stack, expand_dims)
        return EveryOShapeError(
            f"{op}: axis {axis} is out of range for the rank-{ndim} result "
            f"(input shape {tuple(shape)}); valid axes are {-ndim}..{ndim - 1}"
        )
    return EveryOShapeError(
        f"{op}: axis {axis} is out of range for a tensor of rank {ndim} (shape {tuple(shape)}); "
        f"valid axes are {-ndim}..{ndim - 1}"
        if ndim
        else f"{op}: axis {axis} given for a 0-d tensor (shape ()), which has no axes; pass axis=None"
    )


def normalize_axis(axis: SupportsIndex, shape: Shape, op: str, *, extra: int = 0) -> int:
    """``axis`` as a non-negative int, checked against ``len(shape) + extra``
    (``extra=1`` for ops that insert an axis, like ``stack``).

    Examples:
        >>> from everyo.axes import normalize_axis
        >>> normalize_axis(-1, (2, 3), "softmax")
        1
    """
    ndim = len(shape) + extra
    if type(axis) is int and -ndim <= axis < ndim:  # the common case, without NumPy's overhead
        return axis + ndim if axis < 0 else axis
    try:
        (result,) = normalize_axis_tuple(operator.index(axis), ndim)
    except AxisError:
        raise _out_of_range(op, axis, shape, ndim) from None
    except (TypeError, ValueError):
        raise TypeError(f"{op}: axis must be an integer, got {axis!r}") from None
    return result


def normalize_axes(axis: Axis, shape: Shape, op: str) -> tuple[int, ...]:
    """``axis`` (None, an int or a sequence of ints) as a sorted tuple of
    non-negative axes; None means every axis.

    Examples:
        >>> from everyo.axes import normalize_axes
        >>> normalize_axes((-1, 0), (2, 3, 4), "sum")
        (0, 2)
    """
    ndim = len(shape)
    if axis is None:
        return tuple(range(ndim))
    if type(axis) is int and -ndim <= axis < ndim:
        return (axis + ndim if axis < 0 else axis,)
    try:
        axes = normalize_axis_tuple(axis, ndim)
    except AxisError:
        raise _out_of_range(op, axis, shape, ndim) from None
    except ValueError:
        raise EveryOShapeError(f"{op}: axis {axis} repeats an axis (shape {tuple(shape)})") from None
    except TypeError:
        raise TypeError(f"{op}: axis must be None, an integer or a tuple of integers, got {axis!r}") from None
    return tuple(sorted(axes))


def check_permutation(axes: Sequence[SupportsIndex], shape: Shape, op: str) -> tuple[int, ...]:
    """``axes`` as a tuple that permutes every axis of ``shape`` exactly once."""
    ndim = len(shape)
    if len(axes) != ndim:
        raise EveryOShapeError(
            f"{op}: axes {tuple(axes)} must list each of the {ndim} axes of shape {tuple(shape)} once"
        )
    normalized = tuple(normalize_axis(a, shape, op) for a in axes)
    if len(set(normalized)) != ndim:
        raise EveryOShapeError(f"{op}: axes {tuple(axes)} repeat an axis (shape {tuple(shape)})")
    return normalized


# PyTorch's keyword spellings of NumPy's, accepted by every op taking ``axis``
# (the op table applies them in one place: dispatch.primitive). Where PyTorch's
# op means something else with the same call, the spelling is refused with the
# EveryO way instead (a silently different number is worse than an error).
_TORCH_KEYWORDS = {"dim": "axis", "keepdim": "keepdims"}
_DIM_REFUSED = {
    "max": "torch's max(dim=) returns (values, indices); EveryO's max(axis=d) returns the values only: "
    "use x.max(axis=d) and x.argmax(axis=d)",
    "min": "torch's min(dim=) returns (values, indices); EveryO's min(axis=d) returns the values only: "
    "use x.min(axis=d) and x.argmin(axis=d)",
    "var": "torch's var(dim=) is unbiased (divides by n - 1) by default, EveryO's var divides by n (ddof=0): "
    "spell it var(axis=d, ddof=1) for torch's number, or var(axis=d, ddof=0)",
    "std": "torch's std(dim=) is unbiased (divides by n - 1) by default, EveryO's std divides by n (ddof=0): "
    "spell it std(axis=d, ddof=1) for torch's number, or std(axis=d, ddof=0)",
}


def torch_spelling(op: str, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """``kwargs`` with PyTorch's ``dim=`` / ``keepdim=`` renamed to NumPy's
    ``axis=`` / ``keepdims=``, for an op that takes ``axis``.

    Raises ``TypeError`` when both spellings are given, and
    :class:`~everyo.errors.EveryOSpellingError` for ``dim=`` on
    ``max``/``min`` (torch returns values and indices there) and on
    ``var``/``std`` without ``ddof`` (torch's default is unbiased).

    Examples:
        >>> from everyo.axes import torch_spelling
        >>> torch_spelling("sum", {"dim": 1, "keepdim": True})
        {'axis': 1, 'keepdims': True}
    """
    out = dict(kwargs)
    for torch_name, numpy_name in _TORCH_KEYWORDS.items():
        if torch_name not in out:
            continue
        if numpy_name in out:
            raise TypeError(f"{op}: got both {torch_name}= and {numpy_name}= (the same argument); pass one")
        if torch_name == "dim" and op in _DIM_REFUSED and not (op in ("var", "std") and "ddof" in out):
            raise EveryOSpellingError(f"{op}(dim=...): {_DIM_REFUSED[op]}")
        out[numpy_name] = out.pop(torch_name)
    return out
