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

from everyo import _buffers, kernel_table
from everyo.dispatch import primitive
from everyo.functional import _KERNEL_MIN_SIZE, _t
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
        d = derivative(xc, out, saved)
        if _c_float(g) and _c_float(d) and g.shape == d.shape and g.dtype == d.dtype:
            # g * d into d (a fresh array of the derivative's, often a recycled buffer):
            # the same products in the same operand order, no fresh pages each step.
            return (np.multiply(g, d, out=d),)
        return (g * d,)

    return Tensor._from_op(out, (a,), backward)


def _c_float(x):
    """Whether ``x`` is a C-contiguous floating ndarray of at least one axis: the layout of
    the pooled buffers, so an ``out=`` into one gives what a fresh result would hold (a
    0-d product would be a NumPy scalar, not an array)."""
    return type(x) is np.ndarray and x.ndim > 0 and x.dtype.kind == "f" and x.flags.c_contiguous


def _like(x):
    """``np.empty_like(x)``; a recycled buffer (everyo._buffers) where ``x`` is C-contiguous
    (the same layout, so the same values and the same downstream bits)."""
    return _buffers.empty(x.shape, x.dtype) if x.flags.c_contiguous else np.empty_like(x)


def _sigmoid(x):
    # With e = exp(-|x|) (never overflows): 1 / (1 + e) for x >= 0 and
    # e / (1 + e) for x < 0. Both are accurate to a few ulps in relative
    # terms; exp(-log1p(exp(-x))) loses |x| ulps for negative x.
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1, e) / (1 + e)


# Phi(-a) = erfc(a / sqrt 2) / 2 for float32 a >= 0, in float32:
#     Phi(-a) = exp(-a^2 / 2) * t * r(t),   t = 1 / (1 + a / 4)   (t in (0.216, 1])
# r is a degree-9 polynomial fitted (iteratively reweighted least squares
# towards minimax relative error) to Phi(-a) exp(a^2 / 2) / t from math.erfc;
# its own relative error is 8.7e-9 on a in [0, 14.5]. exp(-a^2/2) keeps
# relative precision without float64: a = ah + al with ah the top 12 bits of
# a's significand, so ah^2 is exact and the rest, al (a + ah), is small:
#     exp(-a^2/2) = exp(-ah^2/2) exp(-al (a + ah) / 2).
# Phi(x) for x > 0 is 1 - Phi(-x). Measured against math.erfc (float64) on a
# dense grid over [-16, 16] plus tails down to the subnormals: within 8.0
# float32 ulp of the exact value (worst near x = -2.4: Horner and NumPy's
# float32 exp, which NumPy documents to within a few ulp). The tests check
# <= 10 ulp (tests/core/test_gelu_float32.py). Beyond |x| = 15 (where
# Phi(-15) = 3.7e-51 is below float32's subnormals) x is clipped, so
# Phi(+-inf) is 1 and 0; NaN stays NaN; Phi(+-0) is 0.5.
_PHI_T_SCALE = np.float32(0.25)
_PHI_POLY = tuple(
    np.float32(c)
    for c in (
        0.09974632783411787,
        0.09952149197631874,
        0.09528757796267501,
        0.07301411796853569,
        0.08384741912879698,
        0.01774182322975261,
        0.022602338488693776,
        0.055885902495710224,
        -0.06453990411531901,
        0.016892909340915772,
    )
)
_PHI_CLIP = np.float32(15.0)
_HIGH_12_BITS = np.int32(-4096)  # clears the low 12 of float32's 23 fraction bits
_CHUNK = 65536  # float32 values per block: the ~30 passes below stay in cache (measured: 6.3 ms vs 11.6 ms per 1M)


def _normal_cdf32(x, out):
    """Phi(x) of flat float32 ``x`` into ``out`` (see the comment above)."""
    a = np.clip(x, -_PHI_CLIP, _PHI_CLIP)
    t = np.abs(a)
    t *= _PHI_T_SCALE
    t += np.float32(1.0)
    np.reciprocal(t, out=t)
    np.multiply(t, _PHI_POLY[-1], out=out)
    out += _PHI_POLY[-2]
    for coef in _PHI_POLY[-3::-1]:
        out *= t
        out += coef
    out *= t
    high = t  # t is no longer needed
    np.bitwise_and(a.view(np.int32), _HIGH_12_BITS, out=high.view(np.int32))
    low = np.subtract(a, high)
    a += high
    low *= a
    low *= np.float32(-0.5)
    np.exp(low, out=low)
    out *= low
    high *= high
    high *= np.float32(-0.5)
    np.exp(high, out=high)
    out *= high  # Phi(-|x|)
    # Phi(x) = [x has no sign bit] - copysign(Phi(-|x|), x): 1 - q for x >= +0, q for x <= -0
    np.copysign(out, x, out=out)
    np.subtract(~np.signbit(x), out, out=out)


def _normal_cdf(x):
    """Phi(x) = erfc(-x / sqrt(2)) / 2, with small tails (x << 0) keeping
    their relative precision.

    float64 input uses math.erfc elementwise (correctly rounded, ~110 ns per
    value); float32 (and float16, computed in float32) uses the float32
    approximation above, within 10 float32 ulp of the exact value.
    """
    if x.dtype == np.float64:
        z = x * _INV_SQRT_2
        half_erfc = 0.5 * np.asarray(_erfc(np.abs(z)), np.float64)  # (a 0-d input gives a Python float)
        return np.where(z < 0, half_erfc, 1.0 - half_erfc)
    x32 = x.astype(np.float32, order="C", copy=False)
    out = _like(x32)
    flat, flat_out = x32.reshape(-1), out.reshape(-1)
    for start in range(0, flat.size, _CHUNK):
        _normal_cdf32(flat[start : start + _CHUNK], flat_out[start : start + _CHUNK])
    return out.astype(x.dtype, copy=False)


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
    a = _t(a)
    fused = _gelu_compiled(a)
    if fused is not None:
        return fused

    def forward(x):
        cdf = _normal_cdf(x)
        if _c_float(x) and _c_float(cdf) and cdf.dtype == x.dtype:  # x * cdf into a recycled buffer: the same products
            return np.multiply(x, cdf, out=_like(x)), cdf
        return x * cdf, cdf

    return _unary(a, forward, _gelu_derivative)


def _gelu_derivative(x, out, cdf):
    # Phi(x) + x phi(x), phi(x) = exp(-x^2 / 2) / sqrt(2 pi), in x's dtype
    d = np.multiply(x, x, out=_like(x))
    d *= -0.5
    np.exp(d, out=d)
    d *= x
    d *= _INV_SQRT_2PI
    d += cdf
    return d


def _gelu_compiled(a):
    # Exact float32 GELU through everyo-kernels' gelu_forward and gelu_backward
    # (C-contiguous float32 from _KERNEL_MIN_SIZE values; float16 reaches
    # here as float32): one pass each instead of ~40 NumPy passes. They are
    # _normal_cdf32's and _gelu_derivative's float32 operations in the same
    # order, but with their own vectorised exp (within 1 ulp; NumPy's SIMD exp
    # is within 2.5), so within a documented relative 2^-20 of this module's
    # NumPy path (everyo.kernels.gelu, tests/kernels/test_gelu_kernels.py),
    # not bit-identical. None where they do not apply.
    x = a.data
    if x.dtype != np.float32 or x.size < _KERNEL_MIN_SIZE or not x.flags.c_contiguous:
        return None
    forward, backward = kernel_table.get("gelu_forward"), kernel_table.get("gelu_backward")
    if forward is None or backward is None:
        return None
    out, cdf = _buffers.empty(x.shape, x.dtype), _buffers.empty(x.shape, x.dtype)
    forward(x.reshape(-1), out.reshape(-1), cdf.reshape(-1))

    def grad(g):
        if g.dtype != x.dtype or g.shape != x.shape:
            return (g * _gelu_derivative(x, out, cdf),)
        g = np.ascontiguousarray(g)  # (a broadcast gradient, e.g. from sum(), in one copy)
        res = _buffers.empty(g.shape, g.dtype)
        backward(g.reshape(-1), x.reshape(-1), cdf.reshape(-1), res.reshape(-1))
        return (res,)

    return Tensor._from_op(out, (a,), grad)


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
