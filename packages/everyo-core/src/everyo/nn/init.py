"""Seeded parameter initialisation (PyTorch's defaults for each layer)."""

import math

from everyo.random import generator_for


def rng_for(seed):
    """A generator for one layer: ``seed=`` makes the initialisation reproducible;
    without it the generator comes from the global state (``eo.manual_seed``)."""
    return generator_for(seed)


def uniform_fan_in(rng, shape, fan_in, dtype="float32"):
    """U(-1/sqrt(fan_in), 1/sqrt(fan_in)), PyTorch's default for Linear and Conv."""
    bound = 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0
    return rng.uniform(-bound, bound, size=shape).astype(dtype)
