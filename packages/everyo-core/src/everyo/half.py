"""16-bit float <-> float32 conversions: exact (bit-identical to ``astype``) and fast.

float16 below; bfloat16 (``ml_dtypes.bfloat16``, float32's top 16 bits) at the
end of the file, handled by its dtype's name so core never imports ml_dtypes.

NumPy's float32 -> float16 cast (NumPy 2.4, this project's x86-64 machine)
takes ~1.9 ns a value for normal values, several times that for zeros and
~40x that for float16 subnormals, which is exactly where small gradients and
ReLU outputs live; float16 -> float32 ~1-2 ns. These give bit-identical
results to ``astype`` with a handful of whole-array integer and float passes
that NumPy runs with SIMD (2-4 ns a value, whatever the values), and
:func:`_float_to_half` hands arrays with few zeros or subnormals to NumPy's
cast, which is then the faster one. Used by the float16 paths of matmul, linear, conv2d, pooling
and the differentiable cast.

* Up: the code's bits are moved into float32's fields and multiplied by
  ``2**112``, which rebiases the exponent (and normalises subnormal codes)
  exactly.
* Down, in two steps. Rounding to float16's precision stays in float32:
  Veltkamp's splitting for the usual case (see :func:`_round_signed`), an
  add-and-subtract of a power of two otherwise (:func:`_round_magnitude`).
  Encoding then multiplies by ``2**-112`` (exact: a float16 subnormal lands
  on a float32 subnormal) and shifts the bits down by 13.
* :class:`Rounded` lets backward skip the encoding and the trip back up when
  a float16 gradient goes straight into another float16 op.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from everyo import _buffers, kernel_table

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, TypeVar

    from everyo._typing import Array, FloatArray

    F = TypeVar("F", bound=Callable[..., Any])

_U32 = np.uint32
_F32 = np.float32
_F16 = np.dtype(np.float16)
_SMALL = 256  # at or below this many elements, NumPy's own astype is cheaper


# --- an optional converter from outside core ------------------------------------
# NumPy (2.4) converts float16 <-> float32 one element at a time, and the
# whole-array passes below cost a dozen passes each; a CPU's own conversion
# instructions (F16C, NEON) do it at memory speed. Core cannot reach them with
# NumPy alone, so it takes a converter from outside (everyo-amp installs one
# backed by onnxruntime's Cast, after checking it against NumPy) and keeps its
# own conversions as the fallback. Whatever the converter returns, values that
# float16 cannot hold finitely (|x| >= 65520, inf, NaN) are converted again by
# NumPy, so NaN payloads, overflow warnings and np.errstate stay astype's.
_KERNEL_MIN = 4096  # below this many elements a converter's per-call cost is not worth it
_kernel: Any = None


def set_cast_kernel(kernel: Any) -> Any:
    """Install ``kernel`` as the float32 <-> float16 converter for large
    arrays (``None`` removes it); returns the previous one.

    Arrays of any layout are handed over as 1-D C-contiguous copies.
    ``kernel.down(x)`` takes a 1-D C-contiguous float32 array and returns its
    float16 array, rounded to nearest even bit for bit as ``astype`` rounds
    every finite value below 65520, and giving an inf or NaN code (exponent
    all ones) for every other value, which is then redone here; or ``None``
    to decline (core's own conversion then runs). ``kernel.up(h)`` takes a
    1-D C-contiguous float16 array and returns the exact float32 array (inf
    and NaN codes are redone here), or ``None``. Both must be safe to call
    from any thread. (Rounding a float32 array to float16's values is ``down``
    then ``up`` of the codes just checked.) Where everyo-kernels is active, its
    one-pass conversions come first and the converter is not asked.
    """
    global _kernel
    previous, _kernel = _kernel, kernel
    return previous


def _kernel_input(x, dtype):
    """``(converter, x as a 1-D C-contiguous array)`` when ``x`` is a large
    array of ``dtype`` and a converter is installed, else ``(None, None)``.
    (A strided view, a transpose, costs one copy: still far cheaper.)"""
    kernel = _kernel
    if kernel is None or x.size < _KERNEL_MIN or x.dtype != dtype:
        return None, None
    return kernel, np.ascontiguousarray(x).reshape(-1)


def _special_codes(h):
    """Whether float16 ``h`` holds an inf or NaN code: they are the largest codes of either sign.
    (Checking the 2-byte codes costs a third of checking the float32 input.)"""
    return h.view(np.int16).max() > 0x7BFF or h.view(np.uint16).max() > 0xFBFF


def _redo(result, mask, values):
    """``result[mask] = values`` on the converter's result (a copy if it came back read-only)."""
    if not result.flags.writeable:
        result = result.copy()
    result[mask] = values
    return result


def _kernel_down(x):
    """float16 array of float32 ``x`` by the installed converter, or None."""
    return _kernel_down_checked(x)[0]


# --- everyo-kernels' one-pass conversions ----------------------------------------
# With everyo-kernels active (see :mod:`everyo.kernel_table`), float16 <-> float32
# conversions of more than _SMALL values go through its compiled loops, which are
# preferred over an installed converter: they convert and find the values float16
# cannot hold finitely in the same pass (onnxruntime's Cast needs a second pass over
# the codes for that, and a call costs more), and round to float16's values in one
# pass where a converter needs down, up and the scan. Measured (one thread,
# everyo-kernels 0.1, NumPy 2.4, onnxruntime 1.32, this project's AVX-512 machine):
# 65,536 values down 7.9 us against Cast's 10 + 5.4 for its scan, up 8.4 against
# 10 + 5.4, rounded 7.3 against 25; 524,288 down 61 against 45 + 28. The kernels
# return the largest magnitude's float32 bits: at or above 65520's (or NaN's) the
# values float16 cannot hold finitely are redone by NumPy, as for a converter.
_SPECIAL_BITS = 0x477FF000  # 65520.0's float32 bits: from here on (inf and NaN too) NumPy redoes


def _compiled_half(name, x, dtype, out_dtype):
    """``(everyo-kernels' kernel name's result as an out_dtype array of x's size,
    its return value, x as flat)`` for a ``dtype`` array of more than _SMALL values,
    or ``(None, None, None)`` without the kernel."""
    if x.size <= _SMALL or x.dtype != dtype:
        return None, None, None
    return _compiled_pass(name, x, _bits_of(dtype), out_dtype, _bits_of(out_dtype))


def _bits_of(dtype):
    return _U32 if dtype == _F32 else np.uint16


def _compiled_pass(name, x, in_bits, out_dtype, out_bits):
    """``(everyo-kernels' kernel name's result, a flat out_dtype array, its return value,
    x as flat)``, the kernel given the bits of both as ``in_bits``/``out_bits``; or
    ``(None, None, None)`` without the kernel (see :mod:`everyo.kernel_table`)."""
    fn = kernel_table.get(name)
    if fn is None:
        return None, None, None
    flat = np.ascontiguousarray(x).reshape(-1)
    out = _buffers.empty((flat.size,), out_dtype)  # recycled: a fresh 2 MiB result faults in every page
    returned = fn(flat.view(in_bits), out.view(out_bits))
    return out, returned, flat


def _compiled_down(x):
    """``(float16 array of float32 x, whether x holds a value float16 cannot hold
    finitely)`` by everyo-kernels' ``half_codes``, or ``(None, None)``."""
    h, top, flat = _compiled_half("half_codes", x, _F32, np.float16)
    if h is None:
        return None, None
    special = bool(top >= _SPECIAL_BITS)
    if special:  # inf, NaN, overflow: NumPy's codes, payloads and warnings
        mask = _special_mask(flat)
        h[mask] = flat[mask].astype(np.float16)
    return h.reshape(x.shape), special


def _kernel_down_checked(x):
    """``(float16 array of x, whether it holds an inf or NaN code, the
    converter)`` by everyo-kernels (converter ``None``: see
    :func:`_compiled_down`) or the installed converter, or ``(None, None, None)``."""
    h, special = _compiled_down(x)
    if h is not None:
        return h, special, None
    kernel, flat = _kernel_input(x, _F32)
    h = None if kernel is None else kernel.down(flat)
    if h is None:
        return None, None, None
    special = _special_codes(h)
    if special:  # inf, NaN, overflow: NumPy's codes, payloads and warnings
        mask = _special_mask(flat)
        h = _redo(h, mask, flat[mask].astype(np.float16))
    return h.reshape(x.shape), special, kernel


def _kernel_up(h):
    """float32 array of float16 ``h`` by everyo-kernels' ``half_to_float`` (exact
    for every code) or the installed converter, or None."""
    f, _, _ = _compiled_half("half_to_float", h, _F16, _F32)
    if f is not None:
        return f.reshape(h.shape)
    kernel, flat = _kernel_input(h, _F16)
    if kernel is None:
        return None
    f = kernel.up(flat)
    if f is None:
        return None
    if _special_codes(flat):  # the converter may quiet signalling NaNs; NumPy keeps them
        bad = ~(np.abs(f) < _F32(65536.0))
        f = _redo(f, bad, flat[bad].astype(_F32))
    return f.reshape(h.shape)


def _half_to_float(h):
    """float16 array -> float32 array (exact)."""
    if h.size <= _SMALL:
        return h.astype(np.float32)
    fast = _kernel_up(h)
    if fast is not None:
        return fast
    # Sign-extend the code to 32 bits and shift it up by 13: the sign lands on
    # bit 31 (its copies on bits 28-30 are masked off), the 5-bit exponent and
    # the 10-bit mantissa on float32's exponent and mantissa. Multiplying by
    # 2**112 then rebiases the exponent; for subnormal codes it normalises.
    signed = h.view(np.int16)
    v = signed.astype(np.int32)
    np.left_shift(v, 13, out=v)
    np.bitwise_and(v, np.int32(-0x70002000), out=v)  # keep bits 0x8FFFE000
    f = v.view(_F32)
    np.multiply(f, _F32(2.0**112), out=f)
    # Codes with an all-ones exponent (inf, NaN) come out wrong (as finite
    # values of magnitude >= 65536): hand those to NumPy. They are the largest
    # codes of either sign: above 0x7BFF as int16, above 0xFBFF as uint16.
    if signed.max() > 0x7BFF or h.view(np.uint16).max() > 0xFBFF:
        bad = ~(np.abs(f) < _F32(65536.0))
        f[bad] = h[bad].astype(_F32)
    return f


def _round_magnitude(x):
    """|x| rounded to float16's spacing, as float32; ``x`` flat, contiguous float32.

    The general path (many values below 2**-14). Returns the rounded
    magnitudes and a scratch uint32 array of the same size. Round-to-nearest-
    even is the FPU's own: for |x| in [2**e, 2**(e+1)), (|x| + 2**(e+13)) -
    2**(e+13) keeps 11 significant bits. Below 2**-14 (float16 subnormals) the
    spacing is fixed at 2**-24, which the same trick gives with 2**-1; zero
    and float32 subnormals also round correctly (to zero) with that constant.
    Values that round to inf or are inf/NaN are left to the callers.
    """
    bits = x.view(_U32)
    big = np.bitwise_and(bits, _U32(0x7F800000))  # 2**e, as bits
    np.maximum(big, _U32(113 << 23), out=big)  # at least 2**-14
    np.add(big, _U32(13 << 23), out=big)  # 2**(e+13)
    magic = big.view(_F32)
    a = np.abs(x)
    with np.errstate(over="ignore", invalid="ignore"):  # only for the callers' special values
        np.add(a, magic, out=a)
        np.subtract(a, magic, out=a)
    return a, big


_SPLIT = _F32(2**13 + 1)  # Veltkamp's constant for keeping 24 - 13 = 11 significant bits
_DENSE = 32  # more than 1 value in this many below 2**-14: take the general path


def _round_signed(x):
    """The fast rounding, by Veltkamp's splitting: with g = x * (2**13 + 1),
    g - (g - x) is x rounded to 11 significant bits, ties to even, keeping x's
    sign. That is float16's rounding for every |x| in [2**-14, 65520) of both
    signs (checked against ``astype`` for each such float32; the tests check
    every float16's neighbourhood), and zeros stay zeros of their sign. Below
    2**-14 float16's spacing is absolute, so callers round those few values
    again with NumPy. ``x`` flat, contiguous float32. Returns the rounded
    values and a scratch float32 array."""
    with np.errstate(over="ignore", invalid="ignore"):  # only for values callers fix
        g = np.multiply(x, _SPLIT)
        d = np.subtract(g, x)
        np.subtract(g, d, out=g)  # g - (g - x), not g + (x - g): keeps the sign of a zero
    return g, d


def _has_special(x):
    """Whether ``x`` holds a value float16 cannot hold finitely (|x| >= 65520, inf, NaN)."""
    return not (x.max() < 65520.0 and x.min() > -65520.0)  # NaN compares False too


def _special_mask(x):
    return ~(np.abs(x) < _F32(65520.0))


def _encode(a, x, scratch):
    """float16 codes of ``a``, float32 values already rounded to float16 (signed
    or not), with the signs of ``x``; ``a`` is overwritten, ``scratch`` is a
    4-byte array of a's size."""
    # Rebias: a float16-normal value keeps its mantissa and gets the float16
    # exponent; a float16-subnormal one becomes the float32 subnormal with the
    # same code (see the module docstring).
    with np.errstate(over="ignore", invalid="ignore"):
        np.multiply(a, _F32(2.0**-112), out=a)
    code, sign = a.view(_U32), scratch.view(_U32)
    np.right_shift(x.view(_U32), _U32(16), out=sign)  # the sign, onto bit 15
    np.bitwise_and(sign, _U32(0x8000), out=sign)
    np.right_shift(code, _U32(13), out=code)  # (a signed a's own sign lands on bit 18: dropped below)
    np.bitwise_or(code, sign, out=code)
    return code.astype(np.uint16)


def _fix_special(out, x):
    """Let NumPy convert values that overflow, inf and NaN (rare), so NaN
    payloads and the overflow warning (and any np.errstate in force) are
    exactly astype's."""
    if _has_special(x):
        special = _special_mask(x)
        out[special] = x[special].astype(np.float16).view(np.uint16)
    return out


def _exact_to_half(x):
    """float32 array of float16 values (the max of float16 data, a Rounded's
    values; inf and NaN allowed) -> float16 array: no rounding to do, so only
    the encoding, exact for subnormals and zeros too."""
    if x.size <= _SMALL:
        return x.astype(np.float16)
    fast = _kernel_down(x)
    if fast is not None:
        return fast
    shape = np.shape(x)
    x = np.ascontiguousarray(x, dtype=_F32).reshape(-1)
    out = _encode(x.copy(), x, np.empty(x.size, _U32))
    return _fix_special(out, x).view(np.float16).reshape(shape)


def _small_nonzero(v, scratch):
    """Mask of the values with 0 < |v| < 2**-14 (float16 subnormals, where
    the fast rounding is not float16's); ``scratch``: a 4-byte array of v's size."""
    u = scratch.view(_U32)
    np.left_shift(v.view(_U32), _U32(1), out=u)  # |v|'s bits, doubled
    np.subtract(u, _U32(1), out=u)  # zero wraps to the top
    return np.less(u, _U32((0x38800000 << 1) - 1))


_NONE = np.empty(0, np.intp)


def _few(mask):
    """``flatnonzero(mask)`` when at most one in _DENSE is set, else None:
    counting is several times cheaper than finding, and most arrays have
    either none or many (ReLU and dropout zeros)."""
    n = np.count_nonzero(mask)
    if n * _DENSE > mask.size:
        return None
    return np.flatnonzero(mask) if n else _NONE


_BLOCK = 1 << 16  # elements: 256 KiB of float32, so a block's passes and scratch stay in L2


def _blockwise(kernel: Callable[[FloatArray], Array], out_dtype: Any) -> Callable[[Array], Array]:
    """``kernel`` (float32 array -> array of ``out_dtype``, same size) run over
    L2-sized blocks of a large array. The conversions are a dozen whole-array
    passes each; on a 2 MiB array every pass goes to L3, on a block it stays in
    L2 (NumPy 2.4, this machine: the float16 rounding of 512K small gradients
    3.9 -> 1.3 ms, of ReLU outputs 1.26 -> 0.76 ms). Each block gets the same
    treatment as a whole array would, so the results are the same bits."""

    def run(x: Array) -> Array:
        if x.size <= 2 * _BLOCK:
            return kernel(x)
        shape = np.shape(x)
        flat = np.ascontiguousarray(x, dtype=_F32).reshape(-1)
        out = np.empty(flat.size, out_dtype)
        for start in range(0, flat.size, _BLOCK):
            out[start : start + _BLOCK] = kernel(flat[start : start + _BLOCK])
        return out.reshape(shape)

    run.__doc__ = kernel.__doc__
    run.__name__ = kernel.__name__.removesuffix("_block")
    return run


_SAMPLE = 31  # the stride of the sample _float_to_half looks at
_MIN_NORMAL = _F32(2.0**-14)


def _float_to_half(x):
    """float32 array -> float16 array, bit-identical to ``x.astype(np.float16)``.

    Either way the result is astype's; the choice is only about speed. NumPy's
    own cast is the faster one (NumPy 2.4: about 1.9 ns a value, against
    2-4 ns for the whole-array passes, more on large arrays) as long as few
    values are below float16's normals: a zero costs it several times a normal
    value, a subnormal about forty times (the own path hands the few it finds
    to astype too). So a strided sample (one value in _SAMPLE) decides: at
    most one in _DENSE of it zero, below 2**-14 or NaN, NumPy converts;
    otherwise (ReLU outputs, small gradients) :func:`_float_to_half_own` does.
    """
    if x.size <= _SMALL:
        return x.astype(np.float16)
    fast = _kernel_down(x)
    if fast is not None:
        return fast
    if x.dtype == _F32 and x.flags.c_contiguous:
        sample = x.reshape(-1)[::_SAMPLE]
        # |v| < 2**-14 (zeros included) or NaN: the values NumPy is slow on.
        slow = sample.size - np.count_nonzero(np.abs(sample) >= _MIN_NORMAL)
        if slow * _DENSE <= sample.size:
            return x.astype(np.float16)
    return _float_to_half_own(x)


def _float_to_half_own_block(x):
    """:func:`_float_to_half`'s own path (the whole-array passes described in
    the module docstring), bit-identical to ``astype`` for any input."""
    if x.size <= _SMALL:
        return x.astype(np.float16)
    shape = np.shape(x)
    x = np.ascontiguousarray(x, dtype=_F32).reshape(-1)
    a, scratch = _round_signed(x)
    out = _encode(a, x, scratch)
    # Values below 2**-14, where the fast rounding is not float16's, got codes
    # with a zero exponent (so did zeros, which are right): redo those few.
    small = _few(np.equal(np.bitwise_and(out, np.uint16(0x7C00)), np.uint16(0)))
    if small is None:
        small = _few(_small_nonzero(x, scratch))  # many: leave the zeros out
    if small is None:  # still many: the general path
        a, scratch = _round_magnitude(x)
        out = _encode(a, x, scratch)
    elif small.size:
        out[small] = x[small].astype(np.float16).view(np.uint16)
    return _fix_special(out, x).view(np.float16).reshape(shape)


def _round_to_half_block(x):
    """float32 array -> float32 array of the same values ``x.astype(np.float16)``
    holds (bit for bit, signed zeros, inf and NaN included), without ever
    storing float16: a fraction of the passes of a conversion down and back up."""
    if x.size <= _SMALL:
        return x.astype(np.float16).astype(_F32)
    shape = np.shape(x)
    x = np.ascontiguousarray(x, dtype=_F32).reshape(-1)
    a, scratch = _round_signed(x)
    small = _few(np.less(np.abs(a, out=scratch), _F32(2.0**-14)))  # zeros too (they are right)
    if small is None:
        small = _few(_small_nonzero(a, scratch))  # many: leave the zeros out
    if small is None:  # still many: the general path
        a, scratch = _round_magnitude(x)
        np.bitwise_and(x.view(_U32), _U32(0x80000000), out=scratch)
        np.bitwise_or(a.view(_U32), scratch, out=a.view(_U32))  # x's sign, -0 included
    elif small.size:  # a few: NumPy's own rounding
        a[small] = x[small].astype(np.float16).astype(_F32)
    if _has_special(x):
        special = _special_mask(x)
        a[special] = x[special].astype(np.float16).astype(_F32)
    return a.reshape(shape)


_float_to_half_own = _blockwise(_float_to_half_own_block, np.float16)
_round_to_half_own = _blockwise(_round_to_half_block, _F32)


def _round_to_half(x):
    """float32 array -> float32 array of the same values ``x.astype(np.float16)``
    holds (bit for bit, signed zeros, inf and NaN included): by the installed
    converter down and back up when there is one (the codes coming back up are
    the ones just checked, so the trip up needs no second check), else without
    ever storing float16 (:func:`_round_to_half_block`, in L2-sized blocks).
    With everyo-kernels, its ``round_to_half`` does it in one pass."""
    x = np.asarray(x)
    f, top, flat = _compiled_half("round_to_half", x, _F32, _F32)
    if f is not None:
        if top >= _SPECIAL_BITS:  # inf, NaN, overflow: as NumPy converts them
            mask = _special_mask(flat)
            f[mask] = flat[mask].astype(np.float16).astype(_F32)
        return f.reshape(x.shape)
    h, special, kernel = _kernel_down_checked(x)
    if h is None:
        return _round_to_half_own(x)
    if special or kernel is None:  # NumPy's inf and NaN codes are in h now: bring them up as NumPy would
        return _half_to_float(h)
    f = kernel.up(h.reshape(-1))
    return _half_to_float(h) if f is None else f.reshape(x.shape)


class Rounded:
    """A 16-bit float gradient held as the float32 values it consists of.

    In backward, a float16 (or bfloat16) layer computes its input's gradient
    in float32 and rounds it to the 16-bit type; the next such op (ReLU, then
    the previous layer's matmul) converts it straight back up. Handing over a
    ``Rounded`` instead skips the trip: ``f32`` holds exactly the 16-bit
    values (made by :func:`_round_to_half` or :func:`_round_to_bfloat16`), so
    the numerics are the 16-bit type's, only the storage differs. Autograd
    turns it into a real array of ``dtype`` (exactly, via :meth:`materialize`)
    wherever one is needed: a leaf's or a retained ``.grad``, a sum of two
    gradients, and any backward function not marked with
    :func:`takes_rounded`. This is autograd's dtype-agnostic deferred-gradient
    protocol (``shape``, ``dtype``, ``materialize()``).
    """

    __slots__ = ("f32", "dtype")

    def __init__(self, f32: FloatArray, dtype: np.dtype[Any] = _F16) -> None:
        self.f32 = f32
        self.dtype = dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return self.f32.shape

    def accumulate(self, other: Rounded | Array) -> Rounded:
        """``self + other`` (a Rounded or an array of the same dtype) as a
        Rounded: the float32 sum of two 16-bit values rounded once, which is
        the correctly rounded 16-bit sum, i.e. NumPy's float16 ``a + b``, bit
        for bit, without NumPy's slow float16 loop."""
        total = np.add(self.f32, _up(other))
        return _rounded(total, self.dtype)

    def materialize(self) -> Array:
        """The 16-bit array (exact: the values already are the type's)."""
        if self.dtype == np.float16:
            return _exact_to_half(self.f32)
        return _exact_to_bfloat16(self.f32, self.dtype)


def _rounded(x, dtype=_F16):
    """The 16-bit rounding of float32 ``x``, kept in float32 (see :class:`Rounded`)."""
    if dtype == np.float16:
        return Rounded(_round_to_half(x))
    return Rounded(_round_to_bfloat16(x), dtype)


def _up(g):
    """A 16-bit gradient (array or :class:`Rounded`) as float32 values."""
    if isinstance(g, Rounded):
        return g.f32
    if g.dtype == np.float16:
        return _half_to_float(g)
    return _bfloat16_to_float(g) if is_bfloat16(g.dtype) else g


def _down(x, dtype):
    """float32 array -> 16-bit ``dtype`` (float16 or bfloat16), as ``astype`` rounds."""
    return _float_to_half(x) if dtype == np.float16 else _float_to_bfloat16(x, dtype)


def _exact_down(x, dtype):
    """float32 array of ``dtype``'s values -> ``dtype`` array (no rounding to do)."""
    return _exact_to_half(x) if dtype == np.float16 else _exact_to_bfloat16(x, dtype)


def takes_rounded(fn: F) -> F:
    """Mark a backward function as accepting a :class:`Rounded` gradient
    (autograd's deferred-gradient protocol: ``accepts_deferred``)."""
    fn.accepts_deferred = True  # type: ignore[attr-defined]  # a marker attribute on any callable
    return fn


# --- bfloat16 -------------------------------------------------------------------
# bfloat16 is float32 with the low 16 mantissa bits dropped: same sign and
# exponent fields, 8 significant bits. Up is a shift; down is round-to-
# nearest-even on the uint32 bits. ml_dtypes turns every NaN into the quiet
# NaN 0x7FC0 with the input's sign (payload dropped); so do these.


# Type names NumPy learns only when ml_dtypes is imported (it registers them).
_ML_DTYPES_NAMES = frozenset({"bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"})


def as_dtype(dtype: Any) -> np.dtype[Any]:
    """``np.dtype(dtype)``, importing ml_dtypes at this point for the names only it
    defines (``"bfloat16"``), so they work in a fresh process and core never imports
    it at start-up.

    Raises:
        EveryODTypeError: such a name without ml_dtypes installed (the message
            names ``pip install ml_dtypes`` / ``everyo-core[amp]``).
    """
    if isinstance(dtype, str) and dtype in _ML_DTYPES_NAMES:
        try:
            import ml_dtypes
        except ImportError:
            from everyo.errors import EveryODTypeError

            raise EveryODTypeError(
                f"dtype {dtype!r} comes from the ml_dtypes package, which is not installed: "
                "pip install ml_dtypes (or pip install everyo-core[amp], which brings it)"
            ) from None
        return np.dtype(getattr(ml_dtypes, dtype))
    return np.dtype(dtype)


def is_bfloat16(dtype: np.dtype[Any]) -> bool:
    """Whether ``dtype`` is ml_dtypes' bfloat16 (recognised without importing ml_dtypes)."""
    return dtype.kind == "V" and dtype.itemsize == 2 and dtype.name == "bfloat16"


def is_low_precision(dtype: np.dtype[Any]) -> bool:
    """float16 or bfloat16: the 16-bit floats that ops compute in float32."""
    return dtype == np.float16 or is_bfloat16(dtype)


def _compiled(name, x, in_dtype, out_dtype):
    """``x``'s conversion by the everyo-kernels kernel ``name`` (one pass over the
    bits as ``in_dtype``, into an ``out_dtype`` array of x's shape), or None
    without it (see :mod:`everyo.kernel_table`)."""
    out, _, _ = _compiled_pass(name, x, in_dtype, out_dtype, out_dtype)
    return None if out is None else out.reshape(np.shape(x))


def _bfloat16_to_float(b):
    """bfloat16 array -> float32 array (exact, NaN payloads included)."""
    done = _compiled("bfloat16_to_float", b, np.uint16, _U32)
    if done is not None:
        return done.view(_F32)
    u = b.view(np.uint16).astype(_U32)
    np.left_shift(u, _U32(16), out=u)
    return u.view(_F32)


def _rne_bits(x):
    """float32 bits rounded to nearest even at bit 16 (the low 16 bits are
    garbage the callers drop), NaNs made quiet 0x7FC0xxxx with their sign."""
    x = np.ascontiguousarray(x, dtype=_F32)
    bits = x.view(_U32)
    r = np.right_shift(bits, _U32(16))
    np.bitwise_and(r, _U32(1), out=r)  # the lowest kept bit: a tie goes to even
    np.add(r, _U32(0x7FFF), out=r)
    np.add(r, bits, out=r)  # the carry rounds up (the largest finites carry into inf, as they should)
    if x.size and np.isnan(x.max()):  # max propagates NaN: one reduction finds any
        nan = np.isnan(x)
        r[nan] = np.bitwise_or(np.bitwise_and(bits[nan], _U32(0x80000000)), _U32(0x7FC00000))
    return r


def _bfloat16_codes_block(x):
    """float32 array -> its bfloat16 codes (uint16), rounded as ``astype`` rounds."""
    shape = np.shape(x)
    r = _rne_bits(x)
    np.right_shift(r, _U32(16), out=r)
    return r.astype(np.uint16).reshape(shape)


_bfloat16_codes_numpy = _blockwise(_bfloat16_codes_block, np.uint16)


def _bfloat16_codes(x):
    """float32 array -> its bfloat16 codes (uint16), rounded as ``astype`` rounds."""
    done = _compiled("bfloat16_codes", np.asarray(x, dtype=_F32), _U32, np.uint16)
    return done if done is not None else _bfloat16_codes_numpy(x)


def _float_to_bfloat16(x, dtype):
    """float32 array -> ``dtype`` (bfloat16) array, bit-identical to ``x.astype(dtype)``."""
    return _bfloat16_codes(x).view(dtype)


def _round_to_bfloat16_block(x):
    """float32 array -> float32 array of the values ``x.astype(bfloat16)`` holds."""
    shape = np.shape(x)
    r = _rne_bits(x)
    np.bitwise_and(r, _U32(0xFFFF0000), out=r)
    return r.view(_F32).reshape(shape)


_round_to_bfloat16_numpy = _blockwise(_round_to_bfloat16_block, _F32)


def _round_to_bfloat16(x):
    """float32 array -> float32 array of the values ``x.astype(bfloat16)`` holds."""
    done = _compiled("round_to_bfloat16", np.asarray(x, dtype=_F32), _U32, _U32)
    return done.view(_F32) if done is not None else _round_to_bfloat16_numpy(x)


def _exact_to_bfloat16(x, dtype):
    """float32 array of bfloat16 values (low 16 bits zero) -> bfloat16 array."""
    shape = np.shape(x)
    bits = np.ascontiguousarray(x, dtype=_F32).view(_U32)
    return np.right_shift(bits, _U32(16)).astype(np.uint16).view(dtype).reshape(shape)
