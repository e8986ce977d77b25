"""Seeded parameter initialisation (PyTorch's defaults for each layer)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from everyo.random import generator_for

if TYPE_CHECKING:
    import numpy as np

    from everyo._typing import Array, DType, Shape


def rng_for(seed: int | np.random.Generator | None) -> np.random.Generator:
    """A generator for one layer: ``seed=`` makes the initialisation reproducible;
    without it the generator comes from the global state (``eo.manual_seed``)."""
    return generator_for(seed)


def uniform_fan_in(rng: np.random.Generator, shape: Shape, fan_in: int, dtype: DType = "float32") -> Array:
    """U(-1/sqrt(fan_in), 1/sqrt(fan_in)), PyTorch's default for Linear and Conv."""
    bound = 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0
    return rng.uniform(-bound, bound, size=shape).astype(dtype)
