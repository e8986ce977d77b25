"""max_pool2d in one pass each way (core's ``everyo.conv.max_pool2d``, 'valid'
padding, windows that do not overlap: stride >= pool size in both directions).

- :func:`max_pool_forward`: the maximum of each window. NumPy reduces the
  window view offset by offset (``kh * kw`` passes over the output, each
  reading one strided slice of the input); here each output row is built
  while it stays in cache, the input read once.
- :func:`max_pool_backward`: the input gradient. NumPy compares every offset's
  slice with the output, keeps a "taken" mask and multiplies ``g`` by the hit
  mask into each offset's strided slice (about five passes per offset, plus
  a zero fill where the windows leave cells out); here every input-gradient
  value is written once. The maxima are found again from the input: no index
  array is stored.

Both are **bit-identical** to the NumPy path:

- forward: ``acc = acc if (acc > v or acc != acc) else v`` over the window in
  row-major order is ``np.maximum(acc, v)`` exactly: a NaN (either side)
  propagates, and on a tie the second operand is returned, which decides
  between -0.0 and +0.0 (``np.maximum(-0.0, 0.0)`` is +0.0 and
  ``np.maximum(0.0, -0.0)`` is -0.0, on every NumPy loop; the tests check it).
- backward: the first position in row-major window order that equals the
  maximum (or, in a window that pooled to NaN, the first NaN) gets
  ``g * 1.0``, every other position of the window ``g * 0.0`` (NumPy's
  ``np.multiply(g, hit)``: -0.0 for a negative ``g``, NaN for an infinite or
  NaN one), and cells outside every window (the rows and columns 'valid'
  drops, the gaps of a stride larger than the pool) +0.0.
"""

from __future__ import annotations

import numpy as np
from numba import uint64

from everyo.kernels._jit import kernel

__all__ = ["max_pool_forward", "max_pool_backward"]


@kernel
def max_pool_forward(x, out, kh, kw, sh, sw):
    """``out[b, oy, ox, c]`` = the ``np.maximum`` fold over the window
    ``x[b, oy*sh : oy*sh + kh, ox*sw : ox*sw + kw, c]`` in row-major order;
    ``x`` C-contiguous (N, H, W, C), ``out`` C-contiguous (N, OH, OW, C)."""
    n, h, w, c = x.shape
    oh, ow = out.shape[1], out.shape[2]
    xf, of = x.reshape(-1), out.reshape(-1)
    uc = uint64(c)
    for b in range(n):
        for oy in range(oh):
            orow = uint64((b * oh + oy) * ow * c)
            for i in range(kh):
                xrow = (b * h + oy * sh + i) * w
                for j in range(kw):
                    for ox in range(ow):
                        d = orow + uint64(ox) * uc
                        s = uint64((xrow + ox * sw + j) * c)
                        if i == 0 and j == 0:
                            for ch in range(uc):
                                of[d + ch] = xf[s + ch]
                        else:
                            for ch in range(uc):
                                a = of[d + ch]
                                v = xf[s + ch]
                                of[d + ch] = a if (a > v or a != a) else v


@kernel
def max_pool_backward(x, out, g, gx, kh, kw, sh, sw):
    """``gx``: ``g`` at the first position of each window (row-major) holding
    its maximum ``out`` (the first NaN where ``out`` is NaN), ``g * 0.0`` at
    the window's other positions, +0.0 outside every window; ``x``, ``gx``
    C-contiguous (N, H, W, C), ``out``, ``g`` C-contiguous (N, OH, OW, C);
    every value of ``gx`` written."""
    n, h, w, c = x.shape
    oh, ow = out.shape[1], out.shape[2]
    xf, of, gf, df = x.reshape(-1), out.reshape(-1), g.reshape(-1), gx.reshape(-1)
    uc = uint64(c)
    zero = gx.dtype.type(0)
    one = gx.dtype.type(1)
    taken = np.empty(ow * c, np.uint8)  # bytes and bitwise ops: LLVM vectorises the channel loop (2x, measured)
    for b in range(n):
        for y in range(oh * sh, h):  # the bottom rows 'valid' drops
            for d in range(uint64((b * h + y) * w * c), uint64((b * h + y + 1) * w * c)):
                df[d] = zero
        for oy in range(oh):
            orow = uint64((b * oh + oy) * ow * c)
            for k in range(ow * c):
                taken[k] = 0
            for i in range(min(sh, h - oy * sh)):
                y = oy * sh + i
                drow = (b * h + y) * w
                if i >= kh:  # a gap row between windows
                    for d in range(uint64(drow * c), uint64((drow + w) * c)):
                        df[d] = zero
                    continue
                for ox in range(ow):
                    t = uint64(ox) * uc
                    o = orow + t
                    for j in range(min(sw, w - ox * sw)):
                        d = uint64((drow + ox * sw + j) * c)
                        if j >= kw:  # a gap column
                            for ch in range(uc):
                                df[d + ch] = zero
                            continue
                        for ch in range(uc):
                            best = of[o + ch]
                            v = xf[d + ch]
                            free = taken[t + ch] == 0
                            hit = free & ((v == best) | ((best != best) & (v != v)))
                            taken[t + ch] = taken[t + ch] | np.uint8(hit)
                            df[d + ch] = gf[o + ch] * (one if hit else zero)
                for d in range(uint64((drow + ow * sw) * c), uint64((drow + w) * c)):
                    df[d] = zero  # the right columns 'valid' drops
