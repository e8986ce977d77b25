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

import numbers

from everyo.errors import EveryOShapeError
from everyo.padding import resolve_padding2d


def _is_int(v):
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def ints(layer, name, value, n=2, minimum=1):
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


def positive_ints(layer, name, value, n=2):
    return ints(layer, name, value, n, minimum=1)


def positive_int(layer, name, value):
    return ints(layer, name, value, 1, minimum=1)[0]


def padding2d(layer, padding, allowed=("valid", "same")):
    """Check a 2-D padding argument: one of ``allowed`` strings, an int, a pair
    ``(ph, pw)`` or ``((top, bottom), (left, right))``, every number ``>= 0``.
    Returns it unchanged (strings lower-cased); sizes are resolved per input."""
    if isinstance(padding, str):
        if padding.lower() not in allowed:
            raise ValueError(f"{layer}: padding must be one of {list(allowed)} or non-negative ints, got {padding!r}")
        return padding.lower()
    if _is_int(padding):
        flat = (padding,)
    else:
        try:
            parts = tuple(padding)
            flat = tuple(v for p in parts for v in (p if not _is_int(p) else (p,)))
        except TypeError:
            parts = flat = None
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


def probability(layer, name, p, *, include_one=False):
    """A probability in [0, 1) (or [0, 1] with ``include_one``)."""
    ok = isinstance(p, numbers.Real) and not isinstance(p, bool) and (0 <= p <= 1 if include_one else 0 <= p < 1)
    if not ok:
        interval = "[0, 1]" if include_one else "[0, 1)"
        raise ValueError(f"{layer}: {name} must be in {interval}, got {p!r}")
    return float(p)


def positive_float(layer, name, value):
    if not isinstance(value, numbers.Real) or isinstance(value, bool) or not value > 0:
        raise ValueError(f"{layer}: {name} must be a positive number, got {value!r}")
    return float(value)


def real(layer, name, value):
    if not isinstance(value, numbers.Real) or isinstance(value, bool) or value != value:
        raise ValueError(f"{layer}: {name} must be a real number, got {value!r}")
    return float(value)


def divides(layer, groups_name, groups, **counts):
    """``groups`` must divide every count (e.g. in_channels, out_channels)."""
    for name, count in counts.items():
        if count % groups:
            raise ValueError(f"{layer}: {groups_name}={groups} must divide {name}={count}")


def one_of(layer, name, value, choices):
    if value not in choices:
        raise ValueError(f"{layer}: {name} must be one of {list(choices)}, got {value!r}")
    return value


def window_fits(layer, shape, kernel, stride, padding, dilation=(1, 1)):
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
