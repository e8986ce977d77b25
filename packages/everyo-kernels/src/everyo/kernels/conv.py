"""conv2d's data movement in one pass each (core's ``everyo.conv``, ``groups == 1``).

- :func:`im2col`: the columns ``_patches(_pad(x)).reshape(N * OH * OW, kh * kw * C)``
  read straight from the unpadded NHWC input, a zero written for every tap that
  falls in the padding. NumPy pads a copy of the input first (a fill and a
  copy), then copies the strided patch view into new columns in runs of ``C``
  values; here each (image, output row) block of columns is written in one go.
- :func:`col2im`: the input gradient ``_scatter_windows(gcols, ...)`` (the
  adjoint of the columns), one image at a time. NumPy zero-fills the whole
  gradient (or copies the tap that covers it all) and then adds each other of
  the ``kh * kw`` taps as a strided slice, a pass over the whole gradient and
  the columns each; here the same adds run image by image, so the image's
  gradient stays in cache while its columns stream through once.

Both are **bit-identical** to the NumPy path: :func:`im2col` only copies
values (and writes +0.0 where ``_pad`` pads with +0.0); :func:`col2im` does
NumPy's adds in NumPy's order: it starts from the tap that covers the whole
input (``(fi, fj)``, the one ``_scatter_windows`` copies instead of
zero-filling; ``(-1, -1)`` when there is none, and then from +0.0), then adds
the other taps in (row, column) order, one IEEE add each.

Indices are unsigned (``uint64``) in the inner loops: numba wraps a negative
signed index around, and that check kept LLVM from vectorising the copies
(4-5x slower, measured).
"""

from __future__ import annotations

import numpy as np
from numba import uint64

from everyo.kernels._jit import kernel

__all__ = ["im2col", "col2im"]


@kernel
def _spans(kernel_n, dilation, stride, out_n, pad, size):
    """For each kernel offset k: the outputs ``lo[k] <= o < hi[k]`` whose tap
    ``o * stride + k * dilation - pad`` lands in ``[0, size)`` (core's ``_tap_span``)."""
    lo = np.empty(kernel_n, np.int64)
    hi = np.empty(kernel_n, np.int64)
    for k in range(kernel_n):
        offset = k * dilation
        lo[k] = max(0, -((offset - pad) // stride))
        hi[k] = max(lo[k], min(out_n, (size - 1 + pad - offset) // stride + 1))
    return lo, hi


@kernel
def im2col(x, cols, kh, kw, sh, sw, dh, dw, top, left, oh, ow):
    """``cols[(b, oy, ox), (i, j, c)] = x[b, oy*sh + i*dh - top, ox*sw + j*dw - left, c]``,
    +0.0 outside ``x``; ``x`` C-contiguous (N, H, W, C), ``cols`` C-contiguous
    (N * oh * ow, kh * kw * C)."""
    n, h, w, c = x.shape
    xf, cf = x.reshape(-1), cols.reshape(-1)
    zero = x.dtype.type(0)
    uc = uint64(c)
    width = kh * kw * c
    xlo, xhi = _spans(kw, dw, sw, ow, left, w)
    if c < 8:
        # Few channels (a first layer): tap by tap along each output row, so the
        # bounds are tested once a row, not once a value.
        for b in range(n):
            for oy in range(oh):
                row0 = (b * oh + oy) * ow
                for i in range(kh):
                    y = oy * sh + i * dh - top
                    inside = 0 <= y < h
                    src_row = (b * h + y) * w
                    for j in range(kw):
                        k = (i * kw + j) * c
                        lo, hi = (xlo[j], xhi[j]) if inside else (ow, ow)
                        for ox in range(lo):
                            d = uint64((row0 + ox) * width + k)
                            for ch in range(uc):
                                cf[d + ch] = zero
                        for ox in range(lo, hi):
                            d = uint64((row0 + ox) * width + k)
                            s = uint64((src_row + ox * sw + j * dw - left) * c)
                            for ch in range(uc):
                                cf[d + ch] = xf[s + ch]
                        for ox in range(hi, ow):
                            d = uint64((row0 + ox) * width + k)
                            for ch in range(uc):
                                cf[d + ch] = zero
        return
    # Runs of C values: the columns are written in order, one run per tap.
    d = uint64(0)
    for b in range(n):
        for oy in range(oh):
            for ox in range(ow):
                for i in range(kh):
                    y = oy * sh + i * dh - top
                    inside = 0 <= y < h
                    src_row = (b * h + y) * w
                    for j in range(kw):
                        if inside and xlo[j] <= ox < xhi[j]:
                            s = uint64((src_row + ox * sw + j * dw - left) * c)
                            for ch in range(uc):
                                cf[d + ch] = xf[s + ch]
                        else:
                            for ch in range(uc):
                                cf[d + ch] = zero
                        d += uc


@kernel
def col2im(gcols, gx, kh, kw, sh, sw, dh, dw, top, left, oh, ow, fi, fj):
    """``gx[b, y, x, c]``: the sum of the ``gcols`` entries :func:`im2col` fills
    from ``x[b, y, x, c]``, tap ``(fi, fj)`` first (when ``fi >= 0``; it must
    read every pixel), then the others in (i, j) order; ``gcols``
    C-contiguous (N * oh * ow, kh * kw * C), ``gx`` C-contiguous (N, H, W, C),
    every value written."""
    n, h, w, c = gx.shape
    gf, cf = gx.reshape(-1), gcols.reshape(-1)
    zero = gx.dtype.type(0)
    uc = uint64(c)
    width = kh * kw * c
    ylo, yhi = _spans(kh, dh, sh, oh, top, h)
    xlo, xhi = _spans(kw, dw, sw, ow, left, w)
    for b in range(n):
        if fi < 0:
            for d in range(uint64(b * h * w * c), uint64((b + 1) * h * w * c)):
                gf[d] = zero
        for q in range(-1, kh * kw):
            if q < 0:
                if fi < 0:
                    continue
                i, j = fi, fj
            else:
                i, j = q // kw, q % kw
                if i == fi and j == fj:
                    continue
            k = (i * kw + j) * c
            for oy in range(ylo[i], yhi[i]):
                dst_row = (b * h + oy * sh + i * dh - top) * w
                src_row = (b * oh + oy) * ow
                for ox in range(xlo[j], xhi[j]):
                    d = uint64((dst_row + ox * sw + j * dw - left) * c)
                    s = uint64((src_row + ox) * width + k)
                    if q < 0:
                        for ch in range(uc):
                            gf[d + ch] = cf[s + ch]
                    else:
                        for ch in range(uc):
                            gf[d + ch] = gf[d + ch] + cf[s + ch]
