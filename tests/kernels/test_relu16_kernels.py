"""relu_codes / relu_codes_backward (ReLU on float16 and bfloat16 codes) against core's
NumPy path: every 16-bit code forward, every output code backward against float32
gradients with signed zeros, infinities and NaNs (a signalling one included), and core's
``relu`` on 16-bit tensors with and without the kernels, values and gradients bit for bit."""

import numpy as np
import pytest
from conftest import count_calls

import everyo as eo
from everyo import kernel_table
from everyo.half import Rounded
from everyo.kernels.relu16 import relu_codes, relu_codes_backward

ml_dtypes = pytest.importorskip("ml_dtypes")

DTYPES = [(np.dtype(np.float16), 0x7C00), (np.dtype(ml_dtypes.bfloat16), 0x7F80)]
CODES = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)


def _gradients(n, seed=0):
    rng = np.random.default_rng(seed)
    g = rng.standard_normal(n).astype(np.float32)
    special = np.array([0x80000000, 0x00000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC01234, 0x7F800001], np.uint32)
    g[rng.integers(0, n, 4000)] = special.view(np.float32)[rng.integers(0, special.size, 4000)]
    return g


@pytest.mark.parametrize(("dtype", "inf"), DTYPES, ids=["float16", "bfloat16"])
def test_forward_is_numpys_for_every_code(dtype, inf):
    out = np.empty_like(CODES)
    relu_codes(CODES, inf, out)
    want = np.multiply(CODES, np.greater_equal(np.subtract(CODES, np.uint16(0x8001)), np.uint16(inf)))
    np.testing.assert_array_equal(out, want)
    if dtype == np.float16:  # and that is np.maximum(x, 0), code for code, where x is not NaN
        x = CODES.view(np.float16)
        finite = ~np.isnan(x)
        with np.errstate(all="ignore"):
            np.testing.assert_array_equal(out[finite], np.maximum(x[finite], np.float16(0)).view(np.uint16))


def test_backward_is_numpys_product_with_the_mask_for_every_output_code():
    g = _gradients(CODES.size)
    got = g.copy()
    factors = np.array([1.0, 0.0], np.float32)
    assert relu_codes_backward(got, CODES, factors)  # the infinities meet zeros: invalid
    with np.errstate(invalid="ignore"):
        want = np.multiply(g, np.not_equal(np.bitwise_and(CODES, np.uint16(0x7FFF)), np.uint16(0)))
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    finite = np.random.default_rng(2).standard_normal(CODES.size).astype(np.float32)
    assert not relu_codes_backward(finite, CODES, factors)
    for bits, code in ((0x7F800000, 0x0000), (0xFF800000, 0x8000), (0x7F800001, 0x3C00)):
        one = np.full(CODES.size, 1.0, np.float32)
        one[77] = np.uint32(bits).view(np.float32)
        codes = np.full(CODES.size, 0x3C00, np.uint16)
        codes[77] = code
        with np.errstate(invalid="raise"), pytest.raises(FloatingPointError):
            np.multiply(one.copy(), np.not_equal(codes & 0x7FFF, 0), out=one.copy())
        assert relu_codes_backward(one, codes, factors)  # NumPy's multiply is invalid there: so is this


@pytest.fixture(autouse=True)
def _warnings_are_checked():
    with np.errstate(invalid="warn"):
        yield


def _relu_step(dtype, seed):
    """relu of a 16-bit (128, 512) tensor with both kinds of incoming gradient: a Rounded
    (what a 16-bit matmul hands on) and a plain 16-bit array."""
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 1 << 16, (128, 512), dtype=np.uint32).astype(np.uint16)
    bits[:, :256] = CODES.reshape(128, 512)[:, :256]  # every code's first half, the rest random
    x = eo.tensor(bits.view(dtype), requires_grad=True)
    y = eo.relu(x)
    g = _gradients(y.data.size, seed).reshape(y.data.shape)
    with np.errstate(all="ignore"):
        g16 = g.astype(dtype)
    from_rounded = y._backward(Rounded(g16.astype(np.float32), dtype))[0]
    from_array = y._backward(g16.copy())[0]
    return y.data, from_rounded.f32 if isinstance(from_rounded, Rounded) else from_rounded, from_array


@pytest.mark.parametrize(("dtype", "inf"), DTYPES, ids=["float16", "bfloat16"])
def test_core_relu_on_16_bit_tensors_is_the_same_with_and_without_the_kernels(monkeypatch, dtype, inf):
    with kernel_table.disabled(), pytest.warns(RuntimeWarning, match="invalid"):
        want = _relu_step(dtype, 3)
    calls = count_calls(monkeypatch, ("relu_codes", "relu_codes_backward"))
    with pytest.warns(RuntimeWarning, match="invalid"):
        got = _relu_step(dtype, 3)
    assert calls == {"relu_codes": 1, "relu_codes_backward": 1}
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))
    # an inf gradient where the output is 0: NumPy's warning, and its error under errstate
    with kernel_table.disabled(), pytest.warns(RuntimeWarning, match="invalid"):
        _relu_step(dtype, 3)
    with pytest.warns(RuntimeWarning, match="invalid"):
        got = _relu_step(dtype, 3)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))


def test_bfloat16_mlp_training_identical_with_and_without_kernels():
    amp = pytest.importorskip("everyo.amp")
    rng = np.random.default_rng(1)
    x = eo.tensor(rng.standard_normal((512, 64)).astype(np.float32))
    y = eo.tensor(rng.standard_normal((512, 1)).astype(np.float32))
    weights = []
    for off in (True, False):
        model = eo.Sequential(eo.Linear(64, 128, seed=0), eo.ReLU(), eo.Linear(128, 1, seed=1))
        opt = eo.SGD(model.parameters(), lr=0.05)
        with kernel_table.disabled() if off else np.errstate():
            for _ in range(3):
                opt.zero_grad()
                with amp.autocast(dtype="bfloat16"):
                    out = model(x)
                eo.mse_loss(out, y).backward()
                opt.step()
        weights.append([p.data.copy() for p in model.parameters()])
    for a, b in zip(*weights):
        np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))
