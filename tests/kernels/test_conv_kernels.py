"""The conv2d data-movement kernels (im2col, col2im) against core's NumPy path
(``_pad`` + ``_patches`` and ``_scatter_windows``): bit-identical on random
geometries (strides, dilations, 'same' / 'valid' / explicit / asymmetric
padding, padding wider than the kernel, batch 1, one channel), float32 and
float64, special values; conv2d with the kernels on gives the same bits as
with them off; the gradients through them pass the FD checker."""

import numpy as np
import pytest
from conftest import count_calls

import everyo as eo
from everyo import kernel_table
from everyo.conv import _full_tap, _geometry, _pad, _patches, _scatter_windows
from everyo.testing import check_gradients

SPECIALS = [0.0, -0.0, np.nan, np.inf, -np.inf, 1e-45, -3e38]

# (N, H, W, C), (kh, kw), stride, dilation, padding
GEOMETRIES = [
    ((2, 9, 8, 5), (3, 3), 1, 1, "same"),  # the centre tap covers the input
    ((3, 11, 10, 4), (3, 2), (2, 3), (1, 2), ((2, 0), (1, 3))),
    ((1, 7, 7, 1), (3, 3), 1, 1, "valid"),  # batch 1, one channel
    ((2, 6, 9, 3), (2, 4), (1, 2), 1, "same"),  # 'same' with even kernels and stride: asymmetric pads
    ((2, 4, 4, 2), (2, 2), 1, 1, ((3, 3), (3, 2))),  # taps wholly in the padding
    ((1, 10, 12, 8), (3, 3), 2, 2, 1),
    ((2, 5, 6, 16), (1, 1), 1, 1, "valid"),  # 1x1: the one tap covers the input
    ((2, 9, 9, 3), (5, 5), (3, 3), (1, 2), ((4, 0), (1, 3))),
    ((2, 8, 8, 9), (3, 3), 1, (2, 1), "same"),  # dilated 'same'
]


def _same_bits(a, b):
    """Bit-identical, except a NaN's sign and payload (see test_dense_kernels); NaN positions must match."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    nan_a, nan_b = np.isnan(a), np.isnan(b)
    return np.array_equal(nan_a, nan_b) and np.array_equal(a[~nan_a].view(np.uint8), b[~nan_b].view(np.uint8))


def _values(rng, shape, dtype):
    x = rng.standard_normal(shape).astype(dtype)
    flat = x.reshape(-1)
    flat[rng.integers(0, flat.size, len(SPECIALS))] = np.array(SPECIALS, dtype)
    return x


def _columns_numpy(x, kernel, stride, dilation, pads, out_hw):
    n = x.shape[0]
    return _patches(_pad(x, pads), kernel, stride, out_hw, dilation).reshape(n * out_hw[0] * out_hw[1], -1)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("geometry", GEOMETRIES)
def test_im2col_matches_numpy_columns(geometry, dtype):
    shape, kernel, stride, dilation, padding = geometry
    kernel, stride, dilation, pads, (oh, ow) = _geometry(shape, kernel, stride, padding, dilation)
    x = _values(np.random.default_rng(0), shape, dtype)
    want = _columns_numpy(x, kernel, stride, dilation, pads, (oh, ow))
    got = np.full_like(want, 7.0)  # every value must be written
    kernel_table.get("im2col")(x, got, *kernel, *stride, *dilation, pads[0][0], pads[1][0], oh, ow)
    assert _same_bits(got, want)


@pytest.mark.parametrize("fill", ["random", "negative zero"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("geometry", GEOMETRIES)
def test_col2im_matches_numpy_scatter(geometry, dtype, fill):
    # An all -0.0 gradient tells the two starts apart: the tap that covers the
    # input copied (-0.0 stays) or a zero fill (+0.0 + -0.0 = +0.0).
    shape, kernel, stride, dilation, padding = geometry
    kernel, stride, dilation, pads, (oh, ow) = _geometry(shape, kernel, stride, padding, dilation)
    (n, h, w, c), (t, b), (l, r) = shape, *pads
    cols_shape = (n * oh * ow, kernel[0] * kernel[1] * c)
    if fill == "random":
        gcols = _values(np.random.default_rng(1), cols_shape, dtype)
    else:
        gcols = np.full(cols_shape, -0.0, dtype)
    want = _scatter_windows(
        gcols.reshape(n, oh, ow, *kernel, c), (n, h + t + b, w + l + r, c), kernel, stride, (oh, ow), dtype, dilation,
        True, pads,
    )  # fmt: skip
    got = np.full(shape, 7.0, dtype)  # every value must be written
    full = _full_tap(kernel, stride, (oh, ow), dilation, pads, (h, w))
    with np.errstate(invalid="ignore"):
        kernel_table.get("col2im")(gcols, got, *kernel, *stride, *dilation, t, l, oh, ow, *full)
    assert _same_bits(got, want)


def test_full_tap_is_found_where_numpy_copies():
    # 'same' 3x3 stride 1: the centre; 1x1: the only tap; stride 2 or 'valid' 3x3: none.
    assert _full_tap((3, 3), (1, 1), (5, 5), (1, 1), ((1, 1), (1, 1)), (5, 5)) == (1, 1)
    assert _full_tap((1, 1), (1, 1), (5, 6), (1, 1), ((0, 0), (0, 0)), (5, 6)) == (0, 0)
    assert _full_tap((3, 3), (2, 2), (3, 3), (1, 1), ((1, 1), (1, 1)), (5, 5)) == (-1, -1)
    assert _full_tap((3, 3), (1, 1), (3, 3), (1, 1), ((0, 0), (0, 0)), (5, 5)) == (-1, -1)


def _conv_grads(x, w, b, g, **kwargs):
    xt, wt, bt = (eo.tensor(a, requires_grad=True) for a in (x, w, b))
    with np.errstate(all="ignore"):  # the special values make NaNs
        out = eo.conv2d(xt, wt, bt, **kwargs)
        out.backward(eo.tensor(g))
    return out.data.copy(), xt.grad.copy(), wt.grad.copy(), bt.grad.copy()


CONV_CASES = [
    # The CNN benchmark's second conv, at batch 4.
    ((4, 14, 14, 32), (3, 3, 32, 64), {"padding": "same"}),
    ((4, 13, 11, 8), (3, 2, 8, 6), {"padding": ((2, 0), (1, 3)), "stride": (2, 1), "dilation": (1, 2)}),
    ((1, 20, 20, 12), (5, 5, 12, 4), {"padding": "valid", "stride": 2}),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", CONV_CASES)
def test_conv2d_with_kernels_matches_numpy_path_bit_for_bit(monkeypatch, case, dtype):
    x_shape, w_shape, kwargs = case
    rng = np.random.default_rng(2)
    x, w, b = _values(rng, x_shape, dtype), rng.standard_normal(w_shape).astype(dtype), _values(rng, w_shape[3:], dtype)
    with np.errstate(all="ignore"):
        g = rng.standard_normal(eo.conv2d(eo.tensor(x), eo.tensor(w), **kwargs).shape).astype(dtype)
    with kernel_table.disabled():
        want = _conv_grads(x, w, b, g, **kwargs)
    calls = count_calls(monkeypatch, ("im2col", "col2im"))
    got = _conv_grads(x, w, b, g, **kwargs)
    assert calls == {"im2col": 1, "col2im": 1}
    for a, e in zip(got, want):
        assert _same_bits(a, e)


def test_first_layer_takes_im2col_only(monkeypatch):
    # One input channel (the CNN's first conv): columns from the kernel, the
    # input gradient from NumPy's scatter (faster there); the same bits.
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((8, 28, 28, 1), np.float32), rng.standard_normal((3, 3, 1, 32), np.float32)
    b = rng.standard_normal(32).astype(np.float32)
    g = rng.standard_normal((8, 28, 28, 32)).astype(np.float32)
    with kernel_table.disabled():
        want = _conv_grads(x, w, b, g, padding="same")
    calls = count_calls(monkeypatch, ("im2col", "col2im"))
    got = _conv_grads(x, w, b, g, padding="same")
    assert calls == {"im2col": 1, "col2im": 0}
    for a, e in zip(got, want):
        assert _same_bits(a, e)


@pytest.mark.parametrize(
    "what",
    ["groups", "float16", "transposed input", "small"],
)
def test_kernels_are_not_used_where_they_do_not_apply(monkeypatch, what):
    rng = np.random.default_rng(4)
    dtype = np.float16 if what == "float16" else np.float32
    x = rng.standard_normal((4, 14, 14, 32)).astype(dtype)
    w = rng.standard_normal((3, 3, 16 if what == "groups" else 32, 64)).astype(dtype)
    if what == "transposed input":
        x = np.ascontiguousarray(x.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)
        assert not x.flags.c_contiguous
    if what == "small":
        x = np.ascontiguousarray(x[:1, :4, :4, :])  # 1 * 16 * 288 columns: below the kernels' size
    kwargs = {"padding": "same", "groups": 2 if what == "groups" else 1}
    calls = count_calls(monkeypatch, ("im2col", "col2im"))
    xt = eo.tensor(x, requires_grad=True)
    eo.conv2d(xt, eo.tensor(w, requires_grad=True), **kwargs).sum().backward()
    assert calls == {"im2col": 0, "col2im": 0}
    assert xt.grad.shape == x.shape


@pytest.mark.parametrize("case", CONV_CASES[1:])
def test_gradients_through_the_kernels_pass_the_fd_checker(monkeypatch, case):
    x_shape, w_shape, kwargs = case
    rng = np.random.default_rng(5)
    x, w, b = rng.standard_normal(x_shape), 0.3 * rng.standard_normal(w_shape), rng.standard_normal(w_shape[3])
    calls = count_calls(monkeypatch, ("im2col", "col2im"))
    check_gradients(lambda x, w, b: eo.conv2d(x, w, b, **kwargs), [x, w, b], name="conv2d")
    assert calls["im2col"] >= 1 and calls["col2im"] >= 1
