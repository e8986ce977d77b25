"""The dense-layer kernels (add_bias, relu_forward, relu_backward, column_sums, outer_product)
against core's NumPy paths:
bit-identical on random shapes and special values (NaN, +-inf, -0, subnormals;
a NaN's sign bit is not compared, see _same_bits),
float32 and float64, and the gradients through them pass the FD checker."""

import numpy as np
import pytest
from conftest import count_calls

import everyo as eo
from everyo import kernel_table
from everyo.testing import check_gradients

SPECIALS = [0.0, -0.0, np.nan, -np.nan, np.inf, -np.inf, 1e-45, -1e-45, 3e38, -3e38]


def _same_bits(a, b):
    """Bit-identical, except a NaN's sign and payload: IEEE 754 leaves them unspecified,
    and NumPy's own SIMD loops change them between releases (x86 gives the default NaN
    0xffc00000 for inf - inf but passes an operand's NaN through, and NumPy 2.2 and 2.3
    order the operands of add/maximum differently). The NaN positions must match."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    nan_a, nan_b = np.isnan(a), np.isnan(b)
    return np.array_equal(nan_a, nan_b) and np.array_equal(a[~nan_a].view(np.uint8), b[~nan_b].view(np.uint8))


def _values(rng, shape, dtype):
    x = rng.standard_normal(shape).astype(dtype)
    flat = x.reshape(-1)
    picks = rng.integers(0, flat.size, 2 * len(SPECIALS))
    flat[picks] = np.array(SPECIALS * 2, dtype)
    return x


def _linear_relu_grads(x, w, b, g):
    xt, wt, bt = eo.tensor(x, requires_grad=True), eo.tensor(w, requires_grad=True), eo.tensor(b, requires_grad=True)
    out = eo.relu(eo.linear(xt, wt, bt))
    with np.errstate(all="ignore"):
        out.backward(eo.tensor(g))
    return out.data.copy(), xt.grad.copy(), wt.grad.copy(), bt.grad.copy()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
# None of these shapes takes linear's ones-column path (that one has no bias add).
@pytest.mark.parametrize("shape", [(4096, 128), (517, 96), (300, 100)])
def test_linear_relu_matches_numpy_path_bit_for_bit(monkeypatch, dtype, shape):
    rng = np.random.default_rng(shape[0])
    m, n = shape
    x, w = _values(rng, (m, 64), dtype), rng.standard_normal((64, n)).astype(dtype)
    b, g = _values(rng, (n,), dtype), _values(rng, (m, n), dtype)
    with kernel_table.disabled(), np.errstate(all="ignore"):
        want = _linear_relu_grads(x, w, b, g)
    calls = count_calls(monkeypatch, ("add_bias", "relu_forward", "relu_backward", "column_sums"))
    with np.errstate(all="ignore"):
        got = _linear_relu_grads(x, w, b, g)
    assert calls == {"add_bias": 1, "relu_forward": 1, "relu_backward": 1, "column_sums": 1}
    for a, e in zip(got, want):
        assert _same_bits(a, e)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_relu_forward_kernel_keeps_numpy_bits_on_special_values(dtype):
    # Every special value (NaN payloads and signs included: maximum passes a NaN
    # operand through), the same as NumPy's maximum(a, 0), bit for bit.
    fn = kernel_table.get("relu_forward")
    bits = np.uint32 if dtype == np.float32 else np.uint64
    payloads = np.array([0x7FC00001, 0xFFC00123], np.uint32).view(np.float32).astype(dtype)
    a = np.concatenate(
        [np.array(SPECIALS, dtype), payloads, np.random.default_rng(5).standard_normal(1000).astype(dtype)]
    )
    out = np.empty_like(a)
    fn(a, out)
    assert np.array_equal(out.view(bits), np.maximum(a, 0).view(bits))
    assert not np.signbit(out[1])  # -0 gives +0, as maximum


def test_relu_on_a_strided_input_keeps_the_numpy_path(monkeypatch):
    x = np.random.default_rng(6).standard_normal((256, 256)).astype(np.float32)
    calls = count_calls(monkeypatch, ("relu_forward",))
    assert np.array_equal(eo.relu(eo.tensor(x.T)).data, np.maximum(x.T, 0))
    assert calls["relu_forward"] == 0
    assert np.array_equal(eo.relu(eo.tensor(x)).data, np.maximum(x, 0))
    assert calls["relu_forward"] == 1


def test_relu_backward_kernel_on_special_pairs():
    # Every (g, out) pair of special values, out as ReLU gives it (never below 0).
    fn = kernel_table.get("relu_backward")
    vals = np.array(SPECIALS, np.float32)
    g = np.repeat(vals, vals.size)
    out = np.maximum(np.tile(vals, vals.size), np.float32(0))
    res = np.empty_like(g)
    fn(g, out, res)
    with np.errstate(invalid="ignore"):
        want = g * ~(out <= 0)
    assert _same_bits(res, want.astype(np.float32))


def test_gradients_through_the_kernels_pass_the_fd_checker(monkeypatch):
    rng = np.random.default_rng(3)
    x, w, b = rng.standard_normal((130, 64)), 0.1 * rng.standard_normal((64, 128)), rng.standard_normal(128)
    assert 130 * 128 >= 16384  # large enough to take the kernels, and 64 -> 128 adds its bias
    calls = count_calls(monkeypatch, ("add_bias", "relu_forward", "relu_backward", "column_sums"))
    check_gradients(lambda x, w, b: eo.sum(eo.relu(eo.linear(x, w, b)) ** 2), [x, w, b], name="linear+relu")
    assert calls["add_bias"] > 0 and calls["relu_forward"] > 0 and calls["relu_backward"] > 0
    assert calls["column_sums"] > 0


def test_gradient_of_a_broadcast_bias_passes_the_fd_checker(monkeypatch):
    # A hand-written layer (x @ w + b): b's gradient is unbroadcast's column sums.
    rng = np.random.default_rng(4)
    x, w, b = rng.standard_normal((260, 32)), 0.1 * rng.standard_normal((32, 64)), rng.standard_normal(64)
    calls = count_calls(monkeypatch, ("column_sums",))
    check_gradients(lambda x, w, b: eo.sum(eo.tanh(x @ w + b)), [x, w, b], name="x @ w + b")
    assert calls["column_sums"] > 0


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("m", "n"), [(4096, 128), (300, 77), (20000, 1)])
def test_outer_product_matches_numpy_path_bit_for_bit(monkeypatch, dtype, m, n):
    # A 1-unit output layer's input gradient: (m, 1) @ (1, n), and the matmul op itself.
    rng = np.random.default_rng(m + n)
    a, b = _values(rng, (m, 1), dtype), _values(rng, (1, n), dtype)

    def run():
        x, y = eo.tensor(a, requires_grad=True), eo.tensor(b, requires_grad=True)
        with np.errstate(all="ignore"):
            out = eo.matmul(x, y)
            out.backward(eo.tensor(np.ones((m, n), dtype)))
        return out.data.copy(), x.grad.copy(), y.grad.copy()

    with kernel_table.disabled():
        want = run()
    calls = count_calls(monkeypatch, ("outer_product",))
    got = run()
    assert calls["outer_product"] == (2 if n == 1 else 1)  # with n == 1 the backward is one too
    for g, e in zip(got, want):
        assert _same_bits(g, e)
    with np.errstate(all="ignore"):
        assert _same_bits(got[0], a * b)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    "shape", [(1, 2), (2, 3), (17, 65), (4096, 128), (100352, 32), (9000, 2), (3, 8192), (40, 7, 9), (5, 3, 2, 1100)]
)
def test_column_sums_kernel_matches_numpy_sum_bit_for_bit(dtype, shape):
    # NumPy's a.sum over the leading axes of a C-contiguous array, for every split of
    # the axes that leaves two or more values per row; with special values, a column
    # of -0.0 (NumPy starts from +0.0: the sum is +0.0) and values of mixed scale.
    from everyo.functional import _sum_leading

    rng = np.random.default_rng(sum(shape))
    with np.errstate(over="ignore"):
        a = _values(rng, shape, dtype) * rng.choice(np.array([1e-3, 1.0, 1e3], dtype), size=shape)
    a.reshape(a.shape[0], -1)[:, 0] = -0.0
    fn = kernel_table.get("column_sums")
    for k in range(1, a.ndim):
        with np.errstate(all="ignore"):
            want = a.sum(axis=tuple(range(k)))
        out = np.empty(want.size, dtype)
        with np.errstate(all="ignore"):
            fn(a.reshape(-1, want.size), out)
            got = _sum_leading(a, k)
        assert _same_bits(out.reshape(want.shape), want), k
        assert _same_bits(got, want), k
        if k == 1:  # the column of -0.0 sums to +0.0, as NumPy's
            assert got.reshape(-1)[0] == 0 and not np.signbit(got.reshape(-1)[0])


def test_column_sums_is_not_used_where_numpy_sums_otherwise(monkeypatch):
    # One value per row (NumPy sums pairwise), a strided array, float16, a small one:
    # NumPy's own sum, and not the kernel.
    from everyo.functional import _sum_leading

    rng = np.random.default_rng(8)
    calls = count_calls(monkeypatch, ("column_sums",))
    for a in (
        rng.standard_normal((40000, 1)).astype(np.float32),
        rng.standard_normal((300, 400)).astype(np.float32).T,
        rng.standard_normal((300, 400)).astype(np.float16),
        rng.standard_normal((10, 10)).astype(np.float32),
    ):
        assert _same_bits(_sum_leading(a), a.sum(axis=0))
    assert calls["column_sums"] == 0


def _bias_grad_cases(rng, dtype):
    """(name, function of a bias tensor b, bias shape): ops whose bias gradient is a sum
    over the leading axes of the output gradient."""
    x = _values(rng, (16, 28, 28, 4), dtype)
    w = rng.standard_normal((3, 3, 4, 8)).astype(dtype)
    wt = rng.standard_normal((3, 3, 4, 6)).astype(dtype)
    h = _values(rng, (32, 64, 128), dtype)
    return [
        ("conv2d", lambda b: eo.conv2d(eo.tensor(x), eo.tensor(w), b, padding="same"), (8,)),
        ("conv_transpose2d", lambda b: eo.conv_transpose2d(eo.tensor(x), eo.tensor(wt), b, stride=2), (6,)),
        ("x + b, b (n,)", lambda b: eo.tensor(h) + b, (128,)),
        ("x + b, b (1, n)", lambda b: eo.tensor(h.reshape(-1, 128)) + b, (1, 128)),
        ("x + b, b (t, n)", lambda b: eo.tensor(h) + b, (64, 128)),
        ("x + b, b (1, t, n)", lambda b: eo.tensor(h) + b, (1, 64, 128)),
    ]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_bias_gradients_with_column_sums_match_numpy_path_bit_for_bit(monkeypatch, dtype):
    # The output and the bias gradient, kernels on against off.
    rng = np.random.default_rng(9)
    for name, fn, b_shape in _bias_grad_cases(rng, dtype):
        b0 = _values(rng, b_shape, dtype)

        def run(fn=fn, b0=b0):
            b = eo.tensor(b0, requires_grad=True)
            with np.errstate(all="ignore"):
                out = fn(b)
                g = np.random.default_rng(1).standard_normal(out.shape).astype(dtype)
                out.backward(eo.tensor(g))
            return out.data.copy(), b.grad.copy()

        with kernel_table.disabled():
            want = run()
        calls = count_calls(monkeypatch, ("column_sums", "add_bias"))
        got = run()
        assert calls["column_sums"] == 1, name
        assert calls["add_bias"] == (1 if name == "conv2d" else 0), name  # conv2d's forward adds its bias so
        for a, e in zip(got, want):
            assert _same_bits(a, e), name


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gru_recurrent_bias_gradient_with_column_sums_matches_numpy_path(monkeypatch, dtype):
    # gru_scan's b_hh gradient is a sum over (batch * steps) rows of the projected-state
    # gradients: one column_sums call, the bits of NumPy's sum(axis=0); every other
    # gradient unchanged.
    from everyo.recurrent_ops import gru_scan

    rng = np.random.default_rng(4)
    batch, steps, hidden = 16, 12, 32
    xp0 = rng.standard_normal((batch, steps, 3 * hidden)).astype(dtype)
    h00 = rng.standard_normal((batch, hidden)).astype(dtype)
    w0 = (0.2 * rng.standard_normal((hidden, 3 * hidden))).astype(dtype)
    b0 = rng.standard_normal(3 * hidden).astype(dtype)
    g = rng.standard_normal((batch, steps, hidden)).astype(dtype)

    def run():
        ts = [eo.tensor(a, requires_grad=True) for a in (xp0, h00, w0, b0)]
        out, _ = gru_scan(*ts)
        out.backward(eo.tensor(g))
        return [out.data.copy()] + [t.grad.copy() for t in ts]

    with kernel_table.disabled():
        want = run()
    calls = count_calls(monkeypatch, ("column_sums",))
    got = run()
    assert calls["column_sums"] == 1
    for a, e in zip(got, want):
        assert _same_bits(a, e)


def test_gru_recurrent_bias_gradient_passes_fd_with_kernels(monkeypatch):
    # Large enough (batch * steps * 3H >= kernel_table.MIN_SIZE) for b_hh's sum to take
    # column_sums; xp is held fixed so the checker perturbs only h0, W_hh and b_hh.
    from everyo.recurrent_ops import gru_scan

    rng = np.random.default_rng(5)
    batch, steps, hidden = 64, 44, 2
    assert batch * steps * 3 * hidden >= kernel_table.MIN_SIZE
    xp = eo.tensor(rng.standard_normal((batch, steps, 3 * hidden)))
    h0, w, b = (
        rng.standard_normal((batch, hidden)),
        0.3 * rng.standard_normal((hidden, 3 * hidden)),
        rng.standard_normal(3 * hidden),
    )
    calls = count_calls(monkeypatch, ("column_sums",))
    check_gradients(lambda h0, w, b: gru_scan(xp, h0, w, b)[0].sum(), [h0, w, b], name="gru_scan")
    assert calls["column_sums"] > 0
