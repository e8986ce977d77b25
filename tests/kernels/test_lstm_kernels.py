"""The LSTM kernels against core's NumPy path: bit-identical outputs and
gradients on random shapes, strided operands, padding, both directions and
special values; gradients through the kernels against finite differences.

Two sets of kernels: the whole time loop in one call (``lstm_forward_scan``,
``lstm_backward_scan``: unpadded batches, batch and hidden > 1) and the
per-step ones (the rest: padding, a single row or unit). The whole-loop
kernels may run the batch's rows in parts on several threads: the same bits."""

import threading

import numpy as np
import pytest
from conftest import count_calls

import everyo as eo
from everyo import _blas, kernel_table
from everyo.kernels import _native, recurrent
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


# --- the whole-loop kernels on several threads (each a range of the batch's rows) ---------


@pytest.fixture
def split(monkeypatch):
    """Let the scans split any batch (two rows a part at least) into ``threads`` parts on a
    machine that is not busy; returns the (b0, b1) ranges each loop ran, per loop."""
    ranges = {"forward": [], "backward": []}
    monkeypatch.setattr(recurrent, "THREADS", 4)
    monkeypatch.setattr(recurrent, "MIN_WORK", 0)
    monkeypatch.setattr(recurrent, "MIN_ROWS", 2)
    monkeypatch.setattr(_blas, "machine_busy", lambda: False)
    monkeypatch.setattr(recurrent, "_openblas_spinning", lambda: False)  # no OpenBLAS worker spinning
    for name, loop in (("forward", recurrent._lstm_forward), ("backward", recurrent._lstm_backward)):

        def spy(*args, _loop=loop, _name=name):
            ranges[_name].append(args[-2:])
            return _loop(*args)

        monkeypatch.setattr(recurrent, f"_lstm_{name}", spy)

    def threads(n):
        monkeypatch.setattr(recurrent, "blas_threads", lambda: n)
        return ranges

    return threads


def _ranges(batch, parts):
    cuts = [batch * p // parts for p in range(parts + 1)]
    return sorted(zip(cuts, cuts[1:]))


@pytest.mark.parametrize(
    ("shape", "threads", "dtype"),
    [
        ((32, 50, 128), 2, np.float32),  # the benchmark's LSTM: two halves of 16 rows
        ((5, 3, 7), 2, np.float32),  # parts of 2 and 3 rows; sizes no SIMD width divides
        ((9, 4, 33), 3, np.float32),  # OpenBLAS 0.3.31 SkylakeX: parts' products differ, one part
        ((7, 6, 300), 3, np.float32),  # products on BLAS's general path (not its small-matrix kernel)
        ((64, 3, 128), 2, np.float32),  # the whole product on the general path, its halves not
        ((4, 2, 2), 2, np.float64),
        ((7, 5, 9), 4, np.float64),  # four threads allowed, but 7 rows make 3 parts of >= 2
    ],
)
def test_rows_on_threads_bit_identical(monkeypatch, split, shape, threads, dtype):
    # Split wherever BLAS's parts agree with its whole product; the bits are the NumPy path's.
    batch, steps, hidden = shape
    ranges = split(threads)
    parts = min(threads, batch // 2)
    cuts = recurrent._rows_agree(dtype, batch, hidden, parts)
    if not cuts:
        cuts = [0, batch]
    for reverse in (False, True):
        operands = _operands(np.random.default_rng(11), batch, steps, hidden, dtype, reverse)
        with kernel_table.disabled():
            want = _run(*operands, reverse=reverse)
        calls = count_calls(monkeypatch, KERNELS)
        _assert_same_bits(_run(*operands, reverse=reverse), want)
        assert calls == _expected_calls(batch, steps, hidden), calls
        for loop in ("forward", "backward"):  # every part of the batch ran, each once
            assert sorted(ranges[loop]) == sorted(zip(cuts, cuts[1:])), (loop, ranges[loop])
            ranges[loop].clear()


def test_rows_on_threads_special_values_and_final_state_only(split):
    # nan, inf, subnormals in one part's rows only; no gradient reaching the outputs.
    ranges = split(2)
    xp, h0, c0, w = _operands(np.random.default_rng(12), 6, 4, 5, np.float32, False)
    tiny = np.finfo(np.float32).smallest_subnormal
    xp[4, 1, :5] = (np.nan, np.inf, -np.inf, tiny, 1e30)
    h0[5, :2] = (-0.0, np.nan)

    def run():
        tensors = [eo.tensor(a, requires_grad=True) for a in (xp, h0, c0, w)]
        _, h_last, c_last = lstm_scan(*tensors)
        ((h_last * h_last).sum() + (c_last * 3).sum()).backward()
        return [h_last.data, c_last.data] + [t.grad for t in tensors]

    with np.errstate(all="ignore"):
        with kernel_table.disabled():
            want = run()
        got = run()
    _assert_same_bits(got, want)
    assert np.isnan(got[0][:3]).sum() == 0 and np.isnan(got[0][3:]).any()  # the NaNs stayed in their part
    assert sorted(ranges["forward"]) == sorted(ranges["backward"]) == [(0, 3), (3, 6)]


def test_two_python_threads_calling_the_split_scans(split):
    # Each call runs its rows on threads of its own: two callers at once get their own bits.
    ranges = split(2)
    cases = [_operands(np.random.default_rng(20 + k), 8, 6, 16, np.float32, False) for k in range(2)]
    with kernel_table.disabled():
        want = [_run(*operands) for operands in cases]
    got: list = [None, None]

    def worker(k):
        for _ in range(5):
            got[k] = _run(*cases[k])

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for k in range(2):
        _assert_same_bits(got[k], want[k])
    assert len(ranges["forward"]) == 2 * 2 * 5


def test_gradients_through_split_scans_match_finite_differences(monkeypatch, split):
    ranges = split(2)
    calls = count_calls(monkeypatch, SCANS)
    rng = np.random.default_rng(13)
    B, T, H = 4, 3, 3
    check_gradients(
        lambda xp, h0, c0, w: tuple(lstm_scan(xp, h0, c0, w)),
        [
            rng.standard_normal((B, T, 4 * H)),
            rng.standard_normal((B, H)),
            rng.standard_normal((B, H)),
            0.5 * rng.standard_normal((H, 4 * H)),
        ],
        name="lstm_scan (kernels, rows on two threads)",
    )
    assert calls["lstm_backward_scan"] > 0
    assert set(ranges["forward"]) == set(ranges["backward"]) == {(0, 2), (2, 4)}


def test_rows_agree_compares_parts_with_the_whole_product(monkeypatch):
    # A BLAS whose parts differ from its whole product is found out (and remembered).
    monkeypatch.setattr(recurrent, "_agree", {})
    matmul = np.matmul

    def off_by_rows(a, b):  # a BLAS whose rows' bits depend on how many rows it is given
        return matmul(a, b) * (1 + a.shape[0] * np.finfo(a.dtype).eps)

    monkeypatch.setattr(recurrent.np, "matmul", off_by_rows)
    assert not recurrent._rows_agree(np.float32, 32, 128, 2)
    assert recurrent._agree == {("float32", 32, 128, 2): False}


def test_the_cuts_tried_are_the_even_ones_then_multiples_of_four_nearest_the_middle():
    assert recurrent._candidates(32, 2) == [[0, 16, 32], [0, 12, 32], [0, 20, 32], [0, 8, 32], [0, 24, 32], [0, 4, 32]]
    assert recurrent._candidates(6, 2) == [[0, 3, 6], [0, 4, 6]]
    assert recurrent._candidates(9, 3) == [[0, 3, 6, 9]]


def test_rows_agree_takes_the_first_cut_whose_parts_agree(monkeypatch):
    # a BLAS whose rows' bits depend on where a block of 12 rows from the call's first row ends
    # (OpenBLAS's Haswell kernels): the cut at 12 agrees, the even one at 16 does not
    monkeypatch.setattr(recurrent, "_agree", {})
    matmul = np.matmul

    def blocks_of_12(a, b):
        r = matmul(a.astype(np.float64), b.astype(np.float64)).astype(a.dtype)  # each row's bits its own
        tail = a.shape[0] % 12
        if tail:
            r[-tail:] *= 1 + np.finfo(a.dtype).eps
        return r

    monkeypatch.setattr(recurrent.np, "matmul", blocks_of_12)
    assert recurrent._rows_agree(np.float32, 32, 128, 2) == [0, 12, 32]
    assert recurrent._agree == {("float32", 32, 128, 2): [0, 12, 32]}


def test_a_disagreeing_blas_runs_one_part(monkeypatch, split):
    ranges = split(2)
    monkeypatch.setattr(recurrent, "_rows_agree", lambda *shape: False)
    operands = _operands(np.random.default_rng(14), 6, 3, 8, np.float32, False)
    with kernel_table.disabled():
        want = _run(*operands)
    _assert_same_bits(_run(*operands), want)
    assert ranges["forward"] == ranges["backward"] == [(0, 6)]


def test_one_part_unless_threads_cores_and_work_allow_more(monkeypatch):
    monkeypatch.setattr(_blas, "machine_busy", lambda: False)
    monkeypatch.setattr(recurrent, "blas_threads", lambda: 2)
    monkeypatch.setattr(recurrent, "_openblas_spinning", lambda: False)
    assert recurrent.THREADS == 2 and recurrent._parts(32, 128, 50) == 2  # the benchmark's LSTM, idle 2 cores
    monkeypatch.setattr(recurrent, "THREADS", 1)
    assert recurrent._parts(32, 128, 50) == 1  # switched off
    monkeypatch.setattr(recurrent, "THREADS", 2)
    assert recurrent._parts(32, 128, 1) == 1  # too little work for a second thread
    assert recurrent._parts(12, 128, 50) == 1  # 6-row parts: fewer than MIN_ROWS
    assert recurrent._parts(64, 512, 50) == 1  # products OpenBLAS splits over its own threads
    monkeypatch.setattr(recurrent, "blas_threads", lambda: 1)  # a spawn worker, threadpool_limits(1)
    assert recurrent._parts(32, 128, 50) == 1
    monkeypatch.setattr(recurrent, "blas_threads", lambda: 2)
    monkeypatch.setattr(_blas, "machine_busy", lambda: True)
    assert recurrent._parts(32, 128, 50) == 1
    monkeypatch.setattr(_blas, "machine_busy", lambda: False)
    monkeypatch.setattr(recurrent, "_openblas_spinning", lambda: True)  # beside OpenBLAS's spinning worker
    assert recurrent._parts(32, 128, 50) == 1


def test_blas_threads_reads_the_count_threadpoolctl_sets():
    threadpoolctl = pytest.importorskip("threadpoolctl")
    openblas = [p for p in threadpoolctl.threadpool_info() if p["internal_api"] == "openblas"]
    if not openblas:
        pytest.skip("NumPy's BLAS is not OpenBLAS")
    assert _native.blas_threads() == openblas[0]["num_threads"]
    with threadpoolctl.threadpool_limits(1):
        assert _native.blas_threads() == 1


def test_scans_split_at_the_blas_thread_count_the_user_set(monkeypatch):
    # Nothing faked but the machine's load: OpenBLAS's own count (read before core's rule
    # sets one thread for the products) decides, two threads give two parts, one gives one.
    threadpoolctl = pytest.importorskip("threadpoolctl")
    monkeypatch.setattr(_blas, "machine_busy", lambda: False)
    monkeypatch.setattr(recurrent, "THREADS", 2)
    monkeypatch.setattr(recurrent, "MIN_WORK", 0)
    ranges = []
    loop = recurrent._lstm_forward

    def spy(*args):
        ranges.append(args[-2:])
        return loop(*args)

    monkeypatch.setattr(recurrent, "_lstm_forward", spy)
    operands = _operands(np.random.default_rng(15), 32, 3, 128, np.float32, False)
    with kernel_table.disabled():
        want = _run(*operands)
    with threadpoolctl.threadpool_limits(2):
        if _native.blas_threads() != 2:
            pytest.skip("NumPy's BLAS does not take two threads here")
        got = _run(*operands)
    _assert_same_bits(got, want)
    two = recurrent._rows_agree(np.float32, 32, 128, 2)
    assert sorted(ranges) == ([(0, two[1]), (two[1], 32)] if two else [(0, 32)])
    ranges.clear()
    with threadpoolctl.threadpool_limits(1):
        _assert_same_bits(_run(*operands), want)
    assert ranges == [(0, 32)]
