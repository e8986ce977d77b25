"""The 0.2 layers: each forward against a plain loop / NumPy reference written
from the definition, each gradient against finite differences."""

import math

import numpy as np
import pytest

import everyo as eo
from everyo.testing import check_gradients, check_module_gradients

rng = np.random.default_rng(12)


def f64(*shape):
    return rng.standard_normal(shape)


# --- references, written from the definitions with loops -------------------------
def conv2d_loop(x, w, b, stride, pads, dilation, groups):
    """Direct cross-correlation: every output pixel, every group, every tap."""
    n, h, wd, c = x.shape
    kh, kw, cg, o = w.shape
    (t, bt), (l, r) = pads
    xp = np.zeros((n, h + t + bt, wd + l + r, c))
    xp[:, t : t + h, l : l + wd] = x
    sh, sw = stride
    dh, dw = dilation
    oh = (xp.shape[1] - dh * (kh - 1) - 1) // sh + 1
    ow = (xp.shape[2] - dw * (kw - 1) - 1) // sw + 1
    og = o // groups
    out = np.zeros((n, oh, ow, o))
    for i in range(oh):
        for j in range(ow):
            for q in range(o):
                g = q // og
                for a in range(kh):
                    for bb in range(kw):
                        pix = xp[:, i * sh + a * dh, j * sw + bb * dw, g * cg : (g + 1) * cg]
                        out[:, i, j, q] += pix @ w[a, bb, :, q]
    return out + (0 if b is None else b)


def conv_transpose_loop(x, w, b, stride, crops, extra, dilation):
    """Scatter definition: input pixel (i, j) adds x[i, j] @ w[a, b] at (i*s + a*d, j*s + b*d)."""
    n, h, wd, cin = x.shape
    kh, kw, _, cout = w.shape
    sh, sw = stride
    dh, dw = dilation
    full = ((h - 1) * sh + dh * (kh - 1) + 1 + extra[0] + 10, (wd - 1) * sw + dw * (kw - 1) + 1 + extra[1] + 10)
    out = np.zeros((n,) + full + (cout,))
    for i in range(h):
        for j in range(wd):
            for a in range(kh):
                for bb in range(kw):
                    out[:, i * sh + a * dh, j * sw + bb * dw, :] += x[:, i, j, :] @ w[a, bb]
    oh = (h - 1) * sh + dh * (kh - 1) + 1 - crops[0][0] - crops[0][1] + extra[0]
    ow = (wd - 1) * sw + dw * (kw - 1) + 1 - crops[1][0] - crops[1][1] + extra[1]
    out = out[:, crops[0][0] : crops[0][0] + oh, crops[1][0] : crops[1][0] + ow]
    return out + (0 if b is None else b)


def bilinear_loop(x, sh, sw, align_corners):
    """Per output pixel: the source coordinate, its two neighbours per axis, the lerp."""
    n, h, w, c = x.shape

    def source(p, size, scale):
        if align_corners:
            return p * (size - 1) / (size * scale - 1) if size * scale > 1 else 0.0
        return max((p + 0.5) / scale - 0.5, 0.0)

    out = np.zeros((n, h * sh, w * sw, c))
    for p in range(h * sh):
        y = source(p, h, sh)
        y0 = min(int(math.floor(y)), h - 1)
        y1, fy = min(y0 + 1, h - 1), y - y0
        for q in range(w * sw):
            z = source(q, w, sw)
            z0 = min(int(math.floor(z)), w - 1)
            z1, fz = min(z0 + 1, w - 1), z - z0
            out[:, p, q] = (1 - fy) * ((1 - fz) * x[:, y0, z0] + fz * x[:, y0, z1]) + fy * (
                (1 - fz) * x[:, y1, z0] + fz * x[:, y1, z1]
            )
    return out


# --- activations ---------------------------------------------------------------------
def _erf_loop(x):
    return np.array([math.erf(v) for v in x.ravel()]).reshape(x.shape)


ACTIVATION_REFERENCES = [
    ("GELU", lambda: eo.GELU(), lambda x: 0.5 * x * (1 + _erf_loop(x / math.sqrt(2)))),
    (
        "GELU_tanh",
        lambda: eo.GELU(approximate="tanh"),
        lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))),
    ),
    ("SiLU", lambda: eo.SiLU(), lambda x: x / (1 + np.exp(-x))),
    ("LeakyReLU", lambda: eo.LeakyReLU(), lambda x: np.where(x > 0, x, 0.01 * x)),
    ("LeakyReLU_0.2", lambda: eo.LeakyReLU(0.2), lambda x: np.where(x > 0, x, 0.2 * x)),
    ("ELU", lambda: eo.ELU(), lambda x: np.where(x > 0, x, np.exp(x) - 1)),
    ("ELU_2", lambda: eo.ELU(alpha=2.0), lambda x: np.where(x > 0, x, 2 * (np.exp(x) - 1))),
    ("Softplus", lambda: eo.Softplus(), lambda x: np.log(1 + np.exp(x))),
    (
        "Softplus_beta2",
        lambda: eo.Softplus(beta=2.0, threshold=5.0),
        lambda x: np.where(2 * x > 5, x, np.log(1 + np.exp(2 * x)) / 2),
    ),
    ("Identity", lambda: eo.Identity(), lambda x: x),
]


@pytest.mark.parametrize("name,make,ref", ACTIVATION_REFERENCES, ids=[c[0] for c in ACTIVATION_REFERENCES])
def test_activation_forward_and_gradient(name, make, ref):
    x = f64(4, 7) * 3
    x = np.where(np.abs(x) < 1e-3, 0.5, x)  # keep finite differences off the kinks at 0
    np.testing.assert_allclose(make()(eo.tensor(x)).data, ref(x), rtol=1e-12, atol=1e-14)
    check_module_gradients(make(), x, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("fn", [eo.gelu, lambda t: eo.gelu(t, "tanh"), eo.silu, eo.leaky_relu, eo.elu, eo.softplus])
def test_activations_in_float32_and_float16_are_the_float64_value_rounded(fn):
    x = np.concatenate([f64(2000) * 4, [-30.0, -8.0, 0.0, 8.0, 30.0]])
    exact = fn(eo.tensor(x)).data
    x32 = x.astype(np.float32)
    got32 = fn(eo.tensor(x32)).data
    assert got32.dtype == np.float32
    # float32 arithmetic: a few ulps (the tanh form's argument carries eps * |x|^3 into exp)
    np.testing.assert_allclose(got32, fn(eo.tensor(x32.astype(np.float64))).data, rtol=1.5e-6, atol=1e-9)
    x16 = x.astype(np.float16)
    got16 = fn(eo.tensor(x16)).data
    assert got16.dtype == np.float16
    # computed in float32 and rounded once: equal to the float64 value rounded, or one float16 step off
    ref16 = fn(eo.tensor(x16.astype(np.float64))).data.astype(np.float16)
    steps = np.abs(got16.astype(np.float64) - ref16.astype(np.float64)) / np.spacing(np.abs(ref16)).astype(np.float64)
    assert np.all(steps <= 1), steps.max()
    assert np.all(np.isfinite(exact))


def test_float16_activation_backward_is_float16():
    x = eo.tensor((f64(3, 5) * 3).astype(np.float16), requires_grad=True)
    eo.gelu(x).sum().backward()
    assert x.grad.dtype == np.float16
    x64 = x.data.astype(np.float64)
    cdf = 0.5 * (1 + _erf_loop(x64 / math.sqrt(2)))
    np.testing.assert_allclose(x.grad, cdf + x64 * np.exp(-(x64**2) / 2) / math.sqrt(2 * math.pi), rtol=2e-3, atol=1e-3)


def test_softplus_and_elu_stay_finite_for_large_inputs():
    x = eo.tensor(np.array([-1000.0, -50.0, 50.0, 1000.0]))
    assert np.all(np.isfinite(eo.softplus(x).data)) and np.all(np.isfinite(eo.elu(x).data))
    np.testing.assert_allclose(eo.softplus(x).data, [0.0, np.exp(-50.0), 50.0, 1000.0], rtol=1e-12)


def test_transformer_layer_accepts_gelu():
    layer = eo.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0, activation="gelu", seed=0)
    assert layer.activation is eo.gelu
    x = f64(2, 3, 8)
    check_module_gradients(layer, x, atol=1e-6, rtol=1e-5)
    with pytest.raises(ValueError, match="gelu"):
        eo.TransformerEncoderLayer(8, 2, activation="swishy")


# --- convolutions ----------------------------------------------------------------------
CONV_CASES = [  # (h, w, cin, cout, k, stride, padding, dilation, groups)
    (7, 7, 2, 3, 3, 1, "valid", 2, 1),
    (9, 8, 2, 4, 3, 2, "same", 2, 1),
    (6, 6, 4, 6, 3, 1, "same", 1, 2),
    (6, 7, 4, 4, 3, 2, "valid", 1, 4),  # depthwise
    (6, 6, 3, 6, (3, 2), 1, ((1, 0), (2, 1)), (1, 2), 3),  # depthwise multiplier 2, explicit pads
]


@pytest.mark.parametrize("h,w,cin,cout,k,stride,padding,dilation,groups", CONV_CASES)
def test_conv2d_dilation_groups_match_loop(h, w, cin, cout, k, stride, padding, dilation, groups):
    layer = eo.Conv2D(cin, cout, k, stride=stride, padding=padding, dilation=dilation, groups=groups, seed=0).to(
        "float64"
    )
    x = f64(2, h, w, cin)
    kernel, st, dil = eo.padding._pair(k, "k"), eo.padding._pair(stride, "s"), eo.padding._pair(dilation, "d")
    span = tuple(d * (kk - 1) + 1 for kk, d in zip(kernel, dil))
    pads = eo.resolve_padding2d(padding, (h, w), span, st)
    expected = conv2d_loop(x, layer.weight.data, layer.bias.data, st, pads, dil, groups)
    np.testing.assert_allclose(layer(eo.tensor(x)).data, expected, rtol=1e-10, atol=1e-12)
    check_module_gradients(layer, f64(1, h, w, cin), atol=1e-6, rtol=1e-5)


def test_conv2d_same_with_dilation_keeps_the_size():
    layer = eo.Conv2D(2, 2, 3, padding="same", dilation=3, seed=0)
    assert layer(eo.ones(1, 9, 10, 2)).shape == (1, 9, 10, 2)


def test_conv2d_groups_float16_is_float32_arithmetic_rounded_once():
    x = f64(2, 6, 6, 4).astype(np.float16)
    w = (f64(3, 3, 2, 6) * 0.3).astype(np.float16)
    b = f64(6).astype(np.float16)
    got = eo.conv2d(eo.tensor(x), eo.tensor(w), eo.tensor(b), padding="same", dilation=2, groups=2)
    ref = eo.conv2d(
        eo.tensor(x.astype(np.float32)),
        eo.tensor(w.astype(np.float32)),
        eo.tensor(b.astype(np.float32)),
        padding="same",
        dilation=2,
        groups=2,
    )
    assert got.dtype == "float16"
    np.testing.assert_array_equal(got.data, ref.data.astype(np.float16))


@pytest.mark.parametrize(
    "length,k,stride,padding,dilation,groups",
    [
        (10, 3, 1, "valid", 1, 1),
        (11, 3, 2, "same", 1, 1),
        (9, 3, 1, "causal", 2, 1),
        (8, 2, 1, (2, 1), 1, 2),
    ],
)
def test_conv1d_matches_loop(length, k, stride, padding, dilation, groups):
    layer = eo.Conv1D(4, 6, k, stride=stride, padding=padding, dilation=dilation, groups=groups, seed=0).to("float64")
    x = f64(2, length, 4)
    w = layer.weight.data
    if padding == "causal":
        left, right = dilation * (k - 1), 0
    elif padding == "same":
        out = -(-length // stride)
        total = max((out - 1) * stride + dilation * (k - 1) + 1 - length, 0)
        left, right = total // 2, total - total // 2
    elif padding == "valid":
        left = right = 0
    else:
        left, right = padding
    xp = np.concatenate([np.zeros((2, left, 4)), x, np.zeros((2, right, 4))], axis=1)
    ol = (xp.shape[1] - dilation * (k - 1) - 1) // stride + 1
    cg, og = 4 // groups, 6 // groups
    expected = np.zeros((2, ol, 6))
    for t in range(ol):
        for q in range(6):
            g = q // og
            for a in range(k):
                expected[:, t, q] += xp[:, t * stride + a * dilation, g * cg : (g + 1) * cg] @ w[a, :, q]
    expected += layer.bias.data
    got = layer(eo.tensor(x)).data
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)
    if padding == "causal":
        assert got.shape[1] == length
        # output t must not depend on inputs after t
        x2 = x.copy()
        x2[:, 5:] += 1.0
        np.testing.assert_array_equal(layer(eo.tensor(x2)).data[:, :5], got[:, :5])
    check_module_gradients(layer, f64(1, length, 4), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize(
    "h,w,k,stride,padding,output_padding,dilation",
    [
        (3, 4, 3, 1, "valid", 0, 1),
        (3, 3, 3, 2, "same", 0, 1),
        (4, 3, 2, 2, "same", 0, 1),
        (3, 3, 2, 3, "same", 0, 1),
        (3, 4, 3, 2, 1, 1, 1),
        (3, 3, 3, 2, "valid", 0, 2),
        (2, 3, (3, 2), (2, 1), ((1, 0), (0, 1)), (1, 0), 1),
    ],
)
def test_conv_transpose2d_matches_scatter_loop(h, w, k, stride, padding, output_padding, dilation):
    layer = eo.Conv2DTranspose(
        3, 2, k, stride=stride, padding=padding, output_padding=output_padding, dilation=dilation, seed=0
    ).to("float64")
    x = f64(2, h, w, 3)
    _, st, dil, crops, extra, _, out_hw = eo.conv_transpose.conv_transpose2d_geometry(
        (h, w), layer.kernel_size, stride, padding, output_padding, dilation
    )
    expected = conv_transpose_loop(x, layer.weight.data, layer.bias.data, st, crops, extra, dil)
    got = layer(eo.tensor(x)).data
    if padding == "same":
        assert got.shape[1:3] == (h * st[0], w * st[1])  # Keras's rule
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)
    check_module_gradients(layer, f64(1, h, w, 3), atol=1e-6, rtol=1e-5)


def test_conv_transpose2d_is_the_adjoint_of_conv2d():
    # <conv2d(y, W), x> == <y, conv_transpose2d(x, W)> for 'same' with stride 2 on an input of 2H rows
    wt = f64(3, 3, 4, 5)  # conv2d: 4 -> 5 channels; transpose reads it 5 -> 4
    y = f64(2, 8, 8, 4)
    x = f64(2, 4, 4, 5)
    a = np.sum(eo.conv2d(eo.tensor(y), eo.tensor(wt), stride=2, padding="same").data * x)
    b = np.sum(
        y * eo.conv_transpose2d(eo.tensor(x), eo.tensor(wt.transpose(0, 1, 3, 2)), stride=2, padding="same").data
    )
    np.testing.assert_allclose(a, b, rtol=1e-12)


def test_conv_transpose2d_matches_torch_when_available():
    torch = pytest.importorskip("torch")
    x = f64(2, 4, 5, 3)
    layer = eo.Conv2DTranspose(3, 2, 3, stride=2, padding=1, output_padding=1, dilation=1, seed=0).to("float64")
    ref = torch.nn.functional.conv_transpose2d(
        torch.tensor(x.transpose(0, 3, 1, 2)),
        torch.tensor(layer.weight.data.transpose(2, 3, 0, 1).copy()),
        torch.tensor(layer.bias.data),
        stride=2,
        padding=1,
        output_padding=1,
    )
    np.testing.assert_allclose(layer(eo.tensor(x)).data, ref.numpy().transpose(0, 2, 3, 1), rtol=1e-10, atol=1e-12)


# --- pooling, up-sampling, normalisation ------------------------------------------------
def test_global_pooling_matches_numpy_and_gradients():
    x = f64(3, 4, 5, 2)
    np.testing.assert_allclose(eo.GlobalAveragePooling2D()(eo.tensor(x)).data, x.mean(axis=(1, 2)), rtol=1e-12)
    np.testing.assert_array_equal(eo.GlobalMaxPooling2D()(eo.tensor(x)).data, x.max(axis=(1, 2)))
    assert eo.GlobalAveragePooling2D(keepdims=True)(eo.tensor(x)).shape == (3, 1, 1, 2)
    check_module_gradients(eo.GlobalAveragePooling2D(), x)
    check_module_gradients(eo.GlobalMaxPooling2D(), x)


@pytest.mark.parametrize("size", [2, (3, 2), (1, 4)])
def test_upsampling_nearest_repeats_pixels(size):
    x = f64(2, 3, 4, 2)
    sh, sw = (size, size) if isinstance(size, int) else size
    expected = x.repeat(sh, axis=1).repeat(sw, axis=2)
    np.testing.assert_array_equal(eo.UpSampling2D(size)(eo.tensor(x)).data, expected)
    check_module_gradients(eo.UpSampling2D(size), x)


@pytest.mark.parametrize("size,align_corners", [(2, False), ((3, 2), False), (2, True), ((1, 3), True)])
def test_upsampling_bilinear_matches_loop_and_gradients(size, align_corners):
    x = f64(2, 3, 4, 2)
    sh, sw = (size, size) if isinstance(size, int) else size
    layer = eo.UpSampling2D(size, interpolation="bilinear", align_corners=align_corners)
    np.testing.assert_allclose(
        layer(eo.tensor(x)).data, bilinear_loop(x, sh, sw, align_corners), rtol=1e-12, atol=1e-14
    )
    check_module_gradients(layer, x)


@pytest.mark.parametrize("align_corners", [False, True])
def test_upsampling_bilinear_matches_torch_when_available(align_corners):
    torch = pytest.importorskip("torch")
    x = f64(2, 5, 3, 4)
    ref = (
        torch.nn.functional.interpolate(
            torch.tensor(x.transpose(0, 3, 1, 2)), scale_factor=(2, 3), mode="bilinear", align_corners=align_corners
        )
        .numpy()
        .transpose(0, 2, 3, 1)
    )
    got = eo.UpSampling2D((2, 3), interpolation="bilinear", align_corners=align_corners)(eo.tensor(x)).data
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("shape,groups", [((3, 4, 5, 6), 2), ((2, 6), 3), ((2, 7, 4), 1), ((2, 3, 3, 4), 4)])
def test_groupnorm_matches_reference(shape, groups):
    c = shape[-1]
    gn = eo.GroupNorm(groups, c).to("float64")
    gn.weight.data[:] = f64(c)
    gn.bias.data[:] = f64(c)
    x = f64(*shape) * 2 + 1
    expected = np.zeros(shape)
    cg = c // groups
    for i in range(shape[0]):
        for g in range(groups):
            block = x[i, ..., g * cg : (g + 1) * cg]
            expected[i, ..., g * cg : (g + 1) * cg] = (block - block.mean()) / np.sqrt(block.var() + 1e-5)
    expected = expected * gn.weight.data + gn.bias.data
    np.testing.assert_allclose(gn(eo.tensor(x)).data, expected, rtol=1e-10, atol=1e-12)
    check_module_gradients(gn, f64(*shape), atol=1e-6, rtol=1e-5)


def test_groupnorm_matches_torch_when_available():
    torch = pytest.importorskip("torch")
    x = f64(2, 3, 4, 6)
    ref = torch.nn.functional.group_norm(torch.tensor(x.transpose(0, 3, 1, 2)), 3).numpy().transpose(0, 2, 3, 1)
    np.testing.assert_allclose(eo.GroupNorm(3, 6).to("float64")(eo.tensor(x)).data, ref, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(
    "start_axis,shape,expected",
    [(1, (2, 3, 4), (2, 12)), (2, (2, 3, 4, 5), (2, 3, 20)), (-2, (2, 3, 4, 5), (2, 3, 20)), (0, (2, 3), (6,))],
)
def test_flatten_start_axis(start_axis, shape, expected):
    x = f64(*shape)
    np.testing.assert_array_equal(eo.Flatten(start_axis=start_axis)(eo.tensor(x)).data, x.reshape(expected))


def test_flatten_start_axis_out_of_range_is_a_shape_error():
    with pytest.raises(eo.EveryOShapeError, match="start_axis 3 is out of range for an input of rank 3"):
        eo.Flatten(start_axis=3)(eo.ones(2, 3, 4))


def test_functional_ops_gradients():
    w = f64(3, 3, 2, 4) * 0.5
    check_gradients(
        lambda x, k: eo.conv2d(x, k, stride=2, padding="same", dilation=(2, 1), groups=2),
        [f64(1, 6, 5, 4), w],
        name="conv2d_grouped",
    )
    check_gradients(
        lambda x, k: eo.conv1d(x, k, padding="causal", dilation=2), [f64(2, 7, 2), f64(3, 2, 3)], name="conv1d"
    )
    check_gradients(
        lambda x, k: eo.conv_transpose2d(x, k, stride=2, padding="same"),
        [f64(1, 3, 3, 2), f64(3, 3, 2, 3)],
        name="conv_transpose2d",
    )


@pytest.mark.parametrize(
    "k,stride,padding",
    [(2, 2, "valid"), (3, 3, "valid"), (2, 3, "valid"), (3, 2, "same"), (2, 1, "valid"), (3, 3, "same")],
)
@pytest.mark.parametrize("dtype", [np.float64, np.float16])
def test_max_pool_gradient_goes_to_the_first_maximum_of_each_window(k, stride, padding, dtype):
    # Small integers give many ties (as after a ReLU); the loop hands each
    # window's gradient to its first maximum in row-major order and adds up
    # overlapping windows.
    x = np.random.default_rng(3).integers(-1, 2, (2, 7, 8, 3)).astype(dtype)
    g = np.random.default_rng(4).integers(-4, 5, eo.max_pool2d(eo.tensor(x), k, stride, padding).shape).astype(dtype)
    xt = eo.tensor(x, requires_grad=True)
    eo.max_pool2d(xt, k, stride, padding).backward(g)
    (t, _), (l, _) = eo.resolve_padding2d(padding, (7, 8), (k, k), (stride, stride))
    expected = np.zeros(x.shape)
    for i in range(g.shape[1]):
        for j in range(g.shape[2]):
            r0, c0 = i * stride - t, j * stride - l
            for n in range(2):
                for c in range(3):
                    cells = [(r, q) for r in range(r0, r0 + k) for q in range(c0, c0 + k) if 0 <= r < 7 and 0 <= q < 8]
                    best = max(x[n, r, q, c] for r, q in cells)
                    r, q = next(cell for cell in cells if x[n, cell[0], cell[1], c] == best)
                    expected[n, r, q, c] += g[n, i, j, c]
    assert xt.grad.dtype == dtype
    np.testing.assert_array_equal(xt.grad, expected.astype(dtype))


# --- the op table ------------------------------------------------------------------------
def test_new_ops_are_in_the_op_table():
    from everyo import activations, conv, conv_transpose, dispatch, upsampling

    for module in (activations, conv, conv_transpose, upsampling):
        for name in module.__all__:
            fn = getattr(module, name)
            if name.endswith("_geometry") or name == "interpolation_matrix":
                continue  # helpers on plain numbers, not ops on Tensors
            assert getattr(fn, "op", None) is dispatch.OPS[name], (
                f"{module.__name__}.{name} is not a registered primitive"
            )
    kinds = {n: dispatch.OPS[n].kind for n in ("gelu", "conv1d", "conv_transpose2d", "upsample2d")}
    assert kinds == {"gelu": "elementwise", "conv1d": "conv", "conv_transpose2d": "conv", "upsample2d": "resize"}
    assert dispatch.OPS["conv_transpose2d"].category == dispatch.LOW_PRECISION


class _Recorder:
    def __init__(self):
        self.records = []

    def record(self, name, inputs, outputs, attrs):
        self.records.append((name, inputs, outputs, attrs))

    def on_python_value(self, tensor, kind):
        pass


def test_tracing_records_the_new_layers_with_resolved_geometry():
    from everyo import dispatch

    model = eo.Sequential(
        eo.Conv2D(4, 4, 3, padding="same", dilation=2, groups=2, seed=0),
        eo.GELU(approximate="tanh"),
        eo.UpSampling2D(2, interpolation="bilinear"),
        eo.Conv2DTranspose(4, 2, 3, stride=2, padding="same", seed=1),
        eo.GlobalAveragePooling2D(),
    )
    x = eo.tensor(f64(1, 5, 5, 4).astype(np.float32))
    expected = model(x).data
    rec = _Recorder()
    token = dispatch.set_tracer(rec)
    try:
        out = model(x)
    finally:
        dispatch.reset_tracer(token)
    np.testing.assert_array_equal(out.data, expected)  # tracing changes nothing
    names = [r[0] for r in rec.records]
    assert names == ["conv2d", "gelu", "upsample2d", "conv_transpose2d", "mean"]
    conv_attrs = rec.records[0][3]
    assert conv_attrs["pads"] == ((2, 2), (2, 2)) and conv_attrs["dilation"] == (2, 2) and conv_attrs["groups"] == 2
    assert rec.records[1][3]["approximate"] == "tanh"
    assert rec.records[2][3]["size"] == (2, 2) and rec.records[2][3]["interpolation"] == "bilinear"
    t_attrs = rec.records[3][3]
    assert t_attrs["pads"] == ((0, 1), (0, 1)) and t_attrs["output_padding"] == (0, 0) and t_attrs["stride"] == (2, 2)

    rec = _Recorder()
    x1 = eo.ones(1, 6, 2)  # made before the tracer is set: eo.ones is a table op too
    token = dispatch.set_tracer(rec)
    try:
        eo.Conv1D(2, 3, 3, padding="causal", dilation=2, seed=0)(x1)
    finally:
        dispatch.reset_tracer(token)
    assert [r[0] for r in rec.records] == ["conv1d"] and rec.records[0][3]["pads"] == (4, 0)


@pytest.mark.parametrize(
    "op",
    [
        lambda x, w: eo.conv_transpose2d(x, w, stride=2, padding="same"),
        lambda x, w: eo.conv2d(x, w, padding="same", dilation=2),
        lambda x, w: eo.conv1d(eo.reshape(x, (2, 24, 3)), eo.reshape(w[:1], (3, 3, 3)), padding="causal"),
        lambda x, w: eo.upsample2d(x, 2, "bilinear"),
    ],
    ids=["conv_transpose2d", "conv2d_dilated", "conv1d", "upsample_bilinear"],
)
def test_float16_paths_are_float32_arithmetic_rounded_once(op):
    x = f64(2, 4, 6, 3).astype(np.float16)
    w = (f64(3, 3, 3, 3) * 0.3).astype(np.float16)
    got = op(eo.tensor(x), eo.tensor(w))
    ref = op(eo.tensor(x.astype(np.float32)), eo.tensor(w.astype(np.float32)))
    assert got.dtype == "float16"
    np.testing.assert_array_equal(got.data, ref.data.astype(np.float16))
    xt = eo.tensor(x, requires_grad=True)
    op(xt, eo.tensor(w)).sum().backward()
    assert xt.grad.dtype == np.float16 and np.all(np.isfinite(xt.grad))


def test_fast_normal_cdf_is_math_erfc_rounded_to_float16_within_one_ulp():
    # float32/float16 GELU uses a float32 fit (everyo.activations; its float32 bound is
    # tested in test_gelu_float32.py); float64 uses math.erfc itself.
    from everyo.activations import _normal_cdf

    x = np.concatenate([np.linspace(-16, 16, 100001), np.geomspace(1e-30, 16, 2000), -np.geomspace(1e-30, 16, 2000)])
    x32 = x.astype(np.float32)
    exact = np.array([0.5 * math.erfc(-float(v) / math.sqrt(2)) for v in x32])
    for dtype in (np.float16,):
        xs = x32.astype(dtype)
        ref = np.array([0.5 * math.erfc(-float(v) / math.sqrt(2)) for v in xs]).astype(dtype)
        got = _normal_cdf(xs)
        assert got.dtype == dtype
        ulp = np.spacing(np.abs(ref)).astype(np.float64)
        ulps = np.abs(got.astype(np.float64) - ref.astype(np.float64)) / np.where(ulp > 0, ulp, 1)
        assert ulps.max() <= 1, (dtype, ulps.max(), xs[np.argmax(ulps)])
    np.testing.assert_allclose(_normal_cdf(x32.astype(np.float64)), exact, rtol=1e-12, atol=0)
