"""float32 <-> bfloat16 conversions in one pass (``everyo.half``'s bfloat16 paths).

bfloat16 is float32's top 16 bits. Core converts with NumPy integer passes on
the uint32 bits (shift, mask, two adds, a NaN scan, a shift and a narrowing
copy: seven passes down, two up); these are the same integer operations, one
pass, so the results are **bit-identical**: round to nearest even at bit 16,
the largest finite values carry into inf, every NaN becomes the quiet NaN
0x7FC0 with its sign (as ml_dtypes does).

All take and give 1-D C-contiguous arrays of the bits (core passes
``x.view(np.uint32)``), and write into ``out``. Every intermediate is wrapped
in ``np.uint32``: numba widens integer arithmetic to 64 bits, which halved the
vector width (``bfloat16_codes`` 114 -> 60 us for 512K values once kept at 32).
"""

from __future__ import annotations

import numpy as np

from everyo.kernels._jit import kernel

__all__ = ["bfloat16_codes", "round_to_bfloat16", "bfloat16_to_float"]

_u = np.uint32


@kernel
def bfloat16_codes(bits, out):
    """The bfloat16 codes of float32 ``bits`` (rounded as ``astype`` rounds)."""
    for n in range(bits.size):
        b = bits[n]
        rounded = _u(_u(b + _u(_u(_u(b >> _u(16)) & _u(1)) + _u(0x7FFF))) >> _u(16))
        quiet = _u(_u(_u(b >> _u(16)) & _u(0x8000)) | _u(0x7FC0))
        out[n] = np.uint16(quiet if _u(b & _u(0x7FFFFFFF)) > _u(0x7F800000) else rounded)


@kernel
def round_to_bfloat16(bits, out):
    """The float32 bits of the values float32 ``bits`` round to in bfloat16."""
    for n in range(bits.size):
        b = bits[n]
        rounded = _u(_u(b + _u(_u(_u(b >> _u(16)) & _u(1)) + _u(0x7FFF))) & _u(0xFFFF0000))
        quiet = _u(_u(b & _u(0x80000000)) | _u(0x7FC00000))
        out[n] = quiet if _u(b & _u(0x7FFFFFFF)) > _u(0x7F800000) else rounded


@kernel
def bfloat16_to_float(codes, out):
    """The float32 bits of bfloat16 ``codes`` (exact, NaN payloads kept)."""
    for n in range(codes.size):
        out[n] = _u(_u(codes[n]) << _u(16))
