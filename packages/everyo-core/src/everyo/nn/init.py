"""Parameter initialisation: PyTorch's ``torch.nn.init``, on EveryO's layouts.

Each ``*_`` function fills a Tensor (usually a :class:`~everyo.Parameter`)
in place, under no_grad, and returns it. ``seed=`` (an int or a
``numpy.random.Generator``, EveryO's spelling of PyTorch's ``generator=``)
makes the draw reproducible; without it the numbers come from the global
generator that ``eo.manual_seed`` seeds.

Fans. EveryO stores weights with the output axis *last*: Linear ``(in,
out)``, Conv1D ``(k, in, out)``, Conv2D ``(kh, kw, in, out)``, the recurrent
layers' ``weight_ih`` ``(in, gates * hidden)``, MultiHeadAttention's
``in_proj_weight`` ``(E, 3E)``. So here ``fan_out`` is the last axis times
the receptive field (the axes before the last two), ``fan_in`` the one
before it times the receptive field: the same fans PyTorch computes from
its ``(out, in, *kernel)`` layout, hence the same distributions for those
layers. Two layers differ: ``Conv2DTranspose`` ``(kh, kw, in, out)`` (PyTorch's
``(in, out, kh, kw)`` has its fans the other way round) and ``Embedding``
``(num, dim)`` (PyTorch takes ``fan_in = dim``): for ``kaiming_*`` on those
pass the other ``mode`` to get PyTorch's number (``xavier_*`` uses the sum
of both fans, so it agrees either way).

``orthogonal_`` makes the ``(prod(shape[:-1]), shape[-1])`` matrix
(semi-)orthogonal: PyTorch's ``(out, in * k)`` matrix transposed.

Examples:
    >>> w = eo.Parameter(np.zeros((256, 128), dtype="float32"))
    >>> _ = eo.nn.init.kaiming_normal_(w, nonlinearity="relu", seed=0)
    >>> round(float(w.data.std()), 2)  # sqrt(2 / 256)
    0.09
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from everyo import _blas
from everyo.autograd import no_grad
from everyo.half import as_dtype
from everyo.random import generator_for
from everyo.tensor import Tensor

if TYPE_CHECKING:
    from typing import Literal

    from everyo._typing import Array, DType, Shape

    Seed = int | np.random.Generator | None

__all__ = [
    "calculate_gain",
    "uniform_",
    "normal_",
    "trunc_normal_",
    "constant_",
    "ones_",
    "zeros_",
    "xavier_uniform_",
    "xavier_normal_",
    "kaiming_uniform_",
    "kaiming_normal_",
    "orthogonal_",
]


def rng_for(seed: int | np.random.Generator | None) -> np.random.Generator:
    """A generator for one layer: ``seed=`` makes the initialisation reproducible;
    without it the generator comes from the global state (``eo.manual_seed``)."""
    return generator_for(seed)


def uniform_fan_in(rng: np.random.Generator, shape: Shape, fan_in: int, dtype: DType = "float32") -> Array:
    """U(-1/sqrt(fan_in), 1/sqrt(fan_in)), PyTorch's default for Linear and Conv."""
    bound = 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0
    return rng.uniform(-bound, bound, size=shape).astype(as_dtype(dtype))


def _fill(tensor: Tensor, values: Array | float, what: str) -> Tensor:
    if not isinstance(tensor, Tensor):
        raise TypeError(f"nn.init.{what}: expected a Tensor or Parameter, got {type(tensor).__name__}")
    with no_grad():
        tensor.copy_(values)
    return tensor


def _fans(tensor: Tensor, what: str) -> tuple[int, int]:
    shape = tensor.shape if isinstance(tensor, Tensor) else np.shape(tensor)
    if len(shape) < 2:
        raise ValueError(
            f"nn.init.{what}: fan in and fan out need a tensor of at least 2 dimensions, got shape {tuple(shape)}"
        )
    field = int(np.prod(shape[:-2])) if len(shape) > 2 else 1
    return shape[-2] * field, shape[-1] * field


def calculate_gain(nonlinearity: str, param: float | None = None) -> float:
    """PyTorch's recommended gain for ``nonlinearity``: 1 for linear, conv and
    sigmoid, 5/3 for tanh, sqrt(2) for relu, sqrt(2 / (1 + slope**2)) for
    leaky_relu (``param`` the slope, default 0.01), 3/4 for selu.

    Examples:
        >>> eo.nn.init.calculate_gain("tanh")
        1.6666666666666667
    """
    linear = ("linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d")
    if nonlinearity in linear or nonlinearity == "sigmoid":
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        slope = 0.01 if param is None else param
        if isinstance(slope, bool) or not isinstance(slope, (int, float)):
            raise ValueError(f"nn.init.calculate_gain: negative_slope {param!r} is not a number")
        return math.sqrt(2.0 / (1 + slope**2))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise ValueError(f"nn.init.calculate_gain: unsupported nonlinearity {nonlinearity!r}")


def uniform_(tensor: Tensor, a: float = 0.0, b: float = 1.0, *, seed: Seed = None) -> Tensor:
    """Fill ``tensor`` with draws from U(a, b); returns it."""
    return _fill(tensor, generator_for(seed).uniform(a, b, size=tensor.shape), "uniform_")


def normal_(tensor: Tensor, mean: float = 0.0, std: float = 1.0, *, seed: Seed = None) -> Tensor:
    """Fill ``tensor`` with draws from N(mean, std**2); returns it."""
    return _fill(tensor, generator_for(seed).normal(mean, std, size=tensor.shape), "normal_")


def trunc_normal_(
    tensor: Tensor, mean: float = 0.0, std: float = 1.0, a: float = -2.0, b: float = 2.0, *, seed: Seed = None
) -> Tensor:
    """Fill ``tensor`` with draws from N(mean, std**2) restricted to [a, b]
    (absolute bounds, as PyTorch); returns it. Out-of-range draws are drawn
    again, so the values follow the truncated normal exactly."""
    if not a < b:
        raise ValueError(f"nn.init.trunc_normal_: needs a < b, got a={a}, b={b}")
    mass = 0.5 * (math.erf((b - mean) / (std * math.sqrt(2))) - math.erf((a - mean) / (std * math.sqrt(2))))
    if mass < 1e-3:
        raise ValueError(
            f"nn.init.trunc_normal_: [a, b] = [{a}, {b}] holds only {mass:.2g} of N({mean}, {std}**2); "
            f"choose bounds nearer the mean"
        )
    rng = generator_for(seed)
    values = rng.normal(mean, std, size=tensor.shape)
    outside = (values < a) | (values > b)
    while outside.any():
        values[outside] = rng.normal(mean, std, size=int(outside.sum()))
        outside = (values < a) | (values > b)
    return _fill(tensor, values, "trunc_normal_")


def constant_(tensor: Tensor, val: float) -> Tensor:
    """Fill ``tensor`` with ``val``; returns it."""
    return _fill(tensor, val, "constant_")


def ones_(tensor: Tensor) -> Tensor:
    """Fill ``tensor`` with ones; returns it."""
    return _fill(tensor, 1.0, "ones_")


def zeros_(tensor: Tensor) -> Tensor:
    """Fill ``tensor`` with zeros; returns it."""
    return _fill(tensor, 0.0, "zeros_")


def xavier_uniform_(tensor: Tensor, gain: float = 1.0, *, seed: Seed = None) -> Tensor:
    """Glorot uniform: U(-bound, bound) with ``bound = gain * sqrt(6 / (fan_in + fan_out))``."""
    fan_in, fan_out = _fans(tensor, "xavier_uniform_")
    bound = gain * math.sqrt(6.0 / (fan_in + fan_out))
    return _fill(tensor, generator_for(seed).uniform(-bound, bound, size=tensor.shape), "xavier_uniform_")


def xavier_normal_(tensor: Tensor, gain: float = 1.0, *, seed: Seed = None) -> Tensor:
    """Glorot normal: N(0, std**2) with ``std = gain * sqrt(2 / (fan_in + fan_out))``."""
    fan_in, fan_out = _fans(tensor, "xavier_normal_")
    std = gain * math.sqrt(2.0 / (fan_in + fan_out))
    return _fill(tensor, generator_for(seed).normal(0.0, std, size=tensor.shape), "xavier_normal_")


def _kaiming_std(tensor, a, mode, nonlinearity, what):
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"nn.init.{what}: mode must be 'fan_in' or 'fan_out', got {mode!r}")
    fan_in, fan_out = _fans(tensor, what)
    fan = fan_in if mode == "fan_in" else fan_out
    if fan == 0:
        raise ValueError(f"nn.init.{what}: {mode} of shape {tensor.shape} is 0")
    return calculate_gain(nonlinearity, a) / math.sqrt(fan)


def kaiming_uniform_(
    tensor: Tensor,
    a: float = 0.0,
    mode: Literal["fan_in", "fan_out"] = "fan_in",
    nonlinearity: str = "leaky_relu",
    *,
    seed: Seed = None,
) -> Tensor:
    """He uniform: U(-bound, bound) with ``bound = sqrt(3) * gain / sqrt(fan)``
    (``gain = calculate_gain(nonlinearity, a)``, ``fan`` chosen by ``mode``)."""
    bound = math.sqrt(3.0) * _kaiming_std(tensor, a, mode, nonlinearity, "kaiming_uniform_")
    return _fill(tensor, generator_for(seed).uniform(-bound, bound, size=tensor.shape), "kaiming_uniform_")


def kaiming_normal_(
    tensor: Tensor,
    a: float = 0.0,
    mode: Literal["fan_in", "fan_out"] = "fan_in",
    nonlinearity: str = "leaky_relu",
    *,
    seed: Seed = None,
) -> Tensor:
    """He normal: N(0, std**2) with ``std = gain / sqrt(fan)``."""
    std = _kaiming_std(tensor, a, mode, nonlinearity, "kaiming_normal_")
    return _fill(tensor, generator_for(seed).normal(0.0, std, size=tensor.shape), "kaiming_normal_")


def orthogonal_(tensor: Tensor, gain: float = 1.0, *, seed: Seed = None) -> Tensor:
    """Fill ``tensor`` (2 or more dimensions) so that its
    ``(prod(shape[:-1]), shape[-1])`` matrix has orthonormal columns (or rows,
    when it is wide), times ``gain``: QR of a Gaussian matrix with the signs
    fixed, as PyTorch (whose matrix is this one transposed)."""
    shape = tensor.shape
    if len(shape) < 2:
        raise ValueError(f"nn.init.orthogonal_: needs at least 2 dimensions, got shape {tuple(shape)}")
    rows, cols = int(np.prod(shape[:-1])), shape[-1]
    flat = generator_for(seed).standard_normal((max(rows, cols), min(rows, cols)))
    with _blas.wide(_blas.OPENBLAS_SINGLE):  # LAPACK's QR runs on OpenBLAS's threads
        q, r = np.linalg.qr(flat)
    q *= np.sign(np.diag(r))  # makes the distribution uniform (Haar)
    matrix = q if rows >= cols else q.T
    return _fill(tensor, gain * matrix.reshape(shape), "orthogonal_")
