"""float32 <-> float16 conversions in one pass, the inf/NaN check fused in (``everyo.half``).

Under autocast float16 every 16-bit op converts its operands up and its result
down; core does that with NumPy's element-at-a-time ``astype``, its own dozen
whole-array passes, or onnxruntime's ``Cast`` followed by a scan of the codes
for inf and NaN. These do each conversion as one vectorisable loop of integer
operations on the bits, and report the largest magnitude seen in the same pass:

* ``half_codes``: float32 -> float16 codes, rounded to nearest even exactly as
  ``astype`` rounds every value with ``|x| < 65520`` (float16 subnormals and
  signed zeros included). For the other values (``|x| >= 65520``, inf, NaN) it
  writes some code and returns their presence: the return value is the
  largest ``|x|`` as float32 bits, and core redoes those values with NumPy
  when it is ``>= 0x477FF000`` (65520), so NaN payloads and overflow warnings
  stay ``astype``'s.
* ``round_to_half``: float32 -> the float32 values ``astype(float16)`` holds
  (down and back up in one pass), same contract and return value.
* ``half_to_float``: float16 codes -> float32 bits, exact for every code (inf,
  NaN payloads and signalling NaNs kept, as NumPy keeps them).

Normal values round with integer adds (``+ 0xFFF + odd bit``, then the
exponent rebias and a shift); below 2**-14 float16's spacing is the fixed
2**-24, and adding 0.5 in float32 (whose spacing at 0.5 is 2**-24) rounds
``|x|`` there to nearest even, exactly, by the FPU's own rule: the result's
low bits are the code. Going up, a subnormal code is rebuilt the same way
backwards (an exact float32 subtraction). Both branches are computed and one
selected, so the loops have no branches and LLVM vectorises them. The tests
check every float16 code going up and every boundary (ties, subnormal
thresholds, 65504/65520, zeros, inf, NaN) plus random bit patterns going down.

Where the CPU converts float16 itself (x86's F16C, which LLVM targets when the
host has it: x86-64 CPUs from 2012-2013 on), the kernels are the same loops
around LLVM's ``fptrunc``/``fpext`` to ``half`` instead, which compile to
``vcvtps2ph``/``vcvtph2ps``: IEEE round-to-nearest-even, so the same codes for
every value float16 holds finitely (the return value and core's redo of the
rest are unchanged); going up, codes with an all-ones exponent take the integer
path (the instruction would quiet a signalling NaN, which NumPy keeps).
Measured (131,072 values, one thread, Zen 4, in L2): down 16.3 -> 8.6 us, up
and round 16 -> 12.6 us. Elsewhere the integer loops (``*_bits``) are used.

All take 1-D C-contiguous arrays of the bits (``np.uint32`` for float32,
``np.uint16`` for float16) and write into ``out``.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np
from llvmlite import binding, ir
from numba import types
from numba.extending import intrinsic

from everyo.kernels._jit import helper, kernel

__all__ = ["F16C", "half_codes", "round_to_half", "half_to_float"]

_u = np.uint32
_f = np.float32


@intrinsic
def _as_float(typingctx: Any, bits: Any) -> Any:
    """The float32 whose bits are the uint32 ``bits`` (a register move)."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.bitcast(args[0], ir.FloatType())

    return types.float32(types.uint32), codegen


@intrinsic
def _as_bits(typingctx: Any, value: Any) -> Any:
    """The uint32 bits of the float32 ``value``."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.bitcast(args[0], ir.IntType(32))

    return types.uint32(types.float32), codegen


_HALF = _u(0x3F000000)  # 0.5: its float32 spacing is float16's subnormal spacing, 2**-24
_MIN_NORMAL = _u(0x38800000)  # 2**-14, float16's smallest normal value


@helper
def _subnormal_code(magnitude):
    """float16 code of the float32 bits ``magnitude`` < 2**-14 (0x400 when it rounds up to 2**-14)."""
    return _u(_as_bits(_as_float(magnitude) + _f(0.5)) - _HALF)


@helper
def _normal_code(magnitude):
    """float16 code of the float32 bits ``magnitude`` in [2**-14, 65520) (0x7C00 for [65504 + 8, 65520))."""
    odd = _u(_u(magnitude >> _u(13)) & _u(1))
    return _u(_u(_u(magnitude + _u(0xFFF)) + odd - _u(112 << 23)) >> _u(13))


@kernel
def half_codes_bits(bits, out):
    """float16 codes of float32 ``bits``; returns the largest magnitude's bits."""
    top = _u(0)
    for n in range(bits.size):
        b = bits[n]
        magnitude = _u(b & _u(0x7FFFFFFF))
        top = max(top, magnitude)
        code = _subnormal_code(magnitude) if magnitude < _MIN_NORMAL else _normal_code(magnitude)
        out[n] = np.uint16(_u(code | _u(_u(b >> _u(16)) & _u(0x8000))))
    return top


@kernel
def round_to_half_bits(bits, out):
    """float32 bits of the float16 values of float32 ``bits``; returns the largest magnitude's bits."""
    top = _u(0)
    for n in range(bits.size):
        b = bits[n]
        magnitude = _u(b & _u(0x7FFFFFFF))
        top = max(top, magnitude)
        # below 2**-14: |x| rounded at 2**-24 by adding 0.5 and taking it off again (both exact but the first)
        small = _u(_as_bits((_as_float(magnitude) + _f(0.5)) - _f(0.5)) | _u(b & _u(0x80000000)))
        odd = _u(_u(b >> _u(13)) & _u(1))
        normal = _u(_u(_u(b + _u(0xFFF)) + odd) & _u(0xFFFFE000))
        out[n] = small if magnitude < _MIN_NORMAL else normal
    return top


@kernel
def half_to_float_bits(codes, out):
    """float32 bits of float16 ``codes`` (exact, NaN payloads kept)."""
    for n in range(codes.size):
        c = _u(codes[n])
        shifted = _u(_u(c & _u(0x7FFF)) << _u(13))
        normal = _u(shifted + _u(112 << 23))
        small = _as_bits(_as_float(_u(shifted + _MIN_NORMAL)) - _f(2.0**-14))  # code * 2**-24, exact
        special = _u(shifted | _u(0x7F800000))
        value = small if shifted < _u(0x400 << 13) else (special if shifted >= _u(0x7C00 << 13) else normal)
        out[n] = _u(value | _u(_u(c & _u(0x8000)) << _u(16)))


# --- the same conversions by the CPU's own float16 instructions --------------------


@intrinsic
def _to_code(typingctx: Any, bits: Any) -> Any:
    """float16 code of the float32 whose bits are ``bits``, rounded to nearest even by the CPU."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        value = builder.bitcast(args[0], ir.FloatType())
        return builder.bitcast(builder.fptrunc(value, ir.HalfType()), ir.IntType(16))

    return types.uint16(types.uint32), codegen


@intrinsic
def _code_bits(typingctx: Any, code: Any) -> Any:
    """float32 bits of the float16 ``code`` (exact but for a signalling NaN, which comes back quiet)."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        value = builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())
        return builder.bitcast(value, ir.IntType(32))

    return types.uint32(types.uint16), codegen


@kernel
def half_codes_f16c(bits, out):
    """``half_codes`` by the CPU's conversion."""
    top = _u(0)
    for n in range(bits.size):
        b = bits[n]
        top = max(top, _u(b & _u(0x7FFFFFFF)))
        out[n] = _to_code(b)
    return top


@kernel
def round_to_half_f16c(bits, out):
    """``round_to_half`` by the CPU's conversions."""
    top = _u(0)
    for n in range(bits.size):
        b = bits[n]
        top = max(top, _u(b & _u(0x7FFFFFFF)))
        out[n] = _code_bits(_to_code(b))
    return top


@kernel
def half_to_float_f16c(codes, out):
    """``half_to_float`` by the CPU's conversion; inf and NaN codes by the integer path."""
    for n in range(codes.size):
        c = _u(codes[n])
        special = _u(_u(_u(c & _u(0x7FFF)) << _u(13)) | _u(0x7F800000) | _u(_u(c & _u(0x8000)) << _u(16)))
        out[n] = special if _u(c & _u(0x7C00)) == _u(0x7C00) else _code_bits(codes[n])


def _has_f16c() -> bool:
    """Whether numba compiles for a CPU with F16C: the host's, unless NUMBA_CPU_NAME names another
    (then only when NUMBA_CPU_FEATURES lists it; without it LLVM would call a runtime routine)."""
    if numba.config.CPU_NAME:
        return "+f16c" in (numba.config.CPU_FEATURES or "").split(",")
    return "+f16c" in binding.get_host_cpu_features().flatten().split(",")


F16C = _has_f16c()
"""Whether this CPU converts float16 itself: the exported kernels are then the ``*_f16c`` ones."""

if F16C:
    half_codes, round_to_half, half_to_float = half_codes_f16c, round_to_half_f16c, half_to_float_f16c
else:
    half_codes, round_to_half, half_to_float = half_codes_bits, round_to_half_bits, half_to_float_bits
