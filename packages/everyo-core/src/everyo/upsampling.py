"""Spatial up-sampling of NHWC tensors by integer factors: nearest and bilinear.

Bilinear interpolation is separable: one (OH, H) matrix along the rows and
one (OW, W) along the columns, each row holding the two interpolation weights
of one output position. Forward is two batched matmuls; backward is the same
with the matrices transposed. The weights follow PyTorch's ``interpolate`` and
Keras's ``UpSampling2D`` (TensorFlow's ``resize`` with half-pixel centres):

* ``align_corners=False`` (the default, both frameworks'): output pixel ``p``
  samples input coordinate ``(p + 0.5) / scale - 0.5``, clamped at 0.
* ``align_corners=True``: ``p * (H - 1) / (OH - 1)``; corner pixels coincide.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from everyo import _blas
from everyo.dispatch import primitive
from everyo.errors import EveryOShapeError
from everyo.functional import _t
from everyo.half import _float_to_half, _half_to_float
from everyo.tensor import Tensor

if TYPE_CHECKING:
    from collections.abc import Sequence

    from everyo._typing import Array, TensorLike

__all__ = ["upsample2d", "interpolation_matrix"]


def interpolation_matrix(size: int, scale: int, align_corners: bool = False) -> Array:
    """The (size * scale, size) float64 matrix of linear-interpolation weights."""
    out = size * scale
    p = np.arange(out, dtype=np.float64)
    if align_corners:
        src = p * ((size - 1) / (out - 1)) if out > 1 else np.zeros(out)
    else:
        src = np.maximum((p + 0.5) / scale - 0.5, 0.0)
    lo = np.minimum(np.floor(src).astype(np.int64), size - 1)
    hi = np.minimum(lo + 1, size - 1)
    frac = src - lo
    m = np.zeros((out, size))
    np.add.at(m, (np.arange(out), lo), 1.0 - frac)
    np.add.at(m, (np.arange(out), hi), frac)
    return m


def _resolve(inputs, attrs):
    size = attrs["size"]
    attrs.update(size=(size, size) if isinstance(size, int) else tuple(size))
    return attrs


@primitive("upsample2d", kind="resize", resolve=_resolve)
def upsample2d(
    x: TensorLike, size: int | Sequence[int] = 2, interpolation: str = "nearest", align_corners: bool = False
) -> Tensor:
    """Repeat (``'nearest'``) or interpolate (``'bilinear'``) by integer factors.

    Args:
        x: (N, H, W, C).
        size: int or (sh, sw) factors.
        interpolation: ``'nearest'`` or ``'bilinear'``.
        align_corners: bilinear only; see the module docstring.

    Shape:
        (N, H, W, C) -> (N, H * sh, W * sw, C).

    Examples:
        >>> eo.upsample2d(eo.ones(1, 2, 3, 4), (2, 3)).shape
        (1, 4, 9, 4)
    """
    x = _t(x)
    xd = x.data
    if xd.ndim != 4:
        raise EveryOShapeError(f"upsample2d: expected an NHWC input of rank 4, got shape {xd.shape}")
    sh, sw = (size, size) if isinstance(size, int) else tuple(size)
    if interpolation == "nearest":
        return _nearest(x, sh, sw)
    if interpolation == "bilinear":
        return _bilinear(x, sh, sw, align_corners)
    raise ValueError(f"upsample2d: interpolation must be 'nearest' or 'bilinear', got {interpolation!r}")


def _nearest(x, sh, sw):
    xd = x.data
    n, h, w, c = xd.shape
    out = np.broadcast_to(xd[:, :, None, :, None, :], (n, h, sh, w, sw, c)).reshape(n, h * sh, w * sw, c)

    def backward(g):
        # Each input pixel's gradient is the sum over its sh x sw copies;
        # float16 is summed in float32 and rounded once.
        acc = np.float32 if g.dtype == np.float16 else None
        total = g.reshape(n, h, sh, w, sw, c).sum(axis=(2, 4), dtype=acc)
        return (_float_to_half(total) if g.dtype == np.float16 else total,)

    return Tensor._from_op(out, (x,), backward)


def _bilinear(x, sh, sw, align_corners):
    xd = x.data
    n, h, w, c = xd.shape
    half = xd.dtype == np.float16
    dtype = np.float32 if half else xd.dtype
    ah = interpolation_matrix(h, sh, align_corners).astype(dtype)
    aw = interpolation_matrix(w, sw, align_corners).astype(dtype)
    src = _half_to_float(xd) if half else xd
    rows = _blas.matmul(ah, src.reshape(n, h, w * c))  # (n, OH, w*c)
    out = _blas.matmul(aw, rows.reshape(n * h * sh, w, c)).reshape(n, h * sh, w * sw, c)

    def backward(g):
        g = _half_to_float(g) if g.dtype == np.float16 else g
        gr = _blas.matmul(aw.T, g.reshape(n * h * sh, w * sw, c))  # (n*OH, w, c)
        gx = _blas.matmul(ah.T, gr.reshape(n, h * sh, w * c)).reshape(n, h, w, c)
        return (_float_to_half(gx) if half else gx,)

    return Tensor._from_op(_float_to_half(out) if half else out, (x,), backward)
