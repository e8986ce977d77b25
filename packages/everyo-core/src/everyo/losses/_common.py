"""What every loss shares: the float32 floor, the reductions, argument checks."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from everyo.errors import EveryOShapeError
from everyo.half import is_low_precision
from everyo.tensor import Tensor

if TYPE_CHECKING:
    from typing import Any

    from everyo._typing import Array, TensorLike

REDUCTIONS = ("none", "mean", "sum")


def float32_at_least(*tensors: Tensor) -> tuple[Tensor, ...]:
    """Losses always run in float32 or wider, with or without autocast.

    The spec's loop computes the loss *after* the autocast block, on float16
    predictions; a float16 log-sum-exp or mean over a batch is exactly where 16
    bits run out of range. The cast is a graph node, so the gradient flowing
    back into float16 predictions is still float16. (The op table's FLOAT32
    category has already routed them through the precision policy.)
    """
    return tuple(t.astype("float32") if is_low_precision(t.data.dtype) else t for t in tensors)


def check_reduction(name: str, reduction: str, allowed: tuple[str, ...] = REDUCTIONS) -> None:
    if reduction not in allowed:
        raise ValueError(f"{name}: reduction must be one of {', '.join(map(repr, allowed))}, got {reduction!r}")


def reduce(per: Array, reduction: str, denominator: Array | float | None = None) -> tuple[Array, Array | float]:
    """``(loss, scale)``: the reduced loss and d(loss)/d(per) up to the incoming gradient.

    ``"mean"`` divides by ``denominator`` (default: the number of elements;
    a weighted loss passes the sum of the weights). Over nothing (an empty
    batch, or every target ignored) the mean is 0/0 = NaN, as in PyTorch,
    returned without a warning (issue 13.5); ``reduction="sum"`` gives 0.
    """
    if reduction == "none":
        return per, 1.0
    if reduction == "sum":
        return np.asarray(per.sum(), per.dtype), 1.0
    den = np.asarray(per.size if denominator is None else denominator, per.dtype)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.asarray(per.sum() / den, per.dtype), np.asarray(1.0 / den, per.dtype)


def spread(g: Array, scale: Array | float, shape: tuple[int, ...]) -> Array:
    """The incoming gradient of a reduced loss as one factor per element of ``per``."""
    with np.errstate(invalid="ignore", over="ignore"):
        return np.broadcast_to(g * scale, shape)


def same_shape(pred: Tensor, target: Tensor, name: str) -> None:
    if pred.data.shape != target.data.shape:
        raise EveryOShapeError(
            f"{name}: predictions have shape {pred.data.shape} but targets have shape "
            f"{target.data.shape}; they must match (reshape the targets, e.g. y.reshape(-1, 1))"
        )


def positional_reduction(weight: Any, reduction: str) -> tuple[Any, str]:
    """EveryO 0.2 took ``reduction`` where PyTorch takes ``weight`` (third
    positional argument, first of a loss module): a string there still means
    the reduction, since it cannot be a weight."""
    if isinstance(weight, str):
        return None, weight
    return weight, reduction


def constant(
    value: TensorLike | None, name: str, what: str, like: Array, shape: tuple[int, ...] | None = None
) -> Array | None:
    """A weight argument as a float array of ``like``'s dtype (a constant: no
    gradient flows into it), checked to broadcast to ``like`` (or to equal ``shape``)."""
    if value is None:
        return None
    arr = value.data if isinstance(value, Tensor) else np.asarray(value)
    arr = arr.astype(like.dtype)
    ok = arr.shape == shape if shape is not None else _broadcasts(arr.shape, like.shape)
    if not ok:
        want = f"shape {shape}" if shape is not None else f"a shape that broadcasts to {like.shape}"
        raise EveryOShapeError(f"{name}: {what} has shape {arr.shape}; it needs {want}")
    return arr


def _broadcasts(shape: tuple[int, ...], to: tuple[int, ...]) -> bool:
    try:
        return np.broadcast_shapes(shape, to) == to
    except ValueError:
        return False
