"""Exact GELU ``x * Phi(x)`` on float32, forward and backward, one pass each (core's ``gelu``).

Core's float32 Phi (``everyo.activations._normal_cdf32``) is a fixed sequence
of float32 operations -- clip, ``t = 1 / (1 + |a| / 4)``, a degree-9 Horner
polynomial in ``t``, two ``exp`` factors, a copysign and a subtraction --
run as ~30 NumPy passes over blocks of 65,536 values, then a multiply by
``x``; the backward is ``g * (Phi(x) + x exp(-x^2 / 2) / sqrt(2 pi))`` in
seven more passes. Here each is one loop over the values, the same float32
operations in the same order (no ``fastmath``, no FMA contraction), so every
step is bit-identical to the NumPy path **except exp**: NumPy's float32
``exp`` is its own SIMD loop (AVX512F/AVX2, documented max error 2.52 ulp, or
libm's ``expf`` on other CPUs), and a scalar ``exp`` call in numba is not
vectorised (measured 3x slower than NumPy's loop; issue 24). The kernels use
:func:`_exp32` instead: Cody-Waite reduction ``x = k ln 2 + r`` with a 9-bit
high part of ln 2 (so ``k * LN2_HI`` is exact), Cephes' degree-7 polynomial
for ``exp(r)`` on ``|r| <= ln 2 / 2``, and ``2^k`` applied as two exact
power-of-two factors so that a subnormal result is rounded once. It is
branch-free (selects), so LLVM vectorises the loops (AVX-512 here, no FMA).
Measured against float64 ``exp`` over every float32 in ``[-104, -87]`` (the
subnormal results) and 20M random ones in ``[-104, 0]``: within 0.98 ulp
(NumPy's: 2.41); the tests check < 1 ulp.

The forward's first factor, ``exp(low)`` with ``low = (a - high)(a + high) / -2``
(``high`` is ``a`` with its low 12 fraction bits cleared, so ``|low| <= 2^-11 a^2
<= 0.11`` for the clipped ``|a| <= 15``), is its degree-5 Taylor polynomial
(:func:`_exp_small`: truncation below ``0.11^6 / 720 = 2^-28.6`` relative, so within
float32 rounding of ``_exp32``; 123 of 1M values at ``3 N(0, 1)`` differ from
``_exp32`` by one ulp, the largest deviation from the NumPy path unchanged). It
saves a range reduction and a scaling per value: the forward 1.64 -> 1.29 ms at
(32, 64, 512) (one thread, shared 2-core machine).

Both kernels are also compiled with FMA contraction (``_jit.contracted_kernel``:
each ``q * t + P`` of the polynomials, and the backward's final ``... + cdf``, one
fused multiply-add where the CPU has FMA, rounded once instead of twice): forward
1.29 -> 0.96 ms, backward 0.68 -> 0.52 ms at (32, 64, 512); some values move by
an ulp or so, all within the bound below (the tests run the compiled kernels, so
on an FMA CPU they check the contracted ones).

So the kernels differ from the NumPy path only through the ``exp``
roundings (one in the backward) and the contractions, which enter as relative errors of a few ulp:
``|kernel - numpy| <= BOUND_REL * scale + 2^-148 (1 + |x|)``, with ``scale``
the NumPy path's ``|Phi(x)|`` for Phi, ``|x Phi(x)|`` for the output, and
``|g| (|Phi(x)| + |x phi(x)|)`` for the gradient (its two terms cancel near
x = -0.75, so its error is relative to their size, not to their sum); the
second term covers subnormal results (``Phi`` below x = -13). Measured over
24M random float32 inputs in [-15.5, 15.5]: 3.9 * 2^-23 at most against
``BOUND_REL = 2^-20``. The kernel's Phi stays within core's documented 10 ulp
of the exact ``erfc`` (both are tested in tests/kernels/test_gelu_kernels.py).

- :func:`gelu_forward`: ``out = x * Phi(x)`` and ``cdf = Phi(x)`` (saved for the backward).
- :func:`gelu_backward`: ``res = g * (cdf + x * exp(x * x * -0.5) * (1 / sqrt(2 pi)))``.

float32, 1-D C-contiguous arrays (core passes the flattened arrays).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from everyo import activations as _activations
from everyo.kernels._jit import contracted_kernel, helper, kernel

__all__ = ["gelu_forward", "gelu_backward", "BOUND_REL"]

BOUND_REL = 2.0**-20  # relative bound against the NumPy path (see the module doc)

# core's constants (everyo.activations), as float32: imported, so the two paths cannot drift apart
_CLIP = _activations._PHI_CLIP
_T_SCALE = _activations._PHI_T_SCALE
_ONE = np.float32(1.0)
_MINUS_HALF = np.float32(-0.5)
_INV_SQRT_2PI = np.float32(_activations._INV_SQRT_2PI)
_P0, _P1, _P2, _P3, _P4, _P5, _P6, _P7, _P8, _P9 = _activations._PHI_POLY
_HIGH_12_BITS = _activations._HIGH_12_BITS

# exp
_LOG2E = np.float32(1.4426950408889634)
_ROUND_MAGIC = np.float32(12582912.0)  # 1.5 * 2^23: v + magic - magic rounds v to an integer (|v| < 2^22)
_LN2_HI = np.float32(0.693359375)  # 9 significant bits: k * _LN2_HI is exact for |k| <= 2^15
_LN2_LO = np.float32(-2.12194440e-4)
_E0, _E1, _E2, _E3, _E4, _E5 = (
    np.float32(c)
    for c in (5.0000001201e-1, 1.6666665459e-1, 4.1665795894e-2, 8.3334519073e-3, 1.3981999507e-3, 1.9875691500e-4)
)
_EXP_MAX = np.float32(88.72283935546875)  # above: inf
_EXP_MIN = np.float32(-103.97208404541015625)  # below: 0 (exp is under half the smallest subnormal)
_ZERO = np.float32(0.0)
_INF = np.float32(np.inf)
_BIAS = np.int32(127)


@intrinsic
def _float_bits(typingctx, value):
    """The int32 whose bits are float32 ``value``'s."""

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return types.int32(types.float32), codegen


@intrinsic
def _bits_float(typingctx, bits):
    """The float32 whose bits are int32 ``bits``."""

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return types.float32(types.int32), codegen


@helper
def _exp32(x):
    # exp(x) for float32 x <= 88.7 (see the module doc); NaN gives NaN.
    finite = x >= _EXP_MIN and x < _EXP_MAX  # False for NaN
    v = x if finite else _ZERO  # keeps the integer conversion below defined
    k = (v * _LOG2E + _ROUND_MAGIC) - _ROUND_MAGIC
    r = (v - k * _LN2_HI) - k * _LN2_LO
    z = r * r
    p = ((((_E5 * r + _E4) * r + _E3) * r + _E2) * r + _E1) * r + _E0
    y = (p * z + r) + _ONE
    ki = np.int32(k)  # in [-150, 128]
    k1 = ki >> 1
    k2 = ki - k1  # k1, k2 in [-75, 64]: both 2^k1 and 2^k2 are normal
    y = (y * _bits_float((k1 + _BIAS) << 23)) * _bits_float((k2 + _BIAS) << 23)
    if not finite:
        y = _ZERO if x < _EXP_MIN else (_INF if x >= _EXP_MAX else x)
    return y


# exp(b) for |b| <= 0.11 (the forward's exp(low)): 1 + b + b^2/2 + ... + b^5/120, Horner.
_S5, _S4, _S3, _S2 = (np.float32(c) for c in (1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5))


@helper
def _exp_small(b):
    return ((((_S5 * b + _S4) * b + _S3) * b + _S2) * b + _ONE) * b + _ONE


@kernel
def exp32(x, out):
    """``out = exp(x)`` with :func:`_exp32` (for the tests)."""
    for n in range(x.size):
        out[n] = _exp32(x[n])


@contracted_kernel  # FMAs in the polynomials (see the module doc)
def gelu_forward(x, out, cdf):
    """``cdf = Phi(x)``, ``out = x * cdf`` over 1-D C-contiguous float32 arrays."""
    for n in range(x.size):
        xn = x[n]
        a = xn
        if xn > _CLIP:
            a = _CLIP
        if xn < -_CLIP:
            a = -_CLIP
        t = _ONE / (abs(a) * _T_SCALE + _ONE)
        q = t * _P9 + _P8
        q = q * t + _P7
        q = q * t + _P6
        q = q * t + _P5
        q = q * t + _P4
        q = q * t + _P3
        q = q * t + _P2
        q = q * t + _P1
        q = q * t + _P0
        q = q * t
        high = _bits_float(_float_bits(a) & _HIGH_12_BITS)
        low = (a - high) * (a + high) * _MINUS_HALF
        q = q * _exp_small(low)  # |low| <= 0.11 (see the module doc)
        q = q * _exp32(high * high * _MINUS_HALF)  # Phi(-|x|)
        phi = q if _float_bits(xn) < 0 else _ONE - q  # core: [no sign bit] - copysign(q, x)
        cdf[n] = phi
        out[n] = xn * phi


@contracted_kernel  # FMAs in exp's polynomial and the final multiply-add (see the module doc)
def gelu_backward(g, x, cdf, res):
    """``res = g * (cdf + x exp(-x^2 / 2) / sqrt(2 pi))`` over 1-D C-contiguous float32 arrays."""
    for n in range(x.size):
        xn = x[n]
        d = _exp32(xn * xn * _MINUS_HALF) * xn * _INV_SQRT_2PI + cdf[n]
        res[n] = g[n] * d
