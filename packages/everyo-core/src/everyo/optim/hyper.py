"""Hyperparameter checks shared by the optimizers.

Each optimizer declares its hyperparameters as ``name -> check``; a check
turns an accepted value into its canonical Python form (``float``, ``bool``,
a tuple of floats) or raises with the reason. The same checks run when a
param group is added and when a state dict is loaded, so a bad value (say
``lr="fast"``) is refused where it is given, not at ``step()``.
"""

from __future__ import annotations

import math
import numbers
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping


def _real(value):
    """``value`` as a float, for Python and NumPy real numbers (and 0-d arrays);
    booleans are refused: ``lr=True`` is a mistake, not 1.0."""
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value[()]
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"must be a real number, got {value!r} ({type(value).__name__})")
    return float(value)


class Real:
    """A finite real number in ``[low, high]`` (``high`` excluded when ``open_high``)."""

    def __init__(self, low: float = 0.0, high: float | None = None, open_high: bool = False) -> None:
        self.low, self.high, self.open_high = low, high, open_high

    def describe(self) -> str:
        if self.high is None:
            return f"a finite number >= {self.low:g}"
        return f"a number in [{self.low:g}, {self.high:g}{')' if self.open_high else ']'}"

    def __call__(self, value: Any) -> float:
        v = _real(value)
        too_high = self.high is not None and (v > self.high or (self.open_high and v == self.high))
        if not math.isfinite(v) or v < self.low or too_high:
            raise ValueError(f"must be {self.describe()}, got {value!r}")
        return v


class Flag:
    """``True`` or ``False`` (NumPy booleans accepted; 0 and 1 are not)."""

    def __call__(self, value: Any) -> bool:
        if isinstance(value, np.ndarray) and value.ndim == 0:
            value = value[()]
        if not isinstance(value, (bool, np.bool_)):
            raise TypeError(f"must be True or False, got {value!r} ({type(value).__name__})")
        return bool(value)


class Pair:
    """Two numbers, each passing ``item`` (Adam's ``betas``)."""

    def __init__(self, item: Real) -> None:
        self.item = item

    def __call__(self, value: Any) -> tuple[float, ...]:
        if isinstance(value, np.ndarray):
            value = value.tolist()
        if not isinstance(value, (tuple, list)) or len(value) != 2:
            raise TypeError(f"must be a pair of numbers, each {self.item.describe()}, got {value!r}")
        try:
            return tuple(self.item(v) for v in value)
        except (TypeError, ValueError):
            raise ValueError(f"must be a pair of numbers, each {self.item.describe()}, got {value!r}") from None


def checked(
    owner: str, checks: Mapping[str, Callable[[Any], Any]], values: Mapping[str, Any], where: str
) -> dict[str, Any]:
    """``values`` (a mapping holding every name in ``checks``) with each
    hyperparameter in canonical form; the error names ``owner`` (the
    optimizer), the hyperparameter, ``where`` (e.g. "param group 1") and the value."""
    out = {}
    for name, check in checks.items():
        try:
            out[name] = check(values[name])
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"{owner}: {name} in {where} {exc}") from None
    return out


class Integer:
    """An int ``>= low`` (NumPy integers accepted; booleans and floats are not)."""

    def __init__(self, low: int = 0) -> None:
        self.low = low

    def describe(self) -> str:
        return f"an int >= {self.low}"

    def __call__(self, value: Any) -> int:
        if isinstance(value, np.ndarray) and value.ndim == 0:
            value = value[()]
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
            raise TypeError(f"must be an int, got {value!r} ({type(value).__name__})")
        if value < self.low:
            raise ValueError(f"must be {self.describe()}, got {value!r}")
        return int(value)


class Choice:
    """One of a few strings."""

    def __init__(self, *options: str) -> None:
        self.options = options

    def __call__(self, value: Any) -> str:
        if value not in self.options:
            raise ValueError(f"must be one of {', '.join(map(repr, self.options))}, got {value!r}")
        return value


class PerGroup:
    """One value for every param group, or a list/tuple with one value per group
    (checked with ``item``); gives back the list. ``groups`` is set by the caller."""

    def __init__(self, item: Callable[[Any], Any], groups: int) -> None:
        self.item, self.groups = item, groups

    def __call__(self, value: Any) -> list[Any]:
        if isinstance(value, np.ndarray):
            value = value.tolist()
        values = list(value) if isinstance(value, (list, tuple)) else [value] * self.groups
        if len(values) != self.groups:
            raise ValueError(f"must give one value per param group ({self.groups}), got {len(values)}")
        return [self.item(v) for v in values]
