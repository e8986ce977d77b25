"""Convolution (1-D, 2-D, transposed, grouped, dilated) and pooling on
channels-last tensors, vectorised over pixels.

Convolution is im2col on a strided view followed by one BLAS matmul; the
backward scatters columns back with a loop over kernel offsets (kh * kw
iterations), never over pixels. With everyo-kernels, ``im2col`` and ``col2im``
(see :mod:`everyo.kernel_table`) do the same copies and adds in one pass each,
with the same bits; so do ``max_pool_forward`` and ``max_pool_backward`` for a
max pool whose windows do not overlap ('valid', stride >= pool size).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.lib.stride_tricks import as_strided

from everyo import _blas, _buffers, kernel_table
from everyo.dispatch import LOW_PRECISION, primitive
from everyo.errors import EveryOShapeError
from everyo.functional import _COMPILED, _KERNEL_MIN_SIZE, _add_bias, _mm, _sum_leading, _t, reshape
from everyo.half import Rounded, _down, _exact_down, _rounded, _up, as_dtype, is_low_precision, takes_rounded
from everyo.padding import _pair, counts_padding, output_size, resolve_padding2d
from everyo.tensor import Tensor

if TYPE_CHECKING:
    from collections.abc import Sequence

    from everyo._typing import TensorLike
    from everyo.padding import Padding2d

__all__ = ["conv1d", "conv2d", "max_pool2d", "avg_pool2d"]


def _pad(x, pads, value=0.0):
    # A filled array and one slice assignment: np.pad's generality costs
    # ~50 us a call, which dominates small (batch-1) inference.
    (t, b), (l, r) = pads
    if t == b == l == r == 0:
        return x
    n, h, w, c = x.shape
    # Only the border is filled: a full fill would write the interior twice.
    out = np.empty((n, h + t + b, w + l + r, c), dtype=x.dtype)
    out[:, :t] = value
    out[:, t + h :] = value
    out[:, t : t + h, :l] = value
    out[:, t : t + h, l + w :] = value
    out[:, t : t + h, l : l + w, :] = x
    return out


def _windows(xp, kernel, stride, out_hw, dilation=(1, 1)):
    """Read-only view of shape (N, OH, OW, C, kh, kw) over the padded input.

    The same view as ``sliding_window_view(xp, span, axis=(1, 2))[:, ::sh, ::sw, :, ::dh, ::dw]``
    (``span`` the dilated kernel), built directly from strides
    (sliding_window_view's argument handling costs tens of microseconds per call).
    """
    sn, sh, sw, sc = xp.strides
    shape = (xp.shape[0], out_hw[0], out_hw[1], xp.shape[3], kernel[0], kernel[1])
    strides = (sn, sh * stride[0], sw * stride[1], sc, sh * dilation[0], sw * dilation[1])
    return as_strided(xp, shape, strides, writeable=False)


def _patches(xp, kernel, stride, out_hw, dilation=(1, 1)):
    """Read-only view of shape (N, OH, OW, kh, kw, C): :func:`_windows` with the
    channels innermost, so copying it into im2col columns reads runs of C
    contiguous values (4-5x faster than the (C, kh, kw) order for C = 32)."""
    sn, sh, sw, sc = xp.strides
    shape = (xp.shape[0], out_hw[0], out_hw[1], kernel[0], kernel[1], xp.shape[3])
    strides = (sn, sh * stride[0], sw * stride[1], sh * dilation[0], sw * dilation[1], sc)
    return as_strided(xp, shape, strides, writeable=False)


def _window_reduce(win, ufunc):
    """Reduce the (kh, kw) window axes with a binary ufunc, one kernel offset
    at a time: far faster than a NumPy reduction over two tiny trailing axes."""
    out = win[..., 0, 0].copy()
    for i in range(win.shape[-2]):
        for j in range(win.shape[-1]):
            if i or j:
                ufunc(out, win[..., i, j], out=out)
    return out


def _tap_span(offset, stride, out_n, pad, size):
    """Where one kernel offset's window entries land in the unpadded input.

    Output position ``o`` reads padded index ``offset + stride * o``, i.e.
    input index ``offset + stride * o - pad``. Returns ``(lo, hi, start)``:
    the outputs ``lo <= o < hi`` land inside ``[0, size)``, the first at ``start``.
    """
    lo = max(0, -((offset - pad) // stride))
    hi = min(out_n, (size - 1 + pad - offset) // stride + 1)
    return lo, hi, offset + stride * lo - pad


def _scatter_windows(
    grad_win, padded_shape, kernel, stride, out_hw, dtype, dilation=(1, 1), channels_last=False, pads=((0, 0), (0, 0))
):
    """Adjoint of :func:`_windows` (of :func:`_patches` with ``channels_last``):
    add window gradients back into the input, cropped by ``pads``.

    Taps are added straight into the unpadded input gradient (no padded
    buffer, no cropping copy); a tap that covers the whole input (the centre
    of a stride-1 'same' kernel) initialises it instead of a zero fill.
    """
    if is_low_precision(as_dtype(dtype)):
        # NumPy's float16 adds convert every element (~40x slower than
        # float32): accumulate in float32 and round once at the end.
        grad_win = _up(grad_win)
        return _down(
            _scatter_windows(grad_win, padded_shape, kernel, stride, out_hw, np.float32, dilation, channels_last, pads)
        )
    (t, b), (l, r) = pads
    n, h, w, c = padded_shape[0], padded_shape[1] - t - b, padded_shape[2] - l - r, padded_shape[3]
    (oh, ow), (sh, sw), (dh, dw) = out_hw, stride, dilation
    taps = []
    for i in range(kernel[0]):
        ylo, yhi, y0 = _tap_span(i * dh, sh, oh, t, h)
        for j in range(kernel[1]):
            xlo, xhi, x0 = _tap_span(j * dw, sw, ow, l, w)
            if yhi > ylo and xhi > xlo:
                tap = grad_win[:, :, :, i, j, :] if channels_last else grad_win[..., i, j]
                dest = (
                    slice(None),
                    slice(y0, y0 + sh * (yhi - ylo - 1) + 1, sh),
                    slice(x0, x0 + sw * (xhi - xlo - 1) + 1, sw),
                )
                taps.append(
                    (dest, tap[:, ylo:yhi, xlo:xhi], (yhi - ylo) * sh >= h and (xhi - xlo) * sw >= w and sh == sw == 1)
                )
    full = next((k for k, tap in enumerate(taps) if tap[2]), None)
    if full is None:
        gx = np.zeros((n, h, w, c), dtype=dtype)
    else:
        gx = np.empty((n, h, w, c), dtype=dtype)
        gx[...] = taps.pop(full)[1]
    for dest, tap, _ in taps:
        gx[dest] += tap
    return gx


def _full_tap(kernel, stride, out_hw, dilation, pads, in_hw):
    """The first kernel offset (i, j) whose window entries cover the whole
    input (stride 1), the tap :func:`_scatter_windows` copies instead of
    zero-filling; ``(-1, -1)`` when there is none."""
    (t, _), (l, _) = pads
    if stride != (1, 1):
        return -1, -1
    for i in range(kernel[0]):
        ylo, yhi, _ = _tap_span(i * dilation[0], 1, out_hw[0], t, in_hw[0])
        for j in range(kernel[1]):
            xlo, xhi, _ = _tap_span(j * dilation[1], 1, out_hw[1], l, in_hw[1])
            if yhi > ylo and xhi > xlo and yhi - ylo >= in_hw[0] and xhi - xlo >= in_hw[1]:
                return i, j
    return -1, -1


# Below this many input channels NumPy's tap-by-tap scatter adds long strided
# runs and beat the col2im kernel (0.85 against 1.2 ms at C = 1, 128 x 28 x 28;
# 10 against 5 ms at C = 32, 128 x 14 x 14; measured, one thread).
_COL2IM_MIN_CHANNELS = 8


def _conv_kernels(xd, groups, half, size):
    """everyo-kernels' (im2col, col2im) pair for this convolution, or None
    (NumPy's pad, patch view and scatter): float32/float64 C-contiguous input,
    no groups, columns of at least _KERNEL_MIN_SIZE values."""
    if groups != 1 or half or size < _KERNEL_MIN_SIZE or xd.dtype not in _COMPILED or not xd.flags.c_contiguous:
        return None
    im2col, col2im = kernel_table.get("im2col"), kernel_table.get("col2im")
    return None if im2col is None or col2im is None else (im2col, col2im)


def _pool_kernels(xd, kernel, stride, pads):
    """everyo-kernels' (forward, backward) max_pool2d pair, or None (NumPy's
    window passes): float32/float64 C-contiguous input, no padding, windows
    that do not overlap (stride >= pool size)."""
    if (
        xd.dtype not in _COMPILED
        or not xd.flags.c_contiguous
        or pads != ((0, 0), (0, 0))
        or stride[0] < kernel[0]
        or stride[1] < kernel[1]
    ):
        return None
    forward, backward = kernel_table.get("max_pool_forward"), kernel_table.get("max_pool_backward")
    return None if forward is None or backward is None else (forward, backward)


def _crop(gxp, pads):
    (t, b), (l, r) = pads
    return gxp[:, t : gxp.shape[1] - b, l : gxp.shape[2] - r, :]


def _geometry(shape, kernel, stride, padding, dilation=1, op="conv2d"):
    """Kernel, stride, dilation, explicit pads and output size of a 2-D window op.

    Raises EveryOShapeError naming ``op`` when the (dilated) window does not
    fit the padded input, or the input is not NHWC.
    """
    if len(shape) != 4:
        raise EveryOShapeError(f"{op}: expected an NHWC input of rank 4, got shape {tuple(shape)} (rank {len(shape)})")
    kernel, stride, dilation = _pair(kernel, "kernel_size"), _pair(stride, "stride"), _pair(dilation, "dilation")
    if min(kernel + stride + dilation) < 1:
        raise ValueError(f"{op}: kernel_size, stride and dilation must be positive, got {kernel}, {stride}, {dilation}")
    span = (dilation[0] * (kernel[0] - 1) + 1, dilation[1] * (kernel[1] - 1) + 1)
    h, w = shape[1], shape[2]
    pads = resolve_padding2d(padding, (h, w), span, stride)
    if min(pads[0] + pads[1]) < 0:
        raise ValueError(f"{op}: padding must be non-negative, got {pads}")
    out_hw = (output_size(h, span[0], stride[0], *pads[0]), output_size(w, span[1], stride[1], *pads[1]))
    if out_hw[0] <= 0 or out_hw[1] <= 0:
        raise EveryOShapeError(
            f"{op}: window {span[0]}x{span[1]} (kernel {kernel}, dilation {dilation}) with stride {stride} does "
            f"not fit the input of shape {tuple(shape)} padded by {pads} to {h + sum(pads[0])}x{w + sum(pads[1])}"
        )
    return kernel, stride, dilation, pads, out_hw


# --- the weight product, plain or grouped -----------------------------------------
# Without groups, columns are in (kh, kw, C) order (see _patches), which is the
# weight's own layout: the weight matrix is a free reshape. With groups, columns
# are in the (C, kh, kw) order of _windows: C is the outer index of a column, so
# group g owns one contiguous block of K columns and the product is one batched
# matmul over groups.
def _weight_matrix(w, groups):
    kh, kw, cin_g, cout = w.shape
    if groups == 1:
        return w.reshape(kh * kw * cin_g, cout)
    w_mat = w.transpose(2, 0, 1, 3).reshape(cin_g * kh * kw, cout)
    return np.ascontiguousarray(w_mat.reshape(-1, groups, cout // groups).transpose(1, 0, 2))  # (G, K, O/G)


def _by_group(a, groups):
    """(M, G*K) -> (G, M, K) view (explicit K: -1 cannot be inferred when M is 0)."""
    return a.reshape(a.shape[0], groups, a.shape[1] // groups).transpose(1, 0, 2)


def _from_groups(a):
    """(G, M, K) -> (M, G*K)."""
    return a.transpose(1, 0, 2).reshape(a.shape[1], a.shape[0] * a.shape[2])


def _times_weight(cols, w_mat, groups):
    if groups == 1:
        return _mm(cols, w_mat)
    return _from_groups(_blas.matmul(_by_group(cols, groups), w_mat))


def _times_weight_t(g2, w_mat, groups):
    """The input-column gradient ``g2 @ w_mat.T`` (per group)."""
    if groups == 1:
        return _mm(g2, w_mat.T)
    return _from_groups(_blas.matmul(_by_group(g2, groups), w_mat.transpose(0, 2, 1)))


def _weight_grad(cols, g2, groups, w_shape):
    kh, kw, cin_g, cout = w_shape
    if groups == 1 and cols.shape[1] < 64 and not is_low_precision(cols.dtype):
        # Few columns (a first layer: C * kh * kw = 9 for one channel): OpenBLAS
        # splits a (K, O) product over its rows and columns, never over the long
        # pixel axis, and cols.T @ g2 was measured up to 10x slower (and far
        # worse on a loaded machine) than the same sum written as (g2.T @ cols).T.
        gm = np.ascontiguousarray(_blas.matmul(g2.T, cols).T)
    elif groups == 1:
        gm = _mm(cols.T, g2)
    else:
        gm = _from_groups(_blas.matmul(_by_group(cols, groups).transpose(0, 2, 1), _by_group(g2, groups)))
        return gm.reshape(cin_g, kh, kw, cout).transpose(1, 2, 0, 3)
    return gm.reshape(kh, kw, cin_g, cout)


def _resolve_conv(inputs, attrs):
    # The tracer gets the geometry core computes: explicit (top, bottom),
    # (left, right) pads, and kernel, stride and dilation as pairs.
    x, weight = inputs[0], inputs[1]
    kernel, stride, dilation, pads, _ = _geometry(
        x.data.shape, weight.data.shape[:2], attrs["stride"], attrs["padding"], attrs.get("dilation", 1)
    )
    attrs.update(kernel_size=kernel, stride=stride, dilation=dilation, pads=pads)
    return attrs


def _resolve_pool(inputs, attrs):
    stride = attrs["pool_size"] if attrs["stride"] is None else attrs["stride"]
    kernel, stride, _, pads, _ = _geometry(inputs[0].data.shape, attrs["pool_size"], stride, attrs["padding"])
    attrs.update(pool_size=kernel, stride=stride, pads=pads)
    if "count_include_pad" in attrs:
        attrs["count_include_pad"] = counts_padding(attrs["padding"], attrs["count_include_pad"])
    return attrs


@primitive("conv2d", LOW_PRECISION, kind="conv", inputs=("x", "weight", "bias"), resolve=_resolve_conv)
def conv2d(
    x: TensorLike,
    weight: Tensor,
    bias: Tensor | None = None,
    stride: int | Sequence[int] = 1,
    padding: Padding2d = "valid",
    dilation: int | Sequence[int] = 1,
    groups: int = 1,
) -> Tensor:
    """NHWC convolution (cross-correlation, like every framework).

    Args:
        x: (N, H, W, C) input.
        weight: (kh, kw, C // groups, O).
        bias: (O,) or None.
        stride: int or (h, w) pair.
        dilation: int or (h, w) pair.
        padding: 'valid', 'same' (TensorFlow's rule: output ``ceil(in / stride)``),
            an int, (ph, pw) or ((top, bottom), (left, right)).
        groups: input and output channels split into ``groups`` independent
            convolutions (``groups == C`` with ``O == C * m``: depthwise).

    Shape:
        (N, H, W, C) -> (N, OH, OW, O), ``OH = (H + pads - dilation * (kh - 1) - 1) // stride + 1``.

    Examples:
        >>> eo.conv2d(eo.ones(1, 5, 5, 2), eo.ones(3, 3, 2, 4), padding="same").shape
        (1, 5, 5, 4)
    """
    x = _t(x)
    xd, w = x.data, weight.data
    if w.ndim != 4:
        raise EveryOShapeError(f"conv2d: weight must be (kh, kw, C // groups, O), got shape {w.shape}")
    kh, kw, cin_g, cout = w.shape
    if groups < 1 or xd.ndim != 4 or xd.shape[3] != cin_g * groups or cout % groups:
        raise EveryOShapeError(
            f"conv2d: input {xd.shape} (NHWC) and weight {w.shape} (kh, kw, C // groups, O) do not match "
            f"with groups={groups}: need C == {cin_g} * groups and O divisible by groups"
        )
    geometry = _geometry(xd.shape, (kh, kw), stride, padding, dilation)
    half = is_low_precision(xd.dtype) and w.dtype == xd.dtype and (bias is None or bias.data.dtype == xd.dtype)
    return _conv2d(x, weight, bias, geometry, groups, half)


def _conv2d(x, weight, bias, geometry, groups, half):
    # float16 operands: im2col and BLAS in float32 (the upcast is exact), bias
    # added in float32, one rounding of the result to float16. Backward keeps
    # only the small float16 padded input and rebuilds the float32 columns from
    # it, instead of saving a column matrix kh*kw times the input's size; the
    # input gradient is accumulated in float32 and rounded once.
    kernel, stride, dilation, pads, (oh, ow) = geometry
    xd, w = x.data, weight.data
    kh, kw, cin_g, cout = w.shape
    n, cin = xd.shape[0], xd.shape[3]
    (t, b), (l, r) = pads
    padded_shape = (n, xd.shape[1] + t + b, xd.shape[2] + l + r, cin)
    compiled = _conv_kernels(xd, groups, half, n * oh * ow * cin * kh * kw)
    # With everyo-kernels, the columns are read straight from the unpadded
    # input (the same values, a zero for each tap in the padding).
    xp = None if compiled else _pad(xd, pads)

    view = _patches if groups == 1 else _windows

    def columns():
        src = _up(xp) if half else xp
        return view(src, kernel, stride, (oh, ow), dilation).reshape(n * oh * ow, cin * kh * kw)

    w_mat = _weight_matrix(_up(w) if half else w, groups)
    if compiled:
        cols = _buffers.empty((n * oh * ow, kh * kw * cin), xd.dtype)
        compiled[0](xd, cols, kh, kw, *stride, *dilation, t, l, oh, ow)
    else:
        cols = columns()
    out = _times_weight(cols, w_mat, groups)
    if bias is not None:
        if half:
            out += _up(bias.data)
        else:
            _add_bias(out, bias.data)  # linear's one-pass add where it applies (the same bits)
    if half:
        out, cols = _down(out, xd.dtype), None
    out = out.reshape(n, oh, ow, cout)

    def backward(g):
        g2 = (_up(g) if half else g).reshape(n * oh * ow, cout)
        gx = gw = gb = None
        if x.requires_grad:
            gcols = _times_weight_t(g2, w_mat, groups)
            if compiled and cin >= _COL2IM_MIN_CHANNELS and gcols.dtype == xd.dtype and gcols.flags.c_contiguous:
                # One pass over the input gradient: the same sums, added in the same order.
                gx = _buffers.empty(xd.shape, xd.dtype)
                full = _full_tap(kernel, stride, (oh, ow), dilation, pads, xd.shape[1:3])
                compiled[1](gcols, gx, kh, kw, *stride, *dilation, t, l, oh, ow, *full)
            else:
                gcols = gcols.reshape((n, oh, ow, kh, kw, cin) if groups == 1 else (n, oh, ow, cin, kh, kw))
                acc = np.float32 if half else gcols.dtype
                gx = _scatter_windows(gcols, padded_shape, kernel, stride, (oh, ow), acc, dilation, groups == 1, pads)
                gx = _rounded(gx, xd.dtype) if half else gx
        if weight.requires_grad:
            gw = _weight_grad(columns() if half else cols, g2, groups, w.shape)
            gw = _rounded(gw, xd.dtype) if half else gw
        if bias is not None and bias.requires_grad:
            # float32 for float16 gradients; autograd rounds it once to the bias's float16
            gb = g2.sum(axis=0, dtype=np.float32) if is_low_precision(g2.dtype) else _sum_leading(g2)
        return (gx, gw) if bias is None else (gx, gw, gb)

    parents = (x, weight) if bias is None else (x, weight, bias)
    return Tensor._from_op(out, parents, takes_rounded(backward) if half else backward)


def _conv1d_padding(padding, k, dilation):
    """conv1d's padding as conv2d's on an (N, 1, L, C) view."""
    if isinstance(padding, str):
        mode = padding.lower()
        if mode == "causal":
            return ((0, 0), (dilation * (k - 1), 0))
        if mode not in ("valid", "same"):
            raise ValueError(f"conv1d: padding must be 'valid', 'same', 'causal' or ints, got {padding!r}")
        return mode
    if isinstance(padding, int):
        return ((0, 0), (padding, padding))
    return ((0, 0), tuple(padding))


def _resolve_conv1d(inputs, attrs):
    x, weight = inputs[0], inputs[1]
    n, length, c = x.data.shape
    k = weight.data.shape[0]
    padding = _conv1d_padding(attrs["padding"], k, attrs["dilation"])
    _, _, _, pads, _ = _geometry((n, 1, length, c), (1, k), (1, attrs["stride"]), padding, (1, attrs["dilation"]))
    attrs.update(pads=pads[1])  # (left, right)
    return attrs


@primitive("conv1d", LOW_PRECISION, kind="conv", inputs=("x", "weight", "bias"), resolve=_resolve_conv1d)
def conv1d(
    x: TensorLike,
    weight: Tensor,
    bias: Tensor | None = None,
    stride: int = 1,
    padding: str | int | Sequence[int] = "valid",
    dilation: int = 1,
    groups: int = 1,
) -> Tensor:
    """Channels-last 1-D convolution (Keras's Conv1D layout).

    Args:
        x: (N, L, C) input.
        weight: (k, C // groups, O).
        padding: 'valid', 'same' (output ``ceil(L / stride)``), 'causal'
            (``dilation * (k - 1)`` zeros on the left only, so output t sees
            inputs up to t), an int, or a pair (left, right).

    Shape:
        (N, L, C) -> (N, OL, O).

    Examples:
        >>> eo.conv1d(eo.ones(2, 10, 3), eo.ones(3, 3, 4), padding="causal").shape
        (2, 10, 4)
    """
    x = _t(x)
    if x.data.ndim != 3:
        raise EveryOShapeError(f"conv1d: expected an (N, L, C) input of rank 3, got shape {x.data.shape}")
    if weight.data.ndim != 3:
        raise EveryOShapeError(f"conv1d: weight must be (k, C // groups, O), got shape {weight.data.shape}")
    padding = _conv1d_padding(padding, weight.data.shape[0], dilation)
    n, length, c = x.data.shape
    out = conv2d(
        reshape(x, (n, 1, length, c)),
        reshape(weight, (1,) + weight.data.shape),
        bias,
        stride=(1, stride),
        padding=padding,
        dilation=(1, dilation),
        groups=groups,
    )
    return reshape(out, (n, out.data.shape[2], out.data.shape[3]))


@primitive("max_pool2d", kind="pool", resolve=_resolve_pool)
def max_pool2d(
    x: TensorLike,
    pool_size: int | Sequence[int] = 2,
    stride: int | Sequence[int] | None = None,
    padding: Padding2d = "valid",
) -> Tensor:
    """Max over windows; the gradient goes to the (first) maximum of each window."""
    x = _t(x)
    xd = x.data
    stride = pool_size if stride is None else stride
    kernel, stride, _, pads, (oh, ow) = _geometry(xd.shape, pool_size, stride, padding, op="max_pool2d")
    # NumPy's float16 maximum, compare and multiply convert every element
    # (~40x slower than float32), so a float16 input is pooled in float32:
    # the upcast is exact and the maximum is one of the inputs, so rounding
    # it back changes nothing. Only float16 arrays are kept for backward.
    half = is_low_precision(xd.dtype)
    compiled = _pool_kernels(xd, kernel, stride, pads)
    step: Any = stride  # a pair here (_geometry's), whatever the parameter's type says
    xp = _pad(xd, pads, value=-np.inf)
    if compiled:
        # One pass each way, the same bits (everyo.kernels.pool).
        out = _buffers.empty((xd.shape[0], oh, ow, xd.shape[3]), xd.dtype)
        compiled[0](xd, out, kernel[0], kernel[1], step[0], step[1])
    else:
        xp32 = _up(xp) if half else xp
        out32 = _window_reduce(_windows(xp32, kernel, stride, (oh, ow)), np.maximum)
        out = _exact_down(out32, xd.dtype) if half else out32
        del xp32, out32

    @takes_rounded
    def backward(g):
        if compiled and isinstance(g, np.ndarray) and g.dtype == xd.dtype:
            gx = _buffers.empty(xd.shape, xd.dtype)
            compiled[1](xd, out, np.ascontiguousarray(g), gx, kernel[0], kernel[1], step[0], step[1])
            return (gx,)
        # The first position (row-major within the window) holding the maximum
        # takes the gradient, like an argmax would.
        src = _up(xp) if half else xp
        best = _up(out) if half else out
        g = _up(g) if half else g
        win = _windows(src, kernel, stride, (oh, ow))
        disjoint = stride[0] >= kernel[0] and stride[1] >= kernel[1]
        if disjoint:
            # Windows do not overlap: each offset's gradient goes straight to
            # its own input positions (no window-gradient array, no scatter).
            # Windows that tile the input write every cell below: no zero fill.
            tiled = stride == kernel and oh * stride[0] == xp.shape[1] and ow * stride[1] == xp.shape[2]
            gxp = (np.empty if tiled else np.zeros)(xp.shape, dtype=g.dtype)
        else:
            grad_win = np.zeros(win.shape, dtype=g.dtype)
        taken = np.zeros(best.shape, dtype=bool)
        last = (kernel[0] - 1, kernel[1] - 1)
        # A window holding NaN pools to NaN: its (first) NaN takes the gradient, as in PyTorch.
        nan_best = np.isnan(best)
        if not nan_best.any():
            nan_best = None
        for i in range(kernel[0]):
            for j in range(kernel[1]):
                hit = win[..., i, j] == best
                if nan_best is not None:
                    hit |= nan_best & np.isnan(win[..., i, j])
                if i or j:
                    hit &= ~taken
                if (i, j) != last:
                    taken |= hit
                if disjoint:
                    rows = slice(i, i + stride[0] * (oh - 1) + 1, stride[0])
                    cols = slice(j, j + stride[1] * (ow - 1) + 1, stride[1])
                    np.multiply(g, hit, out=gxp[:, rows, cols, :])
                else:
                    np.multiply(g, hit, out=grad_win[..., i, j])
        if not disjoint:
            gx = _scatter_windows(grad_win, xp.shape, kernel, stride, (oh, ow), g.dtype, pads=pads)
        else:
            gx = _crop(gxp, pads)
        if not half:
            return (gx,)
        if disjoint:
            # Windows do not overlap: each input takes at most one float16
            # gradient value, unchanged, so there is nothing to round.
            return (Rounded(np.ascontiguousarray(gx), xd.dtype),)
        return (_rounded(gx, xd.dtype),)

    return Tensor._from_op(out, (x,), backward)


@primitive("avg_pool2d", kind="pool", resolve=_resolve_pool)
def avg_pool2d(
    x: TensorLike,
    pool_size: int | Sequence[int] = 2,
    stride: int | Sequence[int] | None = None,
    padding: Padding2d = "valid",
    count_include_pad: bool | None = None,
) -> Tensor:
    """Mean over windows of an NHWC input.

    ``count_include_pad`` says whether padded cells count in each window's
    divisor. The default (``None``) follows the spelling of ``padding``:
    with ``'same'``, Keras' rule (only the window's input cells are counted,
    so every output is a mean of real values); with numeric padding,
    PyTorch's default (``count_include_pad=True``: each window divides by
    ``kernel_h * kernel_w``, padded zeros included). Pass ``True`` or
    ``False`` to choose either rule with any padding.

    Examples:
        >>> x = eo.ones(1, 2, 2, 1)
        >>> eo.avg_pool2d(x, 2, 1, padding=1)[0, :, :, 0].tolist()  # PyTorch: pads count
        [[0.25, 0.5, 0.25], [0.5, 1.0, 0.5], [0.25, 0.5, 0.25]]
        >>> eo.avg_pool2d(x, 2, 1, padding=1, count_include_pad=False)[0, 0, :, 0].tolist()
        [1.0, 1.0, 1.0]
    """
    x = _t(x)
    xd = x.data
    stride = pool_size if stride is None else stride
    kernel, stride, _, pads, (oh, ow) = _geometry(xd.shape, pool_size, stride, padding, op="avg_pool2d")
    # A float16 input is summed in float32 and the mean rounded once (NumPy's
    # float16 adds are slow and would round after every addition).
    half = is_low_precision(xd.dtype)
    xp = _pad(_up(xd) if half else xd, pads)
    total = _window_reduce(_windows(xp, kernel, stride, (oh, ow)), np.add)
    if counts_padding(padding, count_include_pad):
        count = np.asarray(kernel[0] * kernel[1], dtype=xp.dtype)
    else:
        ones = _pad(np.ones((1,) + xd.shape[1:3] + (1,), dtype=xp.dtype), pads)
        count = _window_reduce(_windows(ones, kernel, stride, (oh, ow)), np.add)  # (1, OH, OW, 1)
    out = total / count
    padded_shape = xp.shape
    del xp, total

    @takes_rounded
    def backward(g):
        share = (_up(g) if half else g) / count
        grad_win = np.broadcast_to(share[..., None, None], share.shape + kernel)
        gx = _scatter_windows(grad_win, padded_shape, kernel, stride, (oh, ow), share.dtype, pads=pads)
        return (_rounded(gx, xd.dtype) if half else gx,)

    return Tensor._from_op(_down(out, xd.dtype) if half else out.astype(xd.dtype, copy=False), (x,), backward)
