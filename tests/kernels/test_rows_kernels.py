"""The softmax and LayerNorm row kernels (everyo.kernels.rows) against core's NumPy paths.

The kernels run the reference's arithmetic in its order with NumPy's summation
order (and the softmax's exp is NumPy's own), so the bound is 0 ulp: outputs and
gradients are bit-identical (a NaN's sign and payload aside, see _same_bits), on
random shapes (one row, width 1, widths across NumPy's 8- and 128-value summation
blocks), special values (NaN, +-inf, -0, huge, subnormal), masks of every kind
(rows fully blocked included), float32 and float64. The gradients through them
pass the finite-difference checker. Each test lowers the ops' size threshold so
that small shapes take the kernels too, and counts the kernel calls.
"""

import numpy as np
import pytest
from conftest import count_calls
from test_dense_kernels import _same_bits

import everyo as eo
from everyo import functional, kernel_table, normalization_ops
from everyo.normalization_ops import normalize
from everyo.testing import check_gradients

SPECIALS = [np.nan, np.inf, -np.inf, -0.0, 0.0, 3e38, -3e38, 1e-45, 1e30]
SOFTMAX = ("softmax_shift", "softmax_scale", "softmax_backward")
LAYER_NORM = ("layer_norm_forward", "layer_norm_backward")


@pytest.fixture(autouse=True)
def _small_shapes_take_the_kernels(monkeypatch):
    monkeypatch.setattr(functional, "_KERNEL_MIN_SIZE", 1)
    monkeypatch.setattr(normalization_ops, "_KERNEL_MIN_SIZE", 1)


def _values(rng, shape, dtype, scale=1.0, specials=True):
    x = (rng.standard_normal(shape) * scale).astype(dtype)
    flat = x.reshape(-1)
    if specials and flat.size >= 8:
        picks = rng.choice(flat.size, min(len(SPECIALS), flat.size // 4), replace=False)
        flat[picks] = np.array(SPECIALS[: picks.size], dtype)
    return x


def _softmax_grads(x, g, blocked):
    xt = eo.tensor(x, requires_grad=True)
    with np.errstate(all="ignore"):
        out = functional.softmax(xt, axis=-1, blocked=blocked)
        out.backward(eo.tensor(g))
    return out.data.copy(), xt.grad.copy()


def _both_softmax(monkeypatch, x, g, blocked):
    with kernel_table.disabled():
        want = _softmax_grads(x, g, blocked)
    calls = count_calls(monkeypatch, SOFTMAX)
    got = _softmax_grads(x, g, blocked)
    return want, got, calls


SHAPES = [(1, 1), (1, 5), (7, 1), (3, 8), (4, 9), (2, 3, 64), (3, 127), (2, 129), (5, 300), (2, 1031), (2, 4, 16, 16)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("scale", [1.0, 1e-3, 60.0])
def test_softmax_matches_numpy_path_bit_for_bit(monkeypatch, shape, scale):
    rng = np.random.default_rng(hash((shape, scale)) % 2**32)
    x, g = _values(rng, shape, np.float32, scale), _values(rng, shape, np.float32)
    want, got, calls = _both_softmax(monkeypatch, x, g, None)
    assert calls == dict.fromkeys(SOFTMAX, 1)
    for a, e in zip(got, want):
        assert _same_bits(a, e)


def _masks(rng, shape):
    """Boolean masks of every form (True = blocked), each with a fully blocked row where it has rows."""
    *lead, length, width = (1,) * (4 - len(shape)) + shape
    causal = np.triu(np.ones((length, width), bool), k=1)  # varies over the trailing axes only: used as it is
    full = rng.random(shape) < 0.4  # the scores' own shape
    full.reshape(-1, width)[0] = True
    padding = rng.random(tuple(lead[:1]) + (1,) * (len(shape) - 2) + (width,)) < 0.3  # broadcast first
    padding.reshape(-1, width)[0] = True
    row = rng.random((1, width)) < 0.5
    column = np.zeros(shape[:-1] + (1,), bool)  # a last axis of 1: broadcast first
    column.reshape(-1)[-1] = True
    return {"causal": causal, "full": full, "padding": padding, "row": row, "column": column}


@pytest.mark.parametrize("shape", [(2, 3, 5, 6), (3, 9, 9), (4, 1, 130), (1, 1)])
@pytest.mark.parametrize("form", ["causal", "full", "padding", "row", "column"])
def test_masked_softmax_matches_numpy_path_bit_for_bit(monkeypatch, shape, form):
    rng = np.random.default_rng(len(shape) * 10 + len(form))
    mask = _masks(rng, shape)[form][(Ellipsis,) if len(shape) >= 2 else ()]
    mask = mask.reshape(mask.shape[-len(shape) :]) if mask.ndim > len(shape) else mask
    x, g = _values(rng, shape, np.float32, 5.0), _values(rng, shape, np.float32)
    want, got, calls = _both_softmax(monkeypatch, x, g, mask)
    assert calls == dict.fromkeys(SOFTMAX, 1)
    for a, e in zip(got, want):
        assert _same_bits(a, e)


def test_fully_blocked_and_special_rows_behave_as_the_numpy_path(monkeypatch):
    n = 6
    x = np.array(
        [
            [1, 2, 3, 4, 5, 6],  # fully blocked by the mask: zeros, zero gradient
            [-np.inf] * n,  # every entry -inf: zeros too
            [1, np.nan, 3, 4, 5, 6],  # a NaN: the whole row NaN
            [1, np.inf, 3, 4, 5, 6],  # +inf: NaN where inf, 0 elsewhere
            [np.inf, np.nan, -np.inf, 0, 1, 2],
            [3e38, -3e38, 3e38, 0, 0, 0],
            [-1e30, -1e30, -1e30, -1e30, -1e30, -1e30],
            [0, -0.0, 0, -0.0, 0, -0.0],
        ],
        np.float32,
    )
    blocked = np.zeros_like(x, dtype=bool)
    blocked[0] = True
    blocked[5, 1] = True
    g = np.random.default_rng(0).standard_normal(x.shape).astype(np.float32)
    want, got, calls = _both_softmax(monkeypatch, x, g, blocked)
    assert calls == dict.fromkeys(SOFTMAX, 1)
    for a, e in zip(got, want):
        assert _same_bits(a, e)
    out, gx = got
    assert np.array_equal(out[:2], np.zeros((2, n), np.float32)) and np.array_equal(gx[:2], np.zeros((2, n)))
    assert np.isnan(out[2]).all() and np.isnan(out[3, 1]) and (out[3, [0, 2, 3, 4, 5]] == 0).all()


def test_other_layouts_and_types_keep_the_numpy_path(monkeypatch):
    rng = np.random.default_rng(5)
    calls = count_calls(monkeypatch, SOFTMAX)
    x = rng.standard_normal((6, 8)).astype(np.float32)
    functional.softmax(eo.tensor(x), axis=0)  # not the last axis
    functional.softmax(eo.tensor(x.T), axis=-1)  # not C-contiguous
    functional.softmax(eo.tensor(x.astype(np.float64)), axis=-1)  # float64: forward on the NumPy path
    functional.softmax(eo.tensor(x), axis=-1, blocked=np.zeros((6, 8), np.float32))  # a non-boolean mask
    assert calls == dict.fromkeys(SOFTMAX, 0)


def test_float64_softmax_gradient_takes_the_kernel_bit_for_bit(monkeypatch):
    rng = np.random.default_rng(6)
    x, g = _values(rng, (5, 33), np.float64), _values(rng, (5, 33), np.float64)
    want, got, calls = _both_softmax(monkeypatch, x, g, None)
    assert calls == {"softmax_shift": 0, "softmax_scale": 0, "softmax_backward": 1}
    for a, e in zip(got, want):
        assert _same_bits(a, e)


def test_softmax_gradient_through_the_kernel_passes_the_fd_checker(monkeypatch):
    rng = np.random.default_rng(7)
    x, w = rng.standard_normal((3, 4, 9)), rng.standard_normal((3, 4, 9))
    blocked = np.triu(np.ones((4, 9), bool), k=3)
    blocked[1] = True  # a fully blocked row: zero gradient
    calls = count_calls(monkeypatch, SOFTMAX)
    check_gradients(lambda x: eo.sum(functional.softmax(x, axis=-1, blocked=blocked) * w), [x], name="softmax")
    assert calls["softmax_backward"] >= 1


def test_attention_layer_matches_with_kernels_on_and_off(monkeypatch):
    # The layer's own masks (a causal one and a key padding one, combined) through the kernels.
    rng = np.random.default_rng(8)
    layer = eo.nn.MultiHeadAttention(16, 4, seed=0)
    x = rng.standard_normal((3, 7, 16)).astype(np.float32)
    padding = np.zeros((3, 7), bool)
    padding[1, 5:] = True
    added = np.where(rng.random((7, 7)) < 0.2, -1e9, 0.0).astype(np.float32)  # a floating mask beside them

    def run():
        for p in layer.parameters():
            p.grad = None
        xt = eo.tensor(x, requires_grad=True)
        out, weights = layer(xt, key_padding_mask=padding, attn_mask=added, is_causal=True, need_weights=True)
        (out.sum() + weights.sum()).backward()
        return [out.data.copy(), weights.data.copy(), xt.grad.copy()] + [p.grad.copy() for p in layer.parameters()]

    with kernel_table.disabled():
        want = run()
    calls = count_calls(monkeypatch, SOFTMAX)
    got = run()
    assert calls == dict.fromkeys(SOFTMAX, 1)
    for a, e in zip(got, want):
        assert _same_bits(a, e)


# --- LayerNorm -------------------------------------------------------------------------------
def _layer_norm_grads(x, g, trailing, affine, dtype):
    rng = np.random.default_rng(1)
    xt = eo.tensor(x, requires_grad=True)
    params = []
    if affine:
        w = eo.tensor(_values(rng, trailing, dtype, specials=False), requires_grad=True)
        b = eo.tensor(_values(rng, trailing, dtype, specials=False), requires_grad=True)
        params = [w, b]
    axes = tuple(range(x.ndim - len(trailing), x.ndim))
    with np.errstate(all="ignore"):
        out = normalize(xt, *params, axis=axes, eps=1e-5) if affine else normalize(xt, axis=axes)
        out.backward(eo.tensor(g))
    return [out.data.copy(), xt.grad.copy()] + [p.grad.copy() for p in params]


LN_SHAPES = [((1, 8), 1), ((5, 1), 1), ((1, 1), 1), ((3, 7, 9), 1), ((4, 64), 1), ((2, 130), 1), ((3, 300), 1),
             ((2, 1031), 1), ((3, 4, 8, 16), 2), ((2, 3, 5), 2)]  # fmt: skip


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize(("shape", "k"), LN_SHAPES)
def test_layer_norm_matches_numpy_path_bit_for_bit(monkeypatch, dtype, affine, shape, k):
    rng = np.random.default_rng(sum(shape) + k)
    trailing = shape[len(shape) - k :]
    for scale, specials in ((1.0, False), (1e4, True), (1e-20, False)):
        x, g = _values(rng, shape, dtype, scale, specials), _values(rng, shape, dtype, 1.0, specials)
        with kernel_table.disabled():
            want = _layer_norm_grads(x, g, trailing, affine, dtype)
        calls = count_calls(monkeypatch, LAYER_NORM)
        got = _layer_norm_grads(x, g, trailing, affine, dtype)
        assert calls == dict.fromkeys(LAYER_NORM, 1)
        for a, e in zip(got, want):
            assert _same_bits(a, e)


def test_layer_norm_layer_and_functional_take_the_kernels(monkeypatch):
    rng = np.random.default_rng(9)
    x = rng.standard_normal((4, 6, 32)).astype(np.float32)
    layer = eo.nn.LayerNorm(32)
    layer.weight.data[:] = rng.standard_normal(32)

    def run():
        layer.weight.grad = layer.bias.grad = None
        xt = eo.tensor(x, requires_grad=True)
        y = layer(xt) + eo.layer_norm(xt, 32) + eo.layer_norm(xt, 32, weight=layer.weight)  # the last: no bias
        (y * y).sum().backward()
        return [y.data.copy(), xt.grad.copy(), layer.weight.grad.copy(), layer.bias.grad.copy()]

    with kernel_table.disabled():
        want = run()
    calls = count_calls(monkeypatch, LAYER_NORM)
    got = run()
    assert calls == dict.fromkeys(LAYER_NORM, 3)
    for a, e in zip(got, want):
        assert _same_bits(a, e)


def test_other_normalisations_keep_the_numpy_path(monkeypatch):
    rng = np.random.default_rng(10)
    calls = count_calls(monkeypatch, LAYER_NORM)
    x = rng.standard_normal((4, 5, 5, 6)).astype(np.float32)
    eo.nn.BatchNorm2D(6)(eo.tensor(x))  # statistics over (0, 1, 2)
    eo.nn.GroupNorm(3, 6)(eo.tensor(x))  # over (1, 3) of a reshape
    normalize(eo.tensor(x), axis=-1, mean=np.zeros((4, 5, 5, 1)), var=np.ones((4, 5, 5, 1)))  # given statistics
    normalize(eo.tensor(x.transpose(0, 1, 3, 2)), axis=-1)  # not C-contiguous
    w, b = eo.tensor(np.ones(6)), eo.tensor(np.zeros(6))  # float64 parameters: computed in float64 from a copy
    normalize(eo.tensor(x), w, b, axis=-1)
    assert calls == dict.fromkeys(LAYER_NORM, 0)


def test_layer_norm_gradients_through_the_kernels_pass_the_fd_checker(monkeypatch):
    rng = np.random.default_rng(11)
    x, w, b, c = (rng.standard_normal(s) for s in ((3, 5, 12), (12,), (12,), (3, 5, 12)))
    calls = count_calls(monkeypatch, LAYER_NORM)
    check_gradients(lambda x, w, b: eo.sum(eo.layer_norm(x, 12, w, b) * c), [x, w, b], name="layer_norm")
    check_gradients(lambda x: eo.sum(eo.layer_norm(x, (5, 12)) * c), [x], name="layer_norm over two axes")
    assert calls["layer_norm_backward"] >= 2
