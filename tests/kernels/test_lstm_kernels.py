"""The LSTM kernels against core's NumPy path: bit-identical outputs and
gradients on random shapes, strided operands, padding, both directions and
special values; gradients through the kernels against finite differences.

Two sets of kernels: the whole time loop in one call (``lstm_forward_scan``,
``lstm_backward_scan``: unpadded batches, batch and hidden > 1) and the
per-step ones (the rest: padding, a single row or unit)."""

import numpy as np
import pytest
from conftest import count_calls

import everyo as eo
from everyo import kernel_table
from everyo.recurrent_ops import lstm_scan
from everyo.testing import check_gradients

STEP_KERNELS = ("lstm_gates_in", "lstm_gates_out", "lstm_cell_backward")
SCANS = ("lstm_forward_scan", "lstm_backward_scan")
KERNELS = STEP_KERNELS + SCANS


def _expected_calls(batch, steps, hidden, lengths=None):
    """How often each kernel runs in one forward + backward."""
    if batch > 1 and hidden > 1 and (lengths is None or min(lengths) >= steps):
        return dict.fromkeys(STEP_KERNELS, 0) | dict.fromkeys(SCANS, 1)
    return dict.fromkeys(STEP_KERNELS, steps) | dict.fromkeys(SCANS, 0)


def _ran(calls):
    return {name for name, n in calls.items() if n}


def _operands(rng, batch, steps, hidden, dtype, strided):
    xp = rng.standard_normal((batch, steps, 4 * hidden)).astype(dtype)
    if strided:  # a non-contiguous view: every other step of a longer sequence
        xp = np.repeat(xp, 2, axis=1)[:, ::2]
        assert not xp.flags.c_contiguous
    h0 = rng.standard_normal((batch, hidden)).astype(dtype)
    c0 = rng.standard_normal((hidden, batch)).astype(dtype).T  # a transposed (strided) state
    w = (rng.standard_normal((hidden, 4 * hidden)) / np.sqrt(hidden)).astype(dtype)
    return xp, h0, c0, w


def _run(xp, h0, c0, w, reverse=False, lengths=None, seed=0):
    """Outputs and gradients of one scan with a random output gradient."""
    tensors = [eo.tensor(a, requires_grad=True) for a in (xp, h0, c0, w)]
    outs = lstm_scan(*tensors, reverse=reverse, lengths=lengths)
    rng = np.random.default_rng(seed)
    loss = None
    for o in outs:
        term = (o * eo.tensor(rng.standard_normal(o.shape).astype(o.data.dtype))).sum()
        loss = term if loss is None else loss + term
    loss.backward()
    return [o.data for o in outs] + [t.grad for t in tensors]


def _assert_same_bits(got, want):
    for k, (a, b) in enumerate(zip(got, want)):
        assert a.dtype == b.dtype and a.shape == b.shape, k
        assert np.array_equal(a.view(np.uint8), b.view(np.uint8)), f"result {k} differs"


@pytest.mark.parametrize("case", range(8))
def test_bit_identical_to_numpy(monkeypatch, case):
    rng = np.random.default_rng(case)
    batch, steps, hidden = (int(v) for v in rng.integers(1, 9, 3))
    dtype = (np.float32, np.float64)[case % 2]
    reverse, strided = bool(case & 2), bool(case & 4)
    lengths = rng.integers(0, steps + 1, batch) if case >= 6 else None
    operands = _operands(rng, batch, steps, hidden, dtype, strided)
    with kernel_table.disabled():
        want = _run(*operands, reverse=reverse, lengths=lengths)
    calls = count_calls(monkeypatch, KERNELS)
    got = _run(*operands, reverse=reverse, lengths=lengths)
    assert calls == _expected_calls(batch, steps, hidden, lengths), calls
    _assert_same_bits(got, want)


@pytest.mark.parametrize("shape", [(32, 50, 128), (3, 2, 300), (2, 3, 2)])
def test_whole_loop_bit_identical(monkeypatch, shape):
    # The benchmark's LSTM (batch 32, 50 steps, hidden 128: BLAS's small-matrix kernel),
    # a hidden size whose products take BLAS's general path, the smallest shape the loop takes.
    batch, steps, hidden = shape
    for reverse in (False, True):
        operands = _operands(np.random.default_rng(7), batch, steps, hidden, np.float32, False)
        with kernel_table.disabled():
            want = _run(*operands, reverse=reverse)
        calls = count_calls(monkeypatch, KERNELS)
        _assert_same_bits(_run(*operands, reverse=reverse), want)
        assert calls == _expected_calls(batch, steps, hidden), calls


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_final_state_only_bit_identical(monkeypatch, dtype):
    # No gradient reaches the outputs (only h_last and c_last are used): the loop runs without one.
    xp, h0, c0, w = _operands(np.random.default_rng(8), 4, 5, 6, dtype, False)

    def run():
        tensors = [eo.tensor(a, requires_grad=True) for a in (xp, h0, c0, w)]
        _, h_last, c_last = lstm_scan(*tensors)
        ((h_last * h_last).sum() + (c_last * 3).sum()).backward()
        return [h_last.data, c_last.data] + [t.grad for t in tensors]

    with kernel_table.disabled():
        want = run()
    calls = count_calls(monkeypatch, SCANS)
    _assert_same_bits(run(), want)
    assert calls == dict.fromkeys(SCANS, 1)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_special_values_bit_identical(dtype):
    # nan, +-inf, -0, subnormals, huge values in the input projection and the states.
    rng = np.random.default_rng(3)
    xp, h0, c0, w = _operands(rng, 3, 4, 5, dtype, False)
    tiny = np.finfo(dtype).smallest_subnormal
    specials = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, tiny, -tiny, 1e30, -1e30, 88.0], dtype)
    xp.reshape(-1)[: 4 * specials.size : 4] = np.resize(specials, specials.size)
    c0 = np.ascontiguousarray(c0)
    c0.reshape(-1)[: specials.size] = specials
    h0[0, :3] = (-0.0, tiny, np.nan)
    with np.errstate(all="ignore"):
        with kernel_table.disabled():
            want = _run(xp, h0, c0, w)
        got = _run(xp, h0, c0, w)
    _assert_same_bits(got, want)
    assert np.isnan(got[0]).any()  # the NaNs really went through


def test_float16_operands_take_numpy_path(monkeypatch):
    calls = count_calls(monkeypatch, KERNELS)
    xp, h0, c0, w = _operands(np.random.default_rng(1), 2, 3, 4, np.float16, False)
    _run(xp, h0, c0, w)
    assert calls == dict.fromkeys(KERNELS, 0)


@pytest.mark.parametrize("reverse", [False, True])
def test_gradients_through_kernels_match_finite_differences(monkeypatch, reverse):
    calls = count_calls(monkeypatch, KERNELS)
    rng = np.random.default_rng(5)
    B, T, H = 2, 4, 3
    check_gradients(
        lambda xp, h0, c0, w: tuple(lstm_scan(xp, h0, c0, w, reverse)),
        [
            rng.standard_normal((B, T, 4 * H)),
            rng.standard_normal((B, H)),
            rng.standard_normal((B, H)),
            0.5 * rng.standard_normal((H, 4 * H)),
        ],
        name="lstm_scan (kernels)",
    )
    assert _ran(calls) == _ran(_expected_calls(B, T, H))  # the checker runs many passes


def test_padded_gradients_match_finite_differences(monkeypatch):
    calls = count_calls(monkeypatch, KERNELS)
    rng = np.random.default_rng(6)
    B, T, H = 3, 4, 2
    lengths = np.array([4, 2, 0])
    check_gradients(
        lambda xp, h0, c0, w: tuple(lstm_scan(xp, h0, c0, w, lengths=lengths)),
        [
            rng.standard_normal((B, T, 4 * H)),
            rng.standard_normal((B, H)),
            rng.standard_normal((B, H)),
            0.5 * rng.standard_normal((H, 4 * H)),
        ],
        name="lstm_scan padded (kernels)",
    )
    assert _ran(calls) == _ran(_expected_calls(B, T, H, lengths))


def test_layer_trains_the_same(monkeypatch):
    # A bidirectional two-layer LSTM, three Adam steps: the same weights bit for bit.
    rng = np.random.default_rng(2)
    x = eo.tensor(rng.standard_normal((4, 6, 5)).astype(np.float32))
    results = []
    for off in (True, False):
        lstm = eo.LSTM(5, 7, num_layers=2, bidirectional=True, seed=0)
        opt = eo.Adam(lstm.parameters(), lr=0.01)
        with kernel_table.disabled() if off else _nothing():
            for _ in range(3):
                opt.zero_grad()
                (lstm(x)[0] ** 2).mean().backward()
                opt.step()
        results.append([p.data.copy() for p in lstm.parameters()])
    _assert_same_bits(results[1], results[0])


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
