"""Smooth and leaky activations: GELU, SiLU, LeakyReLU, ELU, Softplus.

Each is one elementwise op with its derivative beside it. float16 input is
computed in float32 (the upcast is exact) and rounded once to float16, forward
and backward, so the result is the correctly computed value rounded, not the
product of many float16 roundings; float32 and float64 run in their own dtype.
"""
import math

import numpy as np

from everyo.dispatch import primitive
from everyo.functional import _t
from everyo.half import _float_to_half, _half_to_float, _rounded, _up, takes_rounded
from everyo.tensor import Tensor

__all__ = ["gelu", "silu", "leaky_relu", "elu", "softplus"]

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_INV_SQRT_2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_erf = np.frompyfunc(math.erf, 1, 1)


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


def _normal_cdf(x):
    """Phi(x) = (1 + erf(x / sqrt(2))) / 2, with math.erf (correctly rounded
    in float64) applied elementwise: exact, no approximation to validate."""
    z = x.astype(np.float64) * _INV_SQRT_2
    return ((1.0 + _erf(z).astype(np.float64)) * 0.5).astype(x.dtype, copy=False)


@primitive("gelu", kind="elementwise")
def gelu(a, approximate="none"):
    """Gaussian error linear unit ``x * Phi(x)``.

    Args:
        approximate: ``'none'`` (exact, with erf; PyTorch's default) or
            ``'tanh'``: ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``
            (BERT/GPT-2's form, faster).

    Example:
        >>> eo.gelu(eo.tensor([-1.0, 0.0, 1.0])).data.round(4)
        array([-0.1587,  0.    ,  0.8413], dtype=float32)
    """
    if approximate == "tanh":
        # 0.5 (1 + tanh(u)) is sigmoid(2u): the same function without the
        # cancellation in 1 + tanh(u) for negative u, so small outputs keep
        # their relative precision (1 - tanh(u)^2 is 4 s (1 - s) likewise).
        def forward(x):
            s = _sigmoid(2 * _SQRT_2_OVER_PI * (x + 0.044715 * x * x * x))
            return x * s, s

        def derivative(x, out, s):
            return s + x * (2 * s * (1 - s)) * _SQRT_2_OVER_PI * (1 + 3 * 0.044715 * x * x)

        return _unary(a, forward, derivative)
    if approximate != "none":
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")

    def forward(x):
        cdf = _normal_cdf(x)
        return x * cdf, cdf

    def derivative(x, out, cdf):
        return cdf + x * (_INV_SQRT_2PI * np.exp(-0.5 * x * x))

    return _unary(a, forward, derivative)


@primitive("silu", kind="elementwise")
def silu(a):
    """Sigmoid linear unit (swish) ``x * sigmoid(x)``."""
    def forward(x):
        s = _sigmoid(x)
        return x * s, s

    return _unary(a, forward, lambda x, out, s: s * (1 + x * (1 - s)))


@primitive("leaky_relu", kind="elementwise")
def leaky_relu(a, negative_slope=0.01):
    """``x`` where ``x > 0``, else ``negative_slope * x`` (PyTorch's default slope 0.01).
    At 0 the gradient is ``negative_slope``, as in PyTorch."""
    slope = float(negative_slope)

    def forward(x):
        positive = x > 0
        return np.where(positive, x, x * np.asarray(slope, x.dtype)), positive

    return _unary(a, forward, lambda x, out, positive: np.where(positive, 1, slope).astype(x.dtype, copy=False))


@primitive("elu", kind="elementwise")
def elu(a, alpha=1.0):
    """``x`` where ``x > 0``, else ``alpha * (exp(x) - 1)``."""
    alpha = float(alpha)

    def forward(x):
        positive = x > 0
        neg = alpha * np.expm1(np.minimum(x, 0))  # expm1: exact near 0; min: no overflow for large x
        return np.where(positive, x, neg), positive

    return _unary(a, forward, lambda x, out, positive: np.where(positive, 1, out + alpha).astype(x.dtype, copy=False))


@primitive("softplus", kind="elementwise")
def softplus(a, beta=1.0, threshold=20.0):
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
