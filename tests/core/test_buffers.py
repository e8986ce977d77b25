"""Recycled result buffers (everyo._buffers): a buffer is reused only once nothing refers to it."""

import sys

import numpy as np
import pytest

import everyo as eo
from everyo import _buffers

BIG = (256, 256)  # 256 KiB of float32: above _buffers.MIN_BYTES, so pooled


def _big(seed):
    return eo.tensor(np.random.default_rng(seed).standard_normal(BIG).astype(np.float32))


def held_result_survives(make_holder):
    """Keep something derived from a dropped op result, run many same-shape ops that
    would reuse a free buffer, and say whether what was kept still has its values."""
    a, b = _big(0), _big(1)
    holder, read = make_holder(a, b)
    expected = np.array(read(holder), copy=True)
    for _ in range(8):
        c = eo.relu(a) * b + a  # fresh results of the same shape and dtype
        del c
        eo.matmul(b, a)
    return np.array_equal(read(holder), expected)


HOLDERS = {
    # the array of a result whose Tensor is gone
    "array": lambda a, b: ((a * b).data, lambda h: h),
    # a view of it (the view refers to its base)
    "view": lambda a, b: ((a + b).data[::2, 1:], lambda h: h),
    # a memoryview of it (the buffer protocol keeps the exporter)
    "memoryview": lambda a, b: (memoryview(eo.matmul(a, b).data), lambda h: np.asarray(h)),
    # a Tensor made from it
    "tensor": lambda a, b: (eo.tensor((a - b).data), lambda h: h.data),
}


@pytest.mark.parametrize("kind", sorted(HOLDERS))
def test_a_held_result_is_never_recycled(kind):
    assert held_result_survives(HOLDERS[kind])


def test_the_check_catches_a_pool_that_ignores_references(monkeypatch):
    # The same check against a pool that counts one reference too many as free:
    # the held array is then handed out again and overwritten. This is what
    # test_a_held_result_is_never_recycled would see if the pool were wrong.
    _buffers.clear()
    monkeypatch.setattr(_buffers, "_UNREFERENCED", _buffers._UNREFERENCED + 1)
    assert not held_result_survives(HOLDERS["array"])
    monkeypatch.undo()
    _buffers.clear()


def test_the_check_catches_a_pool_that_ignores_views(monkeypatch):
    # A view of a pooled float array refers to the byte array the pooled array views, not
    # to the pooled array: a pool that counted only the pooled array's references would
    # hand it out again while the view still reads it.
    _buffers.clear()
    monkeypatch.setattr(_buffers, "_BASE_UNREFERENCED", _buffers._BASE_UNREFERENCED + 1)
    assert not held_result_survives(HOLDERS["view"])
    monkeypatch.undo()
    _buffers.clear()


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_pooled_float_arrays_start_on_a_page_boundary(dtype):
    # 4K aliasing (see the module doc): arrays malloc placed one after the other started
    # 16 bytes apart modulo 4 KiB. Every pooled float array, fresh or recycled, of any
    # size above MIN_BYTES, now starts at the same offset: 0 modulo PAGE.
    _buffers.clear()
    held = []
    for rows in (64, 257, 1000, 64):
        a = _buffers.empty((rows, 1031), dtype)
        assert a.flags.c_contiguous and a.dtype == dtype and a.shape == (rows, 1031)
        assert a.__array_interface__["data"][0] % _buffers.PAGE == 0
        assert a.base.nbytes <= a.nbytes + _buffers.PAGE
        held.append(a)
    again = _buffers.empty((64, 1031), dtype)  # nothing free of this shape: a new one
    assert again.__array_interface__["data"][0] % _buffers.PAGE == 0
    del held, again
    recycled = _buffers.empty((64, 1031), dtype)
    assert recycled.__array_interface__["data"][0] % _buffers.PAGE == 0
    assert _buffers.stats()["free_bytes"] > 0  # the other (64, 1031) one is free again


def test_non_float_arrays_are_pooled_as_numpy_makes_them():
    _buffers.clear()
    a = _buffers.empty((512, 512), np.int32)
    assert a.base is None and a.dtype == np.int32
    del a
    b = _buffers.empty((512, 512), np.int32)
    assert b.base is None and _buffers.stats()["arrays"] == 1


def test_a_free_buffer_is_reused():
    a, b = _big(2), _big(3)
    first = (a * b).data
    address = first.__array_interface__["data"][0]
    del first
    again = (a * b).data
    assert again.__array_interface__["data"][0] == address
    np.testing.assert_array_equal(again, a.data * b.data)


def test_a_kept_gradient_survives_the_next_backward():
    w = eo.Parameter(np.random.default_rng(4).standard_normal(BIG).astype(np.float32))
    x = _big(5)
    eo.sum(eo.matmul(x, w)).backward()
    kept = w.grad
    expected = kept.copy()
    w.grad = None  # what zero_grad does
    eo.sum(eo.relu(eo.matmul(x, w)) * 3.0).backward()
    np.testing.assert_array_equal(kept, expected)
    assert w.grad is not kept


def test_saved_activations_are_not_overwritten_before_backward():
    # Many same-shape results alive in one graph, and more made between forward and
    # backward: the gradient must equal plain NumPy's.
    rng = np.random.default_rng(6)
    xs = rng.standard_normal(BIG).astype(np.float32)
    ws = [rng.standard_normal((256, 256)).astype(np.float32) * 0.05 for _ in range(3)]
    x = eo.tensor(xs, requires_grad=True)
    h = x
    for w in ws:
        h = eo.relu(eo.matmul(h, eo.tensor(w))) + h
    loss = eo.sum(h * h)
    for _ in range(4):  # churn: results made and dropped while the graph is alive
        churn = (eo.relu(x) * x).data
        del churn
    loss.backward()
    # plain NumPy reference
    zs, hn = [], xs
    for w in ws:
        z = hn @ w
        zs.append(z)
        hn = np.maximum(z, 0) + hn
    g = 2 * hn
    for z, w in zip(reversed(zs), reversed(ws)):
        g = ((g * (z > 0)) @ w.T) + g
    np.testing.assert_allclose(x.grad, g, rtol=1e-5, atol=1e-4)


def test_small_arrays_are_not_pooled():
    _buffers.clear()
    before = _buffers.stats()["arrays"]
    a = eo.tensor(np.ones((8, 8), np.float32))
    small = (a * a).data
    assert small.shape == (8, 8)
    assert _buffers.stats()["arrays"] == before


def test_unused_arrays_are_bounded(monkeypatch):
    _buffers.clear()
    monkeypatch.setattr(_buffers, "MAX_FREE_BYTES", 2 * 1024 * 1024)
    for rows in range(256, 256 + 40):
        a = eo.tensor(np.ones((rows, 256), np.float32))
        dropped = (a + a).data  # a new shape each time, dropped at once
        del dropped
    assert _buffers.stats()["free_bytes"] <= 2 * 1024 * 1024 + 300 * 256 * 4
    held = (a + a).data  # in use: never dropped by the bound
    _buffers.clear()
    assert held.sum() == 2 * held.size


def _owner(array):
    return array if array.base is None else array.base


def _pooled(array):
    """Whether ``array`` (or the array it views) is one of the calling thread's pooled buffers."""
    return any(_owner(array) is _owner(kept) for arrays in _buffers._pool().arrays.values() for kept in arrays)


def _leaf(seed, shape=BIG):
    return eo.Parameter(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


# Each of these results was a fresh array every step (the transformer encoder's untuned step:
# 6,874 page faults -> 1,953 once they came from the pool); the values must not change. A leaf's
# .grad is always copied into the pool, so the gradients are caught where they reach an
# intermediate result (a hook sees the array the op's backward returned).
def _gradient_reaching(t):
    seen = []
    t.register_hook(lambda g: seen.append(g))
    return seen


def test_mul_gradients_come_from_the_pool():
    a, b = _leaf(10), _leaf(11)
    h = eo.relu(a)
    seen = _gradient_reaching(h)
    eo.sum(h * b).backward()
    assert _pooled(seen[0])
    np.testing.assert_array_equal(seen[0], b.data)


def test_a_gradient_sum_comes_from_the_pool():
    a, b, c = _leaf(12), _leaf(13), _leaf(14)
    h = eo.relu(a)
    seen = _gradient_reaching(h)
    (eo.sum(h * b) + eo.sum(h * c)).backward()  # h receives two gradients: autograd adds them
    assert _pooled(seen[0])
    np.testing.assert_array_equal(seen[0], b.data + c.data)


def test_split_gradient_comes_from_the_pool():
    x, w0, w1 = _leaf(15), _leaf(16, (256, 128)), _leaf(17, (256, 128))
    h = eo.relu(x)
    seen = _gradient_reaching(h)
    p0, p1 = eo.chunk(h, 2, dim=-1)
    (eo.sum(p0 * w0) + eo.sum(p1 * w1)).backward()
    assert _pooled(seen[0])
    np.testing.assert_array_equal(seen[0], np.concatenate([w0.data, w1.data], axis=-1))


def test_a_narrow_linear_computes_into_the_pool():
    # A narrow input (32 -> 128) takes linear's bias-in-the-product path.
    layer = eo.Linear(32, 128, seed=0)
    x = eo.tensor(np.random.default_rng(18).standard_normal((2048, 32)).astype(np.float32))
    y = layer(x)
    assert _pooled(y.data)
    np.testing.assert_allclose(y.data, x.data @ layer.weight.data + layer.bias.data, rtol=1e-5, atol=1e-5)


# GELU (the GPT's feed-forward) and the other smooth activations: their results and
# gradients were fresh arrays every step; the bits must be the old expressions'.
def test_gelu_and_its_gradient_come_from_the_pool(monkeypatch):
    from everyo import activations
    from everyo.activations import _gelu_derivative, _normal_cdf

    monkeypatch.setattr(activations, "_gelu_compiled", lambda a: None)  # core's NumPy path (kernels on or off)
    a = _leaf(19)
    h = eo.relu(a) - 0.5
    seen = _gradient_reaching(h)
    y = eo.gelu(h)
    assert _pooled(y.data)
    x = h.data
    cdf = _normal_cdf(x)
    np.testing.assert_array_equal(y.data.view(np.uint32), (x * cdf).view(np.uint32))
    g = np.random.default_rng(20).standard_normal(BIG).astype(np.float32)
    eo.sum(y * eo.tensor(g)).backward()
    assert _pooled(seen[0])
    np.testing.assert_array_equal(seen[0].view(np.uint32), (g * _gelu_derivative(x, x * cdf, cdf)).view(np.uint32))


@pytest.mark.parametrize("name", ["gelu", "gelu_tanh", "silu", "elu", "leaky_relu", "softplus"])
def test_activation_results_and_gradients_keep_their_bits(name, monkeypatch):
    # g * derivative is now written into the derivative's own array, and GELU's x * Phi(x)
    # into a recycled one; with that turned off (_c_float false: the fresh arrays of
    # before) every result and gradient has the same bits.
    from everyo import activations

    x = np.random.default_rng(21).standard_normal(BIG).astype(np.float32) * 3
    g = eo.tensor(np.random.default_rng(22).standard_normal(BIG).astype(np.float32))
    op = (lambda t: eo.gelu(t, approximate="tanh")) if name == "gelu_tanh" else getattr(eo, name)

    def run():
        t = eo.tensor(x, requires_grad=True)
        y = op(t)
        eo.sum(y * g).backward()
        return y.data.copy(), t.grad.copy()

    y, grad = run()
    monkeypatch.setattr(activations, "_c_float", lambda a: False)
    y_fresh, grad_fresh = run()
    np.testing.assert_array_equal(y.view(np.uint32), y_fresh.view(np.uint32))  # bit for bit
    np.testing.assert_array_equal(grad.view(np.uint32), grad_fresh.view(np.uint32))


def _bits(array):
    return np.ascontiguousarray(array).view(np.uint32)


@pytest.mark.parametrize("masked", [False, True])
def test_softmax_and_its_gradient_come_from_the_pool(masked, monkeypatch):
    # Attention's probabilities: the reference NumPy path (everyo-kernels' rows already pool).
    from everyo import functional

    monkeypatch.setattr(functional, "_softmax_rows", lambda *args: None)
    monkeypatch.setattr(functional, "_softmax_rows_backward", lambda *args: None)
    rng = np.random.default_rng(23)
    shape = (4, 4, 64, 64)
    blocked = np.triu(np.ones((64, 64), dtype=bool), k=1) if masked else None
    a = eo.Parameter(rng.standard_normal(shape).astype(np.float32))
    h = a * 1.0
    seen = _gradient_reaching(h)
    y = eo.softmax(h, axis=-1, blocked=blocked)
    assert _pooled(y.data)
    g = rng.standard_normal(shape).astype(np.float32)
    eo.sum(y * eo.tensor(g)).backward()
    assert _pooled(seen[0])
    # the old expressions, fresh arrays
    x = np.where(blocked, -np.inf, a.data) if masked else a.data
    peak = x.max(axis=-1, keepdims=True, initial=-np.inf)
    e = np.exp(x - np.where(np.isfinite(peak), peak, 0).astype(np.float32))
    total = e.sum(axis=-1, keepdims=True)
    out = e / np.where(total == 0, 1, total).astype(np.float32)
    np.testing.assert_array_equal(_bits(y.data), _bits(out))
    gx = g * out
    np.testing.assert_array_equal(_bits(seen[0]), _bits((g - gx.sum(axis=-1, keepdims=True)) * out))


def test_a_reshape_that_copies_copies_into_the_pool():
    # Attention's heads merged back: (batch, heads, length, dim) -> (batch, length, heads * dim).
    a = _leaf(24, (8, 4, 64, 32))
    h = eo.relu(a)
    seen = _gradient_reaching(h)
    moved = eo.transpose(h, (0, 2, 1, 3))
    merged = eo.reshape(moved, (8, 64, 128))
    assert _pooled(merged.data)
    np.testing.assert_array_equal(merged.data, moved.data.reshape(8, 64, 128))
    g = np.random.default_rng(25).standard_normal((8, 64, 128)).astype(np.float32)
    eo.sum(
        eo.reshape(merged, (8, 64, 4, 32)).transpose((0, 2, 1, 3))
        * eo.tensor(g.reshape(8, 64, 4, 32).transpose(0, 2, 1, 3))
    ).backward()
    assert _pooled(seen[0])
    np.testing.assert_array_equal(seen[0], g.reshape(8, 64, 4, 32).transpose(0, 2, 1, 3))
    view = eo.reshape(h, (8, 4, 2048))  # a reshape that needs no copy stays a view
    assert np.shares_memory(view.data, h.data)


def test_a_broadcast_mul_gradient_comes_from_the_pool():
    # A scale or a per-feature weight: g * w broadcast to g's shape.
    a, w = _leaf(26), _leaf(27, (256,))
    h = eo.relu(a)
    seen = _gradient_reaching(h)
    g = np.random.default_rng(28).standard_normal(BIG).astype(np.float32)
    eo.sum(h * w * eo.tensor(g)).backward()
    assert _pooled(seen[0])
    np.testing.assert_array_equal(_bits(seen[0]), _bits(g * w.data))


# The recurrent weight's gradient (prev^T @ d) and the transposed weight blocks each
# backward copies were fresh arrays every step; with the old expressions back the bits
# must be the same.
SCANS = {
    "rnn": (4, lambda xp, h0, w, b: eo.recurrent_ops.rnn_scan(xp, h0, w, "tanh")),
    "lstm": (16, lambda xp, h0, w, b: eo.recurrent_ops.lstm_scan(xp, h0, h0 * 0.5, w)),
    "gru": (12, lambda xp, h0, w, b: eo.recurrent_ops.gru_scan(xp, h0, w, b)),
}


@pytest.mark.parametrize("kind", sorted(SCANS))
def test_the_recurrent_weight_gradient_comes_from_the_pool(kind, monkeypatch):
    from everyo import recurrent_ops

    hidden, batch, steps = 256, 16, 10  # the RNN's (256, 256) gradient: above MIN_BYTES
    width, scan = SCANS[kind]
    gates = width // 4
    rng = np.random.default_rng(30)
    xs = rng.standard_normal((batch, steps, gates * hidden)).astype(np.float32)
    h0s = rng.standard_normal((batch, hidden)).astype(np.float32)
    ws = (rng.standard_normal((hidden, gates * hidden)) * 0.1).astype(np.float32)
    bs = rng.standard_normal(gates * hidden).astype(np.float32)
    gs = rng.standard_normal((batch, steps, hidden)).astype(np.float32)

    def run():
        xp, h0 = eo.tensor(xs, requires_grad=True), eo.tensor(h0s, requires_grad=True)
        w_leaf = eo.Parameter(ws)
        w = w_leaf * 1.0  # not a leaf: a hook sees the array the scan's backward returned
        seen = []
        w.register_hook(seen.append)
        out = scan(xp, h0, w, eo.tensor(bs, requires_grad=True))[0]
        eo.sum(out * eo.tensor(gs)).backward()
        return seen[0], xp.grad.copy(), h0.grad.copy()

    dw, dx, dh0 = run()
    assert _pooled(dw)
    # the old expressions: fresh copies and a fresh product
    monkeypatch.setattr(recurrent_ops, "_contiguous", lambda a, dt: np.ascontiguousarray(a, dtype=dt))
    monkeypatch.setattr(recurrent_ops, "_weight_grad", lambda prev, d, dt: recurrent_ops._blas.matmul(prev.T, d))
    for new, old in zip((dw, dx, dh0), run()):
        np.testing.assert_array_equal(new.view(np.uint32), old.view(np.uint32))


def test_dropout_and_its_gradient_come_from_the_pool():
    # The same draws from the generator, the same mask and products as the fresh arrays gave.
    a = _leaf(31)
    h = eo.relu(a)
    seen = _gradient_reaching(h)
    y = eo.dropout(h, 0.3, True, np.random.default_rng(32))
    assert _pooled(y.data)
    g = np.random.default_rng(33).standard_normal(BIG).astype(np.float32)
    eo.sum(y * eo.tensor(g)).backward()
    assert _pooled(seen[0])
    mask = (np.random.default_rng(32).random(BIG) >= 0.3) * np.asarray(1 / 0.7, np.float32)
    np.testing.assert_array_equal(_bits(y.data), _bits(h.data * mask))
    np.testing.assert_array_equal(_bits(seen[0]), _bits(g * mask))


# LayerNorm's NumPy path (the GPT's untuned step: ~8.5k of its ~9k page faults a step were
# LayerNorm's fresh arrays): the centred input, its square, x_hat, g * x_hat, g * w and the
# input gradient now come from the pool; outputs and gradients keep their bits.
def _layer_norm_reference(x, w, b, g, eps=1e-5):
    """The old expressions, fresh arrays: normalize's forward and backward over the last axis."""
    mu = x.mean(axis=-1, keepdims=True)
    y = x - mu
    variance = np.multiply(y, y).sum(axis=-1, keepdims=True) / x.shape[-1]
    std = np.sqrt(variance + np.float32(eps))
    y = y / std * w + b
    rstd = np.float32(1.0) / std
    xhat = (x - mu) * rstd
    scratch = g * xhat
    gweight = scratch.sum(axis=(0, 1))
    gxhat = g * w
    m2 = (gxhat * xhat).mean(axis=-1, keepdims=True)
    m1 = gxhat.mean(axis=-1, keepdims=True)
    gx = (gxhat - m1 - xhat * m2) * rstd
    return y, gx, gweight, g.sum(axis=(0, 1))


def _numpy_normalize(monkeypatch):
    from everyo import normalization_ops

    monkeypatch.setattr(normalization_ops, "_rows_kernel", lambda *args: None)  # kernels on or off
    return normalization_ops


def test_layer_norm_and_its_gradients_come_from_the_pool(monkeypatch):
    _numpy_normalize(monkeypatch)
    from everyo.normalization_ops import normalize

    shape = (8, 64, 128)
    rng = np.random.default_rng(34)
    a = _leaf(35, shape)
    w = eo.Parameter(rng.standard_normal(128).astype(np.float32))
    b = eo.Parameter(rng.standard_normal(128).astype(np.float32))
    h = a * 1.0
    seen = _gradient_reaching(h)
    y = normalize(h, w, b, -1, 1e-5)
    assert _pooled(y.data)
    g = rng.standard_normal(shape).astype(np.float32)
    eo.sum(y * eo.tensor(g)).backward()
    assert _pooled(seen[0])  # no copy of the gradient on its way out (it has x's type already)
    out, gx, gw, gb = _layer_norm_reference(a.data, w.data, b.data, g)
    np.testing.assert_array_equal(_bits(y.data), _bits(out))
    np.testing.assert_array_equal(_bits(seen[0]), _bits(gx))
    np.testing.assert_array_equal(_bits(w.grad), _bits(gw))
    np.testing.assert_array_equal(_bits(b.grad), _bits(gb))


NORMALIZE_CASES = {
    # (input shape, axis, parameter shape or None, given statistics, transposed input)
    "layer": ((8, 64, 128), -1, (128,), False, False),
    "plain": ((8, 64, 128), -1, None, False, False),
    "batch": ((64, 32, 8, 8), (0, 2, 3), (1, 32, 1, 1), False, False),
    "running": ((64, 32, 8, 8), (0, 2, 3), (1, 32, 1, 1), True, False),
    "running_plain": ((64, 32, 8, 8), (0, 2, 3), None, True, False),
    "transposed": ((128, 64, 8), 0, None, False, True),
}


@pytest.mark.parametrize("case", sorted(NORMALIZE_CASES))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_normalize_keeps_its_bits(case, dtype, monkeypatch):
    # The same op with the pool turned off (_buffers.out_for gives None: the fresh arrays of before):
    # every output and gradient has the same bits, pooled or not, contiguous input or not.
    _numpy_normalize(monkeypatch)
    from everyo.normalization_ops import normalize

    shape, axis, pshape, given, transposed = NORMALIZE_CASES[case]
    rng = np.random.default_rng(36)
    xs = (rng.standard_normal(shape) * 3 + 1).astype(dtype)
    xs = xs.transpose(2, 1, 0) if transposed else xs
    gs = rng.standard_normal(xs.shape).astype(dtype)
    ps = [rng.standard_normal(pshape).astype(dtype) for _ in range(2)] if pshape else []
    stats = (rng.random(pshape or (1,)).astype(dtype), rng.random(pshape or (1,)).astype(dtype) + 0.5)

    def run():
        x = eo.tensor(xs, requires_grad=True)
        params = [eo.Parameter(p) for p in ps] or [None, None]
        y = normalize(x * 1.0, *params, axis, 1e-5, *(stats if given else (None, None)))
        eo.sum(y * eo.tensor(gs)).backward()
        return [y.data.copy(), x.grad.copy()] + [p.grad.copy() for p in params if p is not None]

    pooled = run()
    monkeypatch.setattr(_buffers, "out_for", lambda *args, **kwargs: None)
    fresh = run()
    view = np.uint64 if dtype == np.float64 else np.uint32
    for new, old in zip(pooled, fresh, strict=True):
        np.testing.assert_array_equal(np.ascontiguousarray(new).view(view), np.ascontiguousarray(old).view(view))


# The losses: cross-entropy's log-softmax and its gradient (the GPT's logits) and MSE's
# difference and gradient (the encoder) were fresh arrays every step; the old expressions
# must give the same bits.
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_cross_entropy_and_its_gradient_come_from_the_pool(smoothing):
    rng = np.random.default_rng(37)
    a = _leaf(38, (2048, 65))
    h = a * 1.0
    seen = _gradient_reaching(h)
    t = rng.integers(0, 65, 2048)
    t[::7] = -100
    loss = eo.cross_entropy(h, t, label_smoothing=smoothing)
    loss.backward()
    assert _pooled(seen[0])
    z = a.data
    shifted = z - z.max(axis=-1, keepdims=True)
    e = np.exp(shifted)
    total = e.sum(axis=-1, keepdims=True)
    logp, p = shifted - np.log(total), e / total
    valid = t != -100
    index = np.where(valid, t, 0)
    rows = np.arange(2048)
    wt = valid.astype(np.float32)
    per = np.where(valid, -wt * logp[rows, index], 0)
    if smoothing:
        per = (1 - smoothing) * per + (smoothing / 65) * np.where(valid, -logp.sum(axis=1), 0)
    scale = np.asarray(1.0 / np.asarray(wt.sum(), np.float32), np.float32)
    np.testing.assert_array_equal(_bits(loss.data), _bits(np.asarray(per.sum() / wt.sum(), np.float32)))
    gi = np.broadcast_to(np.float32(1.0) * scale, per.shape)
    d = np.zeros_like(logp)
    d[rows, index] = -(1 - smoothing) * wt * gi
    if smoothing:
        d -= (smoothing / 65) * (gi * valid)[:, None] * 1.0
    np.testing.assert_array_equal(_bits(seen[0]), _bits(d - p * d.sum(axis=-1, keepdims=True)))


@pytest.mark.parametrize("name", ["mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss"])
def test_pointwise_losses_keep_their_bits(name, monkeypatch):
    # With the pool off (_buffers.out_for gives None: the fresh arrays of before) every loss
    # and gradient has the same bits; MSE's difference and gradient come from the pool.
    rng = np.random.default_rng(39)
    xs, ys = (rng.standard_normal((32, 64, 128)).astype(np.float32) for _ in range(2))

    def run():
        x, y = eo.tensor(xs, requires_grad=True), eo.tensor(ys, requires_grad=True)
        h = x * 1.0
        seen = _gradient_reaching(h)
        loss = getattr(eo, name)(h, y)
        loss.backward()
        return seen[0], [loss.data.copy(), x.grad.copy(), y.grad.copy()]

    grad, pooled = run()
    if name == "mse_loss":
        assert _pooled(grad)
    monkeypatch.setattr(_buffers, "out_for", lambda *args, **kwargs: None)
    _, fresh = run()
    for new, old in zip(pooled, fresh, strict=True):
        np.testing.assert_array_equal(_bits(new), _bits(old))
    if name == "mse_loss":  # and the old expression: g * scale spread, times 2 * d
        scale = np.asarray(1.0 / np.float32(xs.size), np.float32)
        expected = np.broadcast_to(np.float32(1.0) * scale, xs.shape) * (2 * (xs - ys))
        np.testing.assert_array_equal(_bits(pooled[1]), _bits(expected))


def test_embedding_rows_come_from_the_pool():
    # The token embedding's rows: the same values np.take gives, in a recycled buffer.
    from everyo.sequence_ops import EveryOIndexError, embedding

    w = eo.Parameter(np.random.default_rng(40).standard_normal((65, 128)).astype(np.float32))
    idx = np.random.default_rng(41).integers(0, 65, (32, 64))
    out = embedding(idx, w)
    assert _pooled(out.data)
    np.testing.assert_array_equal(_bits(out.data), _bits(np.take(w.data, idx, axis=0)))
    with pytest.raises(EveryOIndexError):
        embedding(idx + 1, w)  # 65 is out of range: still refused, not clipped


def test_dropout_backward_keeps_the_mask_not_the_input():
    # The backward rebuilds the scaled mask from the boolean one; it must not also hold the
    # input's array (under autocast everyo.nn._unread lets a float32 input go once nothing reads it:
    # tests/amp/test_saved_activations.py counted one more float32 activation a layer).
    h = eo.relu(_leaf(42))
    x = h.data
    before = sys.getrefcount(x)
    y = eo.dropout(h, 0.3, True, np.random.default_rng(43))
    assert _pooled(y.data)
    assert sys.getrefcount(x) == before
