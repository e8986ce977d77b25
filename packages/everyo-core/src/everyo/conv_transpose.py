"""Transposed 2-D convolution on NHWC tensors (the adjoint of :func:`conv2d`).

Each input pixel is multiplied by the kernel and the ``kh * kw`` results are
added into the output at ``stride`` spacing: one BLAS matmul, then the same
scatter (a loop over kernel offsets) that conv2d's backward uses. Its backward
is conv2d's forward: a window view of the output gradient and one matmul.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from everyo.conv import _scatter_windows, _windows
from everyo.dispatch import LOW_PRECISION, primitive
from everyo.errors import EveryOShapeError
from everyo.functional import _mm, _sum_leading, _t
from everyo.half import _float_to_half, _half_to_float, _rounded, _up, takes_rounded
from everyo.padding import _pair, same_padding_1d
from everyo.tensor import Tensor

if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any, TypeAlias

    from everyo._typing import TensorLike
    from everyo.padding import Padding2d

    _Pair: TypeAlias = tuple[int, int]

__all__ = ["conv_transpose2d", "conv_transpose2d_geometry"]


def conv_transpose2d_geometry(
    in_hw: Sequence[int],
    kernel: int | Sequence[int],
    stride: int | Sequence[int] = 1,
    padding: Padding2d = "valid",
    output_padding: int | Sequence[int] = 0,
    dilation: int | Sequence[int] = 1,
) -> tuple[_Pair, _Pair, _Pair, tuple[tuple[int, ...], ...], tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """Explicit crops ``((top, bottom), (left, right))`` and the output size.

    ``padding``: ``'valid'`` (nothing cropped: output ``(H - 1) * stride +
    dilation * (k - 1) + 1``), ``'same'`` (Keras's rule: output ``H * stride``,
    the transpose of a 'same' conv2d on that size), or numbers with PyTorch's
    meaning (rows cropped from each side: an int, (ph, pw), or explicit pairs).
    ``output_padding`` adds rows/columns at the bottom/right (PyTorch's, to pick
    among the input sizes a strided conv2d maps to the same output size).
    """
    kernel, stride, dilation = _pair(kernel, "kernel_size"), _pair(stride, "stride"), _pair(dilation, "dilation")
    extra: tuple[int, ...] = _pair(output_padding, "output_padding")
    crops: tuple[tuple[int, ...], ...]
    span = tuple(d * (k - 1) + 1 for k, d in zip(kernel, dilation))
    full = tuple((n - 1) * s + sp for n, s, sp in zip(in_hw, stride, span))
    if isinstance(padding, str):
        mode = padding.lower()
        if mode == "valid":
            crops = ((0, 0), (0, 0))
        elif mode == "same":
            # The transpose of conv2d 'same' on an input of H * stride rows:
            # its pads are what this op crops; when the window is narrower
            # than the stride the missing rows at the end are zeros.
            crops = tuple(same_padding_1d(n * s, sp, s) for n, s, sp in zip(in_hw, stride, span))
            extra = tuple(e + max(s - sp, 0) for e, s, sp in zip(extra, stride, span))
        else:
            raise ValueError(f"conv_transpose2d: padding must be 'valid', 'same' or numbers, got {padding!r}")
    elif isinstance(padding, int):
        crops = ((padding, padding), (padding, padding))
    else:
        pads: tuple[Any, ...] = tuple(padding)
        if all(isinstance(p, int) for p in pads):
            crops = ((pads[0], pads[0]), (pads[1], pads[1]))
        else:
            crops = tuple(tuple(int(v) for v in p) for p in pads)
    out_hw = tuple(f - c[0] - c[1] + e for f, c, e in zip(full, crops, extra))
    return kernel, stride, dilation, crops, extra, full, out_hw


def _resolve(inputs, attrs):
    # The tracer gets explicit crops ((top, bottom), (left, right)) and the
    # output_padding actually added (Keras's 'same' may add rows at the end).
    x, weight = inputs[0], inputs[1]
    kernel, stride, dilation, crops, extra, _, _ = conv_transpose2d_geometry(
        x.data.shape[1:3],
        weight.data.shape[:2],
        attrs["stride"],
        attrs["padding"],
        attrs["output_padding"],
        attrs["dilation"],
    )
    attrs.update(kernel_size=kernel, stride=stride, dilation=dilation, pads=crops, output_padding=extra)
    return attrs


@primitive("conv_transpose2d", LOW_PRECISION, kind="conv", inputs=("x", "weight", "bias"), resolve=_resolve)
def conv_transpose2d(
    x: TensorLike,
    weight: Tensor,
    bias: Tensor | None = None,
    stride: int | Sequence[int] = 1,
    padding: Padding2d = "valid",
    output_padding: int | Sequence[int] = 0,
    dilation: int | Sequence[int] = 1,
) -> Tensor:
    """Transposed convolution ("deconvolution"), NHWC.

    Args:
        x: (N, H, W, C_in).
        weight: (kh, kw, C_in, C_out), Conv2D's layout read as in -> out.
        bias: (C_out,) or None.
        stride, dilation, output_padding: int or pair.
        padding: see :func:`conv_transpose2d_geometry`.

    Shape:
        (N, H, W, C_in) -> (N, OH, OW, C_out) with ``OH = (H - 1) * stride -
        crop_top - crop_bottom + dilation * (kh - 1) + 1 + output_padding``.

    Examples:
        >>> eo.conv_transpose2d(eo.ones(1, 4, 4, 2), eo.ones(3, 3, 2, 5), stride=2, padding="same").shape
        (1, 8, 8, 5)
    """
    x = _t(x)
    xd, w = x.data, weight.data
    if xd.ndim != 4 or w.ndim != 4 or xd.shape[3] != w.shape[2]:
        raise EveryOShapeError(
            f"conv_transpose2d: input {xd.shape} must be NHWC and weight {w.shape} (kh, kw, C_in, C_out) "
            f"with C_in == {xd.shape[-1] if xd.ndim else '?'}"
        )
    kh, kw, cin, cout = w.shape
    n, h, wd, _ = xd.shape
    kernel, stride, dilation, crops, extra, full, (oh, ow) = conv_transpose2d_geometry(
        (h, wd), (kh, kw), stride, padding, output_padding, dilation
    )
    if oh <= 0 or ow <= 0 or min(crops[0] + crops[1]) < 0:
        raise EveryOShapeError(
            f"conv_transpose2d: input {xd.shape} with kernel {kernel}, stride {stride}, dilation {dilation}, "
            f"crops {crops} and output_padding {extra} gives output size {(oh, ow)}"
        )
    (t, _), (l, _) = crops
    # The scatter target: the full extent, or more when output_padding reaches past it.
    buffer = (n, max(full[0], t + oh), max(full[1], l + ow), cout)
    half = xd.dtype == w.dtype == np.float16 and (bias is None or bias.data.dtype == np.float16)
    up = _half_to_float if half else (lambda a: a)
    x2 = xd.reshape(n * h * wd, cin)
    w_mat = up(w).transpose(2, 3, 0, 1).reshape(cin, cout * kh * kw)
    cols = _mm(up(x2), w_mat).reshape(n, h, wd, cout, kh, kw)
    acc = np.float32 if half else cols.dtype
    out = _scatter_windows(cols, buffer, kernel, stride, (h, wd), acc, dilation)[:, t : t + oh, l : l + ow, :]
    del cols
    if bias is not None:
        out = out + up(bias.data)
    out = _float_to_half(out) if half else np.ascontiguousarray(out)

    def backward(g):
        g = _up(g) if half else g
        gbuf = np.zeros(buffer, dtype=g.dtype)
        gbuf[:, t : t + oh, l : l + ow, :] = g
        gcols = _windows(gbuf, kernel, stride, (h, wd), dilation).reshape(n * h * wd, cout * kh * kw)
        gx = gw = gb = None
        if x.requires_grad:
            gx = _mm(gcols, w_mat.T).reshape(xd.shape)
            gx = _rounded(gx) if half else gx
        if weight.requires_grad:
            gw = _mm(up(x2).T, gcols).reshape(cin, cout, kh, kw).transpose(2, 3, 0, 1)
            gw = _rounded(gw) if half else gw
        if bias is not None and bias.requires_grad:
            gb = _sum_leading(g, 3)
        return (gx, gw) if bias is None else (gx, gw, gb)

    parents = (x, weight) if bias is None else (x, weight, bias)
    return Tensor._from_op(out, parents, takes_rounded(backward) if half else backward)
