"""The one place layer arguments are checked, at construction.

Every layer validates its hyper-parameters here, so a bad value fails when the
model is built, with a ``ValueError`` naming the layer and the argument, not
later inside NumPy. Shape problems that depend on the input (a window larger
than the padded input) are :class:`~everyo.errors.EveryOShapeError`\\ s raised
by :func:`window_fits` at call time.

Examples:
    >>> from everyo.nn.arguments import positive_ints
    >>> positive_ints("Conv2D", "kernel_size", 3)
    (3, 3)
"""

from __future__ import annotations

import numbers
from typing import TYPE_CHECKING, Any

from everyo.errors import EveryOShapeError
from everyo.padding import resolve_padding2d

if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import TypeVar

    _T = TypeVar("_T")


def _is_int(v):
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def ints(layer: str, name: str, value: Any, n: int = 2, minimum: int = 1) -> tuple[int, ...]:
    """``value`` as an n-tuple of ints, each ``>= minimum``; an int is repeated n times."""
    items = (value,) * n if _is_int(value) else value
    try:
        items = tuple(items)
    except TypeError:
        items = None
    if items is None or len(items) != n or not all(_is_int(v) for v in items):
        what = "an int" if n == 1 else f"an int or a tuple of {n} ints"
        raise ValueError(f"{layer}: {name} must be {what}, got {value!r}")
    if any(v < minimum for v in items):
        bound = "positive" if minimum == 1 else f">= {minimum}"
        raise ValueError(f"{layer}: {name} must be {bound}, got {value!r}")
    return tuple(int(v) for v in items)


def positive_ints(layer: str, name: str, value: Any, n: int = 2) -> tuple[int, ...]:
    return ints(layer, name, value, n, minimum=1)


def positive_int(layer: str, name: str, value: Any) -> int:
    return ints(layer, name, value, 1, minimum=1)[0]


def padding2d(layer: str, padding: Any, allowed: Sequence[str] = ("valid", "same")) -> Any:
    """Check a 2-D padding argument: one of ``allowed`` strings, an int, a pair
    ``(ph, pw)`` or ``((top, bottom), (left, right))``, every number ``>= 0``.
    Returns it unchanged (strings lower-cased); sizes are resolved per input."""
    if isinstance(padding, str):
        if padding.lower() not in allowed:
            raise ValueError(f"{layer}: padding must be one of {list(allowed)} or non-negative ints, got {padding!r}")
        return padding.lower()
    flat: tuple[Any, ...]
    if _is_int(padding):
        flat = (padding,)
    else:
        parts: tuple[Any, ...] | None
        try:
            parts = tuple(padding)
            flat = tuple(v for p in parts for v in (p if not _is_int(p) else (p,)))
        except TypeError:
            parts, flat = None, ()
        if (
            parts is None
            or len(parts) != 2
            or not all(_is_int(v) for v in flat)
            or not (all(_is_int(p) for p in parts) or all(not _is_int(p) and len(tuple(p)) == 2 for p in parts))
        ):
            raise ValueError(
                f"{layer}: cannot understand padding {padding!r}; use {list(allowed)}, an int, "
                f"(ph, pw) or ((top, bottom), (left, right))"
            )
    if any(v < 0 for v in flat):
        raise ValueError(f"{layer}: padding must be non-negative, got {padding!r}")
    return padding


def probability(layer: str, name: str, p: Any, *, include_one: bool = False) -> float:
    """A probability in [0, 1) (or [0, 1] with ``include_one``)."""
    ok = (
        isinstance(p, numbers.Real)
        and not isinstance(p, bool)
        and (0 <= float(p) <= 1 if include_one else 0 <= float(p) < 1)
    )
    if not ok:
        interval = "[0, 1]" if include_one else "[0, 1)"
        raise ValueError(f"{layer}: {name} must be in {interval}, got {p!r}")
    return float(p)


def positive_float(layer: str, name: str, value: Any) -> float:
    if not isinstance(value, numbers.Real) or isinstance(value, bool) or not float(value) > 0:
        raise ValueError(f"{layer}: {name} must be a positive number, got {value!r}")
    return float(value)


def real(layer: str, name: str, value: Any) -> float:
    if not isinstance(value, numbers.Real) or isinstance(value, bool) or value != value:
        raise ValueError(f"{layer}: {name} must be a real number, got {value!r}")
    return float(value)


def divides(layer: str, groups_name: str, groups: int, **counts: int) -> None:
    """``groups`` must divide every count (e.g. in_channels, out_channels)."""
    for name, count in counts.items():
        if count % groups:
            raise ValueError(f"{layer}: {groups_name}={groups} must divide {name}={count}")


def one_of(layer: str, name: str, value: _T, choices: Sequence[_T]) -> _T:
    if value not in choices:
        raise ValueError(f"{layer}: {name} must be one of {list(choices)}, got {value!r}")
    return value


def window_fits(
    layer: object,
    shape: Sequence[int],
    kernel: Sequence[int],
    stride: Sequence[int],
    padding: Any,
    dilation: Sequence[int] = (1, 1),
) -> None:
    """Raise EveryOShapeError if a (dilated) window does not fit the padded NHWC input."""
    h, w = shape[1], shape[2]
    span = tuple(d * (k - 1) + 1 for k, d in zip(kernel, dilation))
    (t, b), (l, r) = resolve_padding2d(padding, (h, w), span, stride)
    if h + t + b < span[0] or w + l + r < span[1]:
        raise EveryOShapeError(
            f"{layer!r}: window {span[0]}x{span[1]} (kernel {kernel}, dilation {dilation}) does not fit the "
            f"padded input {h + t + b}x{w + l + r} (input shape {tuple(shape)}, padding {padding!r}); "
            f"use a smaller kernel, padding='same', or a larger input"
        )
