"""float16 <-> float32 conversions: exact (bit-identical to ``astype``) and fast.

NumPy converts float16 one element at a time (~2.5 ns per value down, 1.6 ns
up) and ~40x slower still when values are float16 subnormals, which is
exactly where small gradients live. These give bit-identical results to
``astype`` at a constant, lower cost: a 65536-entry table for the way up, and
round-to-nearest-even on the float32 bit pattern for the way down. Used by
the float16 paths of matmul, linear, conv2d and the differentiable cast.
"""
import numpy as np

_HALF_TO_FLOAT = None  # built on first use: nothing heavy at import time
_CHUNK = 1 << 16  # elements per pass of the conversion: stays in cache


def _half_to_float(h):
    """float16 array -> float32 array (exact, by table lookup)."""
    global _HALF_TO_FLOAT
    if _HALF_TO_FLOAT is None:
        codes = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
        _HALF_TO_FLOAT = codes.view(np.float16).astype(np.float32)
    # mode="wrap" skips the bounds check (~2x faster); a uint16 code is
    # always a valid index into the 65536 entries, so nothing ever wraps.
    return np.take(_HALF_TO_FLOAT, h.view(np.uint16).reshape(-1), mode="wrap").reshape(h.shape)


def _float_to_half(x):
    """float32 array -> float16 array, bit-identical to ``x.astype(np.float16)``."""
    if x.size <= 256:
        return x.astype(np.float16)  # too small for the passes below to pay off
    shape = np.shape(x)
    x = np.ascontiguousarray(x, dtype=np.float32)
    bits = x.reshape(-1).view(np.uint32)
    out = np.empty(bits.size, np.uint16)
    u32 = np.uint32
    k = min(_CHUNK, bits.size)
    sign, mag, res, tmp, sel = (np.empty(k, u32) for _ in range(5))
    mask = np.empty(k, bool)
    special = False
    with np.errstate(invalid="ignore"):
        for start in range(0, bits.size, _CHUNK):
            u = bits[start:start + _CHUNK]
            n = u.size
            s, m, r, t, c, b = sign[:n], mag[:n], res[:n], tmp[:n], sel[:n], mask[:n]
            np.bitwise_and(u, u32(0x80000000), out=s)
            np.bitwise_xor(u, s, out=m)  # bits of |x|
            # Normal results: add 0xfff plus the lowest kept mantissa bit (ties
            # to even), drop 13 mantissa bits, rebias the exponent by -112.
            np.right_shift(m, u32(13), out=r)
            np.bitwise_and(r, u32(1), out=r)
            np.add(r, m, out=r)
            np.add(r, u32(0xC8000FFF), out=r)
            np.right_shift(r, u32(13), out=r)
            # Subnormal results (|x| < 2**-14): the FPU rounds |x| + 0.5 to a
            # multiple of 2**-24, whose low mantissa bits are the float16 code.
            np.less(m, u32(113 << 23), out=b)
            count = np.count_nonzero(b)
            if count:
                np.add(m.view(np.float32), np.float32(0.5), out=t.view(np.float32))
                np.subtract(t, u32(126 << 23), out=t)
            if count and count < n // 32:
                np.copyto(r, t, where=b)  # a few: a masked copy is cheapest
            elif count:
                # many (small gradients): r ^= (r ^ t) & -b, no per-element branch
                np.bitwise_xor(t, r, out=t)
                np.multiply(b, u32(0xFFFFFFFF), out=c)
                np.bitwise_and(t, c, out=t)
                np.bitwise_xor(r, t, out=r)
            # |x| >= 65520 rounds to inf; inf and NaN need NumPy's own rules.
            np.greater_equal(m, u32(0x477FF000), out=b)
            special = special or bool(b.any())
            np.right_shift(s, u32(16), out=s)
            np.bitwise_or(r, s, out=r)
            np.copyto(out[start:start + n], r, casting="unsafe")
    if special:
        # Rare: let NumPy convert these few, so NaN payloads and the overflow
        # warning (and any np.errstate in force) are exactly astype's.
        flat = x.reshape(-1)
        big = ~(np.abs(flat) < np.float32(65520.0))
        out[big] = flat[big].astype(np.float16).view(np.uint16)
    return out.view(np.float16).reshape(shape)


def _convert(arr, dtype):
    """``arr.astype(dtype)`` with the fast exact paths between float16 and float32."""
    if arr.dtype == np.float16 and dtype == np.float32:
        return _half_to_float(arr)
    if arr.dtype == np.float32 and dtype == np.float16:
        return _float_to_half(arr)
    return arr.astype(dtype)
