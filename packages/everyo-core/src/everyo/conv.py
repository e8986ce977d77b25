"""2-D convolution and pooling on NHWC tensors, vectorised over pixels.

Convolution is im2col on a strided view followed by one BLAS matmul; the
backward scatters columns back with a loop over kernel offsets (kh * kw
iterations), never over pixels.
"""
import numpy as np
from numpy.lib.stride_tricks import as_strided

from everyo.dispatch import LOW_PRECISION, primitive
from everyo.functional import _mm, _t
from everyo.half import Rounded, _exact_to_half, _float_to_half, _half_to_float, _rounded, _up, takes_rounded
from everyo.padding import _pair, output_size, resolve_padding2d
from everyo.tensor import Tensor

__all__ = ["conv2d", "max_pool2d", "avg_pool2d"]


def _pad(x, pads, value=0.0):
    # A filled array and one slice assignment: np.pad's generality costs
    # ~50 us a call, which dominates small (batch-1) inference.
    (t, b), (l, r) = pads
    if t == b == l == r == 0:
        return x
    n, h, w, c = x.shape
    out = np.full((n, h + t + b, w + l + r, c), value, dtype=x.dtype)
    out[:, t : t + h, l : l + w, :] = x
    return out


def _windows(xp, kernel, stride, out_hw):
    """Read-only view of shape (N, OH, OW, C, kh, kw) over the padded input.

    The same view as ``sliding_window_view(xp, kernel, axis=(1, 2))[:, ::sh, ::sw]``,
    built directly from strides (sliding_window_view's argument handling costs
    tens of microseconds per call).
    """
    sn, sh, sw, sc = xp.strides
    shape = (xp.shape[0], out_hw[0], out_hw[1], xp.shape[3], kernel[0], kernel[1])
    strides = (sn, sh * stride[0], sw * stride[1], sc, sh, sw)
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


def _scatter_windows(grad_win, padded_shape, kernel, stride, out_hw, dtype):
    """Adjoint of :func:`_windows`: add window gradients back into the padded input."""
    if dtype == np.float16:
        # NumPy's float16 adds convert every element (~40x slower than
        # float32): accumulate in float32 and round once at the end.
        grad_win = _half_to_float(grad_win)
        return _float_to_half(_scatter_windows(grad_win, padded_shape, kernel, stride, out_hw, np.float32))
    gxp = np.zeros(padded_shape, dtype=dtype)
    oh, ow = out_hw
    for i in range(kernel[0]):
        for j in range(kernel[1]):
            gxp[:, i : i + stride[0] * (oh - 1) + 1 : stride[0], j : j + stride[1] * (ow - 1) + 1 : stride[1], :] += grad_win[..., i, j]
    return gxp


def _crop(gxp, pads):
    (t, b), (l, r) = pads
    return gxp[:, t : gxp.shape[1] - b, l : gxp.shape[2] - r, :]


def _geometry(x, kernel, stride, padding):
    kernel, stride = _pair(kernel, "kernel_size"), _pair(stride, "stride")
    h, w = x.shape[1], x.shape[2]
    pads = resolve_padding2d(padding, (h, w), kernel, stride)
    out_hw = (output_size(h, kernel[0], stride[0], *pads[0]), output_size(w, kernel[1], stride[1], *pads[1]))
    if out_hw[0] <= 0 or out_hw[1] <= 0:
        raise ValueError(
            f"window {kernel} with stride {stride} and padding {pads} does not fit an input of "
            f"spatial size {(h, w)}"
        )
    return kernel, stride, pads, out_hw


def _resolve_conv(inputs, attrs):
    # The tracer gets the geometry core computes: explicit (top, bottom),
    # (left, right) pads, and kernel and stride as pairs.
    x, weight = inputs[0], inputs[1]
    kernel, stride, pads, _ = _geometry(x.data, weight.data.shape[:2], attrs["stride"], attrs["padding"])
    attrs.update(kernel_size=kernel, stride=stride, pads=pads)
    return attrs


def _resolve_pool(inputs, attrs):
    stride = attrs["pool_size"] if attrs["stride"] is None else attrs["stride"]
    kernel, stride, pads, _ = _geometry(inputs[0].data, attrs["pool_size"], stride, attrs["padding"])
    attrs.update(pool_size=kernel, stride=stride, pads=pads)
    return attrs


@primitive("conv2d", LOW_PRECISION, kind="conv", inputs=("x", "weight", "bias"), resolve=_resolve_conv)
def conv2d(x, weight, bias=None, stride=1, padding="valid"):
    """NHWC convolution. ``x``: (N, H, W, C); ``weight``: (kh, kw, C, O); ``bias``: (O,)."""
    x = _t(x)
    xd, w = x.data, weight.data
    kh, kw, cin, cout = w.shape
    kernel, stride, pads, (oh, ow) = _geometry(xd, (kh, kw), stride, padding)
    if xd.dtype == w.dtype == np.float16 and (bias is None or bias.data.dtype == np.float16):
        return _conv2d_half(x, weight, bias, kernel, stride, pads, (oh, ow))
    n = xd.shape[0]
    xp = _pad(xd, pads)
    # Columns in the view's natural (C, kh, kw) order; permuting the small
    # kernel instead of the big column matrix saves a copy.
    cols = _windows(xp, kernel, stride, (oh, ow)).reshape(n * oh * ow, cin * kh * kw)
    w_mat = w.transpose(2, 0, 1, 3).reshape(cin * kh * kw, cout)
    out = _mm(cols, w_mat)
    if bias is not None:
        out += bias.data
    out = out.reshape(n, oh, ow, cout)

    def backward(g):
        g2 = g.reshape(n * oh * ow, cout)
        gx = gw = gb = None
        if x.requires_grad:
            gcols = _mm(g2, w_mat.T).reshape(n, oh, ow, cin, kh, kw)
            gx = _crop(_scatter_windows(gcols, xp.shape, kernel, stride, (oh, ow), gcols.dtype), pads)
        if weight.requires_grad:
            gw = _mm(cols.T, g2).reshape(cin, kh, kw, cout).transpose(1, 2, 0, 3)
        if bias is not None and bias.requires_grad:
            gb = g2.sum(axis=0, dtype=np.float32 if g2.dtype == np.float16 else None)
        return (gx, gw) if bias is None else (gx, gw, gb)

    parents = (x, weight) if bias is None else (x, weight, bias)
    return Tensor._from_op(out, parents, backward)


def _conv2d_half(x, weight, bias, kernel, stride, pads, out_hw):
    # float16 operands: im2col and BLAS in float32 (the upcast is exact), bias
    # added in float32, one rounding of the result to float16. Backward keeps
    # only the small float16 padded input and rebuilds the float32 columns from
    # it, instead of saving a column matrix kh*kw times the input's size; the
    # input gradient is accumulated in float32 and rounded once.
    xd, w = x.data, weight.data
    kh, kw, cin, cout = w.shape
    (oh, ow), n = out_hw, xd.shape[0]
    xp = _pad(xd, pads)

    def columns():
        return _windows(_half_to_float(xp), kernel, stride, out_hw).reshape(n * oh * ow, cin * kh * kw)

    w_mat = _half_to_float(w).transpose(2, 0, 1, 3).reshape(cin * kh * kw, cout)
    out = _mm(columns(), w_mat)
    if bias is not None:
        out += _half_to_float(bias.data)
    out = _float_to_half(out).reshape(n, oh, ow, cout)

    @takes_rounded
    def backward(g):
        g2 = _up(g).reshape(n * oh * ow, cout)
        gx = gw = gb = None
        if x.requires_grad:
            gcols = _mm(g2, w_mat.T).reshape(n, oh, ow, cin, kh, kw)
            gx = _rounded(_crop(_scatter_windows(gcols, xp.shape, kernel, stride, out_hw, np.float32), pads))
        if weight.requires_grad:
            gw = _rounded(_mm(columns().T, g2).reshape(cin, kh, kw, cout).transpose(1, 2, 0, 3))
        if bias is not None and bias.requires_grad:
            gb = g2.sum(axis=0)  # float32; autograd rounds it once to the bias's float16
        return (gx, gw) if bias is None else (gx, gw, gb)

    parents = (x, weight) if bias is None else (x, weight, bias)
    return Tensor._from_op(out, parents, backward)


@primitive("max_pool2d", kind="pool", resolve=_resolve_pool)
def max_pool2d(x, pool_size=2, stride=None, padding="valid"):
    """Max over windows; the gradient goes to the (first) maximum of each window."""
    x = _t(x)
    xd = x.data
    stride = pool_size if stride is None else stride
    kernel, stride, pads, (oh, ow) = _geometry(xd, pool_size, stride, padding)
    # NumPy's float16 maximum, compare and multiply convert every element
    # (~40x slower than float32), so a float16 input is pooled in float32:
    # the upcast is exact and the maximum is one of the inputs, so rounding
    # it back changes nothing. Only float16 arrays are kept for backward.
    half = xd.dtype == np.float16
    xp = _pad(xd, pads, value=-np.inf)
    xp32 = _half_to_float(xp) if half else xp
    out32 = _window_reduce(_windows(xp32, kernel, stride, (oh, ow)), np.maximum)
    out = _exact_to_half(out32) if half else out32
    del xp32, out32

    @takes_rounded
    def backward(g):
        # The first position (row-major within the window) holding the maximum
        # takes the gradient, like an argmax would.
        src = _half_to_float(xp) if half else xp
        best = _half_to_float(out) if half else out
        g = _up(g) if half else g
        win = _windows(src, kernel, stride, (oh, ow))
        grad_win = np.zeros(win.shape, dtype=g.dtype)
        taken = np.zeros(best.shape, dtype=bool)
        for i in range(kernel[0]):
            for j in range(kernel[1]):
                hit = win[..., i, j] == best
                hit &= ~taken
                taken |= hit
                np.multiply(g, hit, out=grad_win[..., i, j])
        gx = _crop(_scatter_windows(grad_win, xp.shape, kernel, stride, (oh, ow), g.dtype), pads)
        if not half:
            return (gx,)
        if stride[0] >= kernel[0] and stride[1] >= kernel[1]:
            # Windows do not overlap: each input takes at most one float16
            # gradient value, unchanged, so there is nothing to round.
            return (Rounded(np.ascontiguousarray(gx)),)
        return (_rounded(gx),)

    return Tensor._from_op(out, (x,), backward)


@primitive("avg_pool2d", kind="pool", resolve=_resolve_pool)
def avg_pool2d(x, pool_size=2, stride=None, padding="valid"):
    """Mean over windows. With 'same' padding, padded cells are not counted
    (TensorFlow's rule, ONNX ``count_include_pad=0``)."""
    x = _t(x)
    xd = x.data
    stride = pool_size if stride is None else stride
    kernel, stride, pads, (oh, ow) = _geometry(xd, pool_size, stride, padding)
    # A float16 input is summed in float32 and the mean rounded once (NumPy's
    # float16 adds are slow and would round after every addition).
    half = xd.dtype == np.float16
    xp = _pad(_half_to_float(xd) if half else xd, pads)
    total = _window_reduce(_windows(xp, kernel, stride, (oh, ow)), np.add)
    ones = _pad(np.ones((1,) + xd.shape[1:3] + (1,), dtype=xp.dtype), pads)
    count = _window_reduce(_windows(ones, kernel, stride, (oh, ow)), np.add)  # (1, OH, OW, 1)
    out = total / count
    padded_shape = xp.shape
    del xp, total

    @takes_rounded
    def backward(g):
        share = (_up(g) if half else g) / count
        grad_win = np.broadcast_to(share[..., None, None], share.shape + kernel)
        gx = _crop(_scatter_windows(grad_win, padded_shape, kernel, stride, (oh, ow), share.dtype), pads)
        return (_rounded(gx) if half else gx,)

    return Tensor._from_op(_float_to_half(out) if half else out.astype(xd.dtype, copy=False), (x,), backward)
