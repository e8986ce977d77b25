"""Smooth and leaky activations: GELU, SiLU, LeakyReLU, ELU, Softplus.

Each is one elementwise op with its derivative beside it. float16 input is
computed in float32 (the upcast is exact) and rounded once to float16, forward
and backward, so the result is the correctly computed value rounded, not the
product of many float16 roundings; float32 and float64 run in their own dtype.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from everyo.dispatch import primitive
from everyo.functional import _t
from everyo.half import _float_to_half, _half_to_float, _rounded, _up, takes_rounded
from everyo.tensor import Tensor

if TYPE_CHECKING:
    from everyo._typing import TensorLike

__all__ = ["gelu", "silu", "leaky_relu", "elu", "softplus"]

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_INV_SQRT_2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_erfc = np.frompyfunc(math.erfc, 1, 1)


def _unary(a, forward, derivative):
    """Build an elementwise op from ``forward(x) -> (out, saved)`` and
    ``derivative(x, out, saved) -> d out / d x``, both on the compute dtype."""
    a = _t(a)
    x = a.data
    if not np.issubdtype(x.dtype, np.floating):
        x = x.astype(np.float32)
    half = x.dtype == np.float16
    xc = _half_to_float(x) if half else x
    out, saved = forward(xc)
    out = out.astype(xc.dtype, copy=False)

    if half:

        @takes_rounded
        def backward(g):
            return (_rounded(_up(g) * derivative(xc, out, saved)),)

        return Tensor._from_op(_float_to_half(out), (a,), backward)

    def backward(g):
        return (g * derivative(xc, out, saved),)

    return Tensor._from_op(out, (a,), backward)


def _sigmoid(x):
    # With e = exp(-|x|) (never overflows): 1 / (1 + e) for x >= 0 and
    # e / (1 + e) for x < 0. Both are accurate to a few ulps in relative
    # terms; exp(-log1p(exp(-x))) loses |x| ulps for negative x.
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1, e) / (1 + e)


# erfc(z) = t * exp(-z^2 + p(u)) with t = 2 / (2 + z), u = (2t - 0.1667 - 1) / (1 - 0.1667)
# mapping z in [0, 10] onto [-1, 1] (the form of Numerical Recipes' erfccheb).
# p is the degree-16 Chebyshev interpolant of log(erfc(z) / t) + z^2, made
# from math.erfc at the Chebyshev nodes and written in the power basis of u
# (Horner below). Relative error of erfc <= 1.2e-12 over z in [0, 10]
# (tests/core/test_layers_new.py checks it against math.erf on a dense grid):
# float32 results are math.erf's rounded, to within one ulp.
_ERFC_ZMAX = 10.0
_ERFC_TMIN = 2.0 / (2.0 + _ERFC_ZMAX)
_ERFC_POLY = (
    -0.5585953511338151,
    0.5703071521413846,
    0.015744884609758886,
    -0.029471305587921232,
    -0.0010432970294703015,
    0.003712766522935572,
    -0.0002858704433814308,
    -0.0005458288305621802,
    0.00014992766006721397,
    6.499896419509187e-05,
    -4.242747451448689e-05,
    -1.8217487361951471e-06,
    8.355890416156133e-06,
    -1.4707096712966445e-06,
    -1.0622201823975387e-06,
    2.870577818678424e-07,
    6.233257313292895e-08,
)


_CHUNK = 8192  # float64 values per block: the ~40 passes below stay in the L2 cache


def _erfc_fast(z):
    """erfc(z) for float64 z >= 0, flat (0 beyond z = 10, where erfc < 2.1e-45
    is below float32's smallest subnormal)."""
    out = np.empty_like(z)
    for start in range(0, z.size, _CHUNK):
        zc = np.minimum(z[start : start + _CHUNK], _ERFC_ZMAX)
        t = 2.0 / (2.0 + zc)
        u = t * (2.0 / (1.0 - _ERFC_TMIN))
        u -= (_ERFC_TMIN + 1.0) / (1.0 - _ERFC_TMIN)
        acc = np.full_like(u, _ERFC_POLY[-1])
        for coef in _ERFC_POLY[-2::-1]:
            acc *= u
            acc += coef
        zc *= zc
        acc -= zc
        np.exp(acc, out=acc)
        np.multiply(t, acc, out=out[start : start + _CHUNK])
    out[z > _ERFC_ZMAX] = 0.0
    return out


def _normal_cdf(x):
    """Phi(x) = erfc(-x / sqrt(2)) / 2.

    float64 input uses math.erfc elementwise (correctly rounded, ~110 ns per
    value); float32 and float16 (computed in float32) use the fitted erfc
    above, evaluated in float64 (~5x faster) and accurate far beyond their
    precision. Either way small tails (x << 0) keep their relative precision.
    """
    z = x.astype(np.float64) * _INV_SQRT_2
    if x.dtype == np.float64:
        half_erfc = 0.5 * np.asarray(_erfc(np.abs(z)), np.float64)  # (a 0-d input gives a Python float)
    else:
        half_erfc = 0.5 * _erfc_fast(np.abs(z).reshape(-1)).reshape(z.shape)
    return np.where(z < 0, half_erfc, 1.0 - half_erfc).astype(x.dtype, copy=False)


@primitive("gelu", kind="elementwise")
def gelu(a: TensorLike, approximate: str = "none") -> Tensor:
    """Gaussian error linear unit ``x * Phi(x)``.

    Args:
        approximate: ``'none'`` (exact, with erf; PyTorch's default) or
            ``'tanh'``: ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``
            (BERT/GPT-2's form, faster).

    Examples:
        >>> eo.gelu(eo.tensor([-1.0, 0.0, 1.0])).data.round(4)
        array([-0.1587,  0.    ,  0.8413], dtype=float32)
    """
    if approximate == "tanh":
        # 0.5 (1 + tanh(u)) is sigmoid(2u): the same function without the
        # cancellation in 1 + tanh(u) for negative u, so small outputs keep
        # their relative precision (1 - tanh(u)^2 is 4 s (1 - s) likewise).
        def tanh_forward(x):
            s = _sigmoid(2 * _SQRT_2_OVER_PI * (x + 0.044715 * x * x * x))
            return x * s, s

        def tanh_derivative(x, out, s):
            return s + x * (2 * s * (1 - s)) * _SQRT_2_OVER_PI * (1 + 3 * 0.044715 * x * x)

        return _unary(a, tanh_forward, tanh_derivative)
    if approximate != "none":
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")

    def forward(x):
        cdf = _normal_cdf(x)
        return x * cdf, cdf

    def derivative(x, out, cdf):
        return cdf + x * (_INV_SQRT_2PI * np.exp(-0.5 * x * x))

    return _unary(a, forward, derivative)


@primitive("silu", kind="elementwise")
def silu(a: TensorLike) -> Tensor:
    """Sigmoid linear unit (swish) ``x * sigmoid(x)``."""

    def forward(x):
        s = _sigmoid(x)
        return x * s, s

    return _unary(a, forward, lambda x, out, s: s * (1 + x * (1 - s)))


@primitive("leaky_relu", kind="elementwise")
def leaky_relu(a: TensorLike, negative_slope: float = 0.01) -> Tensor:
    """``x`` where ``x > 0``, else ``negative_slope * x`` (PyTorch's default slope 0.01).
    At 0 the gradient is ``negative_slope``, as in PyTorch."""
    slope = float(negative_slope)

    def forward(x):
        positive = x > 0
        return np.where(positive, x, x * np.asarray(slope, x.dtype)), positive

    return _unary(a, forward, lambda x, out, positive: np.where(positive, 1, slope).astype(x.dtype, copy=False))


@primitive("elu", kind="elementwise")
def elu(a: TensorLike, alpha: float = 1.0) -> Tensor:
    """``x`` where ``x > 0``, else ``alpha * (exp(x) - 1)``."""
    alpha = float(alpha)

    def forward(x):
        positive = x > 0
        neg = alpha * np.expm1(np.minimum(x, 0))  # expm1: exact near 0; min: no overflow for large x
        return np.where(positive, x, neg), positive

    return _unary(a, forward, lambda x, out, positive: np.where(positive, 1, out + alpha).astype(x.dtype, copy=False))


@primitive("softplus", kind="elementwise")
def softplus(a: TensorLike, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
    """``log(1 + exp(beta x)) / beta``, computed stably; where ``beta x >
    threshold`` it is ``x`` (PyTorch's rule, the difference is below 2e-9 relative)."""
    beta, threshold = float(beta), float(threshold)

    def forward(x):
        bx = x * beta
        linear = bx > threshold
        smooth = (np.maximum(bx, 0) + np.log1p(np.exp(-np.abs(bx)))) / beta
        return np.where(linear, x, smooth), (bx, linear)

    def derivative(x, out, saved):
        bx, linear = saved
        return np.where(linear, 1, _sigmoid(bx)).astype(x.dtype, copy=False)

    return _unary(a, forward, derivative)
