"""Normalisation layers on 16-bit activations (Keras's mixed_float16 rule):
statistics and normalisation in float32, the output rounded once to the
input's type, parameters and running statistics float32, and backward keeping
16-bit activations only."""

import tracemalloc

import numpy as np
import pytest

import everyo as eo

RNG = np.random.default_rng(0)


def _layers():
    return {
        "BatchNorm1D": (lambda: eo.BatchNorm1D(6), (64, 6), (0,)),
        "BatchNorm1D_seq": (lambda: eo.BatchNorm1D(6), (8, 5, 6), (0, 1)),
        "BatchNorm2D": (lambda: eo.BatchNorm2D(6), (16, 5, 5, 6), (0, 1, 2)),
        "LayerNorm": (lambda: eo.LayerNorm(6), (16, 7, 6), (2,)),
        "LayerNorm_2d": (lambda: eo.LayerNorm((5, 6)), (16, 5, 6), (1, 2)),
        "GroupNorm": (lambda: eo.GroupNorm(3, 6), (8, 4, 4, 6), None),
    }


LAYERS = _layers()


def _dtype(name):
    if name == "bfloat16":
        return np.dtype(pytest.importorskip("ml_dtypes").bfloat16)
    return np.dtype(np.float16)


def _randomize(layer):
    # Non-trivial scale and shift, so the affine part is exercised.
    for p in layer.parameters():
        p.data = RNG.uniform(0.5, 1.5, p.data.shape).astype(np.float32)
    return layer


def _reference(x32, layer, axes):
    """Plain NumPy float32: (x - mean) / sqrt(var + eps) * w + b."""
    if isinstance(layer, eo.GroupNorm):
        n, c, g = x32.shape[0], x32.shape[-1], layer.num_groups
        grouped = x32.reshape(n, -1, g, c // g)
        m = grouped.mean(axis=(1, 3), keepdims=True)
        v = ((grouped - m) ** 2).mean(axis=(1, 3), keepdims=True)
        y = ((grouped - m) / np.sqrt(v + np.float32(layer.eps))).reshape(x32.shape)
    else:
        m = x32.mean(axis=axes, keepdims=True)
        v = ((x32 - m) ** 2).mean(axis=axes, keepdims=True)
        y = (x32 - m) / np.sqrt(v + np.float32(layer.eps))
    return y * layer.weight.data + layer.bias.data


@pytest.mark.parametrize("low", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", sorted(LAYERS))
def test_output_is_the_float32_result_rounded_once(name, low):
    make, shape, axes = LAYERS[name]
    dt = _dtype(low)
    layer = _randomize(make())
    x16 = eo.tensor((RNG.standard_normal(shape) * 3 + 1).astype(np.float32).astype(dt))
    x32 = eo.tensor(x16.data.astype(np.float32))
    with eo.autocast(dtype=low):
        y16 = layer(x16)
    y32 = _randomize_copy(make, layer)(x32)
    assert y16.dtype == dt
    # Bit for bit: the same float32 computation as for the float32 input, rounded once ...
    np.testing.assert_array_equal(y16.data.view(np.uint16), y32.data.astype(dt).view(np.uint16))
    # ... and that computation is the plain float32 formula (to float32 rounding).
    np.testing.assert_allclose(y32.data, _reference(x32.data, layer, axes), rtol=1e-5, atol=1e-5)


def _randomize_copy(make, layer):
    other = make()
    other.load_state_dict(layer.state_dict())
    return other


@pytest.mark.parametrize("low", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", sorted(LAYERS))
def test_gradients_match_float32_within_16bit_rounding(name, low):
    make, shape, _ = LAYERS[name]
    dt = _dtype(low)
    layer16 = _randomize(make())
    layer32 = _randomize_copy(make, layer16)
    base = (RNG.standard_normal(shape) * 2).astype(np.float32).astype(dt).astype(np.float32)
    upstream = RNG.standard_normal(shape).astype(np.float32).astype(dt)
    x16 = eo.tensor(base.astype(dt), requires_grad=True)
    x32 = eo.tensor(base, requires_grad=True)
    with eo.autocast(dtype=low):
        y16 = layer16(x16)
    y16.backward(upstream)
    layer32(x32).backward(upstream.astype(np.float32))
    assert x16.grad.dtype == dt
    assert all(p.grad.dtype == np.float32 for p in layer16.parameters())
    # float32 gradients rounded once to the 16-bit type (dx) or exact float32 (dw, db):
    rtol = 2.0**-10 if low == "float16" else 2.0**-7
    scale = np.abs(x32.grad).max()
    np.testing.assert_allclose(x16.grad.astype(np.float32), x32.grad, rtol=rtol, atol=rtol * scale)
    for p16, p32 in zip(layer16.parameters(), layer32.parameters()):
        np.testing.assert_allclose(p16.grad, p32.grad, rtol=1e-5, atol=1e-5 * np.abs(p32.grad).max())


@pytest.mark.parametrize("name", ["BatchNorm1D", "BatchNorm2D"])
def test_running_statistics_stay_float32_and_match(name):
    make, shape, _ = LAYERS[name]
    bn16, bn32 = make(), make()
    x = (RNG.standard_normal(shape) + 2).astype(np.float16)
    with eo.autocast():
        bn16(eo.tensor(x))
    bn32(eo.tensor(x.astype(np.float32)))
    for name_ in ("running_mean", "running_var"):
        a, b = getattr(bn16, name_).data, getattr(bn32, name_).data
        assert a.dtype == np.float32
        np.testing.assert_array_equal(a, b)
    bn16.eval()
    with eo.autocast():
        y = bn16(eo.tensor(x))
    assert y.dtype == np.float16
    np.testing.assert_array_equal(y.data, bn32.eval()(eo.tensor(x.astype(np.float32))).data.astype(np.float16))


def _held(fn):
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    out = fn()
    held = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    del out
    return held


@pytest.mark.parametrize(
    "norm, shape",
    [(eo.BatchNorm2D(16), (128, 8, 8, 16)), (eo.LayerNorm(16), (128, 32, 16)), (eo.GroupNorm(4, 16), (128, 8, 8, 16))],
    ids=["BatchNorm2D", "LayerNorm", "GroupNorm"],
)
@pytest.mark.usefixtures("numpy_conversions")  # tracemalloc counts NumPy's allocations only
def test_backward_keeps_no_float32_copy_of_the_activations(norm, shape):
    # linear -> norm -> ReLU: what the graph holds under autocast against float32
    # (the 16-bit activations are half the bytes; a float32 copy anywhere would show).
    c = shape[-1]
    conv = eo.Linear(c, c, seed=0)
    x32 = eo.tensor(RNG.standard_normal(shape).astype(np.float32))
    x16 = x32.astype("float16")  # as a previous 16-bit layer would hand it over

    def run(enabled):
        def fn():
            with eo.autocast(enabled):
                return eo.relu(norm(conv(x16 if enabled else x32)))

        fn()  # warm-up
        return _held(fn)

    assert run(True) <= 0.6 * run(False)
