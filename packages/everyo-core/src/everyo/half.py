"""float16 <-> float32 conversions: exact (bit-identical to ``astype``) and fast.

NumPy converts float16 one element at a time (~2.5 ns per value down, 1.6 ns
up) and ~40x slower still when values are float16 subnormals, which is
exactly where small gradients live. These give bit-identical results to
``astype`` with a handful of whole-array integer and float passes that NumPy
runs with SIMD. Used by the float16 paths of matmul, linear, conv2d and the
differentiable cast.

Both directions lean on one fact: multiplying by a power of two is exact, as
long as the result is a float32 normal or subnormal number. Scaling by
``2**-112`` (or ``2**112``) moves a value between float32's exponent bias and
float16's, and a float16 subnormal lands exactly on a float32 subnormal whose
bit pattern, shifted by 13, is the float16 code.
"""
import numpy as np

_U32 = np.uint32
_F32 = np.float32
_SMALL = 256  # at or below this many elements, NumPy's own astype is cheaper


def _half_to_float(h):
    """float16 array -> float32 array (exact)."""
    if h.size <= _SMALL:
        return h.astype(np.float32)
    # Sign-extend the code to 32 bits and shift it up by 13: the sign lands on
    # bit 31 (its copies on bits 28-30 are masked off), the 5-bit exponent and
    # the 10-bit mantissa on float32's exponent and mantissa. Multiplying by
    # 2**112 then rebiases the exponent; for subnormal codes it normalises.
    v = h.view(np.int16).astype(np.int32)
    np.left_shift(v, 13, out=v)
    np.bitwise_and(v, np.int32(-0x70002000), out=v)  # keep bits 0x8FFFE000
    f = v.view(_F32)
    np.multiply(f, _F32(2.0**112), out=f)
    # Codes with an all-ones exponent (inf, NaN) come out as finite values of
    # magnitude >= 65536, which no finite float16 reaches: hand those to NumPy.
    if not (f.max() < 65536.0 and f.min() > -65536.0):
        bad = ~(np.abs(f) < _F32(65536.0))
        f[bad] = h[bad].astype(_F32)
    return f


def _float_to_half(x):
    """float32 array -> float16 array, bit-identical to ``x.astype(np.float16)``."""
    if x.size <= _SMALL:
        return x.astype(np.float16)
    shape = np.shape(x)
    x = np.ascontiguousarray(x, dtype=_F32).reshape(-1)
    bits = x.view(_U32)
    # Round |x| to float16's spacing with the FPU's own round-to-nearest-even:
    # for |x| in [2**e, 2**(e+1)), (|x| + 2**(e+13)) - 2**(e+13) keeps 11
    # significant bits. Below 2**-14 (float16 subnormals) the spacing is fixed
    # at 2**-24, which the same trick gives with 2**-1; zero and float32
    # subnormals also round correctly (to zero) with that constant.
    big = np.bitwise_and(bits, _U32(0x7F800000))  # 2**e, as bits
    np.subtract(big, _U32(1 << 23), out=big)  # a zero exponent wraps to the top...
    tiny = big.min() < _U32(112 << 23)  # ...so this asks: any 0 < |x| < 2**-14?
    np.add(big, _U32(14 << 23), out=big)  # 2**(e+13)
    if tiny:
        low = np.less(big, _U32(126 << 23))
        if np.count_nonzero(low) * 32 < low.size:  # a few: a masked copy is cheapest
            np.copyto(big, _U32(126 << 23), where=low)
        else:
            np.maximum(big, _U32(126 << 23), out=big)
    magic = big.view(_F32)
    a = np.abs(x)
    with np.errstate(over="ignore", invalid="ignore"):  # only for inputs fixed below
        np.add(a, magic, out=a)
        np.subtract(a, magic, out=a)
        # Rebias: a float16-normal value keeps its mantissa and gets the
        # float16 exponent; a float16-subnormal one becomes the float32
        # subnormal with the same code (see the module docstring).
        np.multiply(a, _F32(2.0**-112), out=a)
    code = a.view(_U32)
    np.right_shift(code, _U32(13), out=code)
    np.right_shift(bits, _U32(16), out=big)  # the sign, onto bit 15
    np.bitwise_and(big, _U32(0x8000), out=big)
    np.bitwise_or(code, big, out=code)
    out = code.astype(np.uint16)
    # |x| >= 65520 rounds to inf; inf and NaN need NumPy's own rules. Rare:
    # let NumPy convert these few, so NaN payloads and the overflow warning
    # (and any np.errstate in force) are exactly astype's.
    if not (x.max() < 65520.0 and x.min() > -65520.0):  # NaN compares False too
        special = ~(np.abs(x) < _F32(65520.0))
        out[special] = x[special].astype(np.float16).view(np.uint16)
    return out.view(np.float16).reshape(shape)


def _convert(arr, dtype):
    """``arr.astype(dtype)`` with the fast exact paths between float16 and float32."""
    if arr.dtype == np.float16 and dtype == np.float32:
        return _half_to_float(arr)
    if arr.dtype == np.float32 and dtype == np.float16:
        return _float_to_half(arr)
    return arr.astype(dtype)
