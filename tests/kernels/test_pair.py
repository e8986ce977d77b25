"""everyo-kernels' pair: a second thread kept awake between a step's jobs.

The handshake (both parts run at once, the caller returns only when both have
finished, errors reach the caller, a second caller or a fork child is served
correctly) and the split products (the bits of ``np.matmul`` as core computes
it, and no split where any condition fails). Nothing here waits on a clock:
a part that must run beside the other waits for an event the other sets."""

import os
import threading
import time
import warnings

import numpy as np
import pytest
from conftest import count_calls

import everyo as eo
from everyo import _blas, kernel_table
from everyo.kernels import pair, recurrent

DEADLOCK_GUARD_S = 120  # only ever reached if the parts do not run at once (the test then fails)


def test_both_parts_run_at_once_on_two_threads():
    started, seen = threading.Event(), {}

    def theirs():
        seen["theirs"] = threading.get_ident()
        started.set()

    def mine():
        seen["mine"] = threading.get_ident()
        seen["met"] = started.wait(DEADLOCK_GUARD_S)  # theirs runs while mine is still running

    for _ in range(3):  # the worker started, then awake (or asleep again) for the next jobs
        seen.clear()
        started.clear()
        pair.run(mine, theirs)
        assert seen["met"] and seen["mine"] == threading.get_ident() != seen["theirs"]


def test_the_worker_stays_awake_for_spin_s_after_a_job():
    # Its spin is counted in CPU cycles, converted from SPIN_S at the worker's start. The
    # first reading of the cycle counter also loaded its compiled code, and timed with it
    # the rate came out ~100x too low: the worker slept ~50 us after each job instead of
    # 5 ms, and most of a step's splits woke it from sleep (~15 us each).
    pair.run(lambda: None, lambda: None)
    worker = pair._get()
    t0, c0 = time.perf_counter(), pair._read_cycles()
    time.sleep(0.02)
    rate = (pair._read_cycles() - c0) / (time.perf_counter() - t0)
    assert 0.5 < worker.ticks / (rate * pair.SPIN_S) < 2
    assert 0.5 < worker.grace / (rate * pair.GRACE_S) < 2


def test_a_worker_asleep_is_woken_by_the_next_post():
    # A caller wakes the worker (a futex wake) only when the worker has said it sleeps (a
    # spinning worker sees the post itself); the worker says so before it looks for a post.
    pair.run(lambda: None, lambda: None)
    worker = pair._get()
    guard = time.monotonic() + DEADLOCK_GUARD_S
    while not worker.sleeping and time.monotonic() < guard:  # its spin (SPIN_S) ends, then it sleeps
        time.sleep(0.001)
    assert worker.sleeping
    wakes = worker.ctrl[pair._WAKES]
    ran = []
    pair.run(lambda: None, lambda: ran.append(1))
    assert ran == [1] and worker.ctrl[pair._WAKES] == wakes + 1


def test_run_returns_only_when_the_workers_part_is_done():
    release, done = threading.Event(), []

    def theirs():
        assert release.wait(DEADLOCK_GUARD_S)
        done.append("theirs")

    def mine():
        release.set()  # theirs may finish only after mine has returned
        done.append("mine")

    pair.run(mine, theirs)
    assert sorted(done) == ["mine", "theirs"]


def test_an_error_in_either_part_reaches_the_caller_after_both_ended():
    done = []

    def bad():
        raise ValueError("part failed")

    with pytest.raises(ValueError, match="part failed"):
        pair.run(lambda: done.append("mine"), bad)
    assert done == ["mine"]
    with pytest.raises(ValueError, match="part failed"):
        pair.run(bad, lambda: done.append("theirs"))
    assert done == ["mine", "theirs"]  # the worker's part ran although the caller's failed
    pair.run(lambda: done.append(1), lambda: done.append(2))  # the pair still works
    assert sorted(done[2:]) == [1, 2]


def test_a_second_caller_runs_its_parts_itself_while_the_pair_is_busy():
    inside, leave, parts = threading.Event(), threading.Event(), []

    def first():
        pair.run(lambda: (inside.set(), leave.wait(DEADLOCK_GUARD_S)), lambda: parts.append("first's"))

    thread = threading.Thread(target=first)
    thread.start()
    assert inside.wait(DEADLOCK_GUARD_S)
    me = threading.get_ident()
    idents = []
    pair.run(lambda: idents.append(threading.get_ident()), lambda: idents.append(threading.get_ident()))
    assert idents == [me, me]  # both parts on this thread: the worker was taken
    leave.set()
    thread.join()
    assert parts == ["first's"]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork only")
def test_a_fork_child_gets_a_worker_of_its_own():
    pair.run(lambda: None, lambda: None)  # the parent's worker exists
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # Python 3.12+: fork of a threaded process
        pid = os.fork()
    if pid == 0:  # the child: the parent's worker thread does not exist here
        code = 1
        try:
            idents = []
            pair.run(lambda: None, lambda: idents.append(threading.get_ident()))
            ok = pair._worker is not None and pair._worker.pid == os.getpid()
            code = 0 if ok and idents and idents[0] != threading.get_ident() else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_where_no_thread_can_start_both_parts_run_here(monkeypatch):
    # e.g. an LSTM called late in interpreter finalization: "can't create new thread at interpreter shutdown"
    def refuse(self):
        raise RuntimeError("can't create new thread at interpreter shutdown")

    monkeypatch.setattr(pair, "_worker", None)
    monkeypatch.setattr(threading.Thread, "start", refuse)
    me, idents = threading.get_ident(), []
    pair.run(lambda: idents.append(threading.get_ident()), lambda: idents.append(threading.get_ident()))
    assert idents == [me, me]


def test_an_lstm_in_an_atexit_handler_still_runs():
    import subprocess
    import sys

    code = (
        "import atexit, numpy as np, everyo as eo\n"
        "from everyo import _blas\n"
        "from everyo.kernels import recurrent\n"
        "_blas.machine_busy = lambda: False\n"
        "recurrent.blas_threads = lambda: 2\n"
        "def late():\n"
        "    y = eo.LSTM(32, 128)(eo.tensor(np.ones((32, 50, 32), np.float32)))[0]\n"
        "    print('ran', y.shape)\n"
        "atexit.register(late)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0 and "ran (32, 50, 128)" in done.stdout, done.stderr


# --- split products ----------------------------------------------------------------------


@pytest.fixture
def split_on(monkeypatch):
    """The conditions that make split_matmul split: the machine not busy,
    two BLAS threads, no OpenBLAS worker spinning; a fresh record of checked shapes."""
    monkeypatch.setattr(_blas, "machine_busy", lambda: False)
    monkeypatch.setattr(pair, "blas_threads", lambda: 2)
    monkeypatch.setattr(pair, "_agree", {})
    monkeypatch.setattr(_blas, "openblas_spinning", lambda: False)


def _matrix(rng, shape, dtype, layout):
    a = rng.standard_normal(shape).astype(dtype)
    return a if layout == "C" else np.asfortranarray(a)


def _one_thread(x, y):
    """The product as core defines it: on one OpenBLAS thread."""
    with _blas.single_thread():
        return np.matmul(x, y)


@pytest.mark.parametrize(
    ("m", "k", "n", "x_layout", "dtype"),
    [
        (1600, 33, 512, "C", np.float32),  # the benchmark LSTM's input projection
        (128, 1600, 512, "F", np.float32),  # W_hh's gradient, prev.T @ d
        (33, 1600, 512, "F", np.float32),  # W_ih's (and the bias row's) gradient
        (4096, 64, 128, "C", np.float32),  # the seed MLP's first layer
        (1601, 37, 301, "C", np.float32),  # odd sizes, no SIMD width divides them
        (64, 700, 301, "F", np.float32),  # K between one and two of OpenBLAS's K blocks
        (512, 300, 64, "C", np.float64),
    ],
)
def test_split_products_have_the_bits_of_one_thread(split_on, m, k, n, x_layout, dtype):
    rng = np.random.default_rng(m + k + n)
    x, y = _matrix(rng, (m, k), dtype, x_layout), _matrix(rng, (k, n), dtype, "C")
    want = _one_thread(x, y)
    out = np.full((m, n), np.nan, dtype)
    did = pair.split_matmul(x, y, out)  # a shape's first product: checked, then split where a cut agrees
    key = (np.dtype(dtype).name, m, k, n, x_layout, "C", 2)
    cut = pair._agree[key]
    assert did == bool(cut)  # split exactly where its check found a cut
    if did:
        assert cut in pair._row_cuts(m)
        assert np.array_equal(out.view(np.uint8), want.view(np.uint8))
        out[...] = np.nan
        assert pair.split_matmul(x, y, out)  # and again, without a new check
        assert np.array_equal(out.view(np.uint8), want.view(np.uint8))
    else:
        assert np.isnan(out).all()  # nothing written: core then runs its own product


def test_the_row_cuts_tried_are_the_even_one_then_multiples_of_8_nearest_the_middle():
    assert pair._row_cuts(4096) == [2048, 2040, 2056, 2032, 2064, 2024, 2072, 2016]
    assert pair._row_cuts(33) == [16, 24, 8]  # nearest the middle (16.5) first; each part at least MIN_ROWS rows
    assert pair._row_cuts(128)[:4] == [64, 56, 72, 48]
    assert all(pair.MIN_ROWS <= c <= 1601 - pair.MIN_ROWS for c in pair._row_cuts(1601))


def test_the_check_finds_a_blas_whose_parts_differ(split_on, monkeypatch):
    matmul = np.matmul

    def off_by_rows(a, b, out=None):  # a BLAS whose bits depend on how many rows it is given
        r = matmul(a, b) * (1 + a.shape[0] * np.finfo(a.dtype).eps)
        if out is None:
            return r
        out[...] = r
        return out

    monkeypatch.setattr(pair.np, "matmul", off_by_rows)
    x, y = np.ones((1600, 33), np.float32), np.ones((33, 512), np.float32)
    out = np.zeros((1600, 512), np.float32)
    assert not pair.split_matmul(x, y, out)
    assert pair._agree == {("float32", 1600, 33, 512, "C", "C", 2): 0}
    assert not pair.split_matmul(x, y, out)  # known to differ: never split
    assert not out.any()


# The tests below that need a split use 1536 rows: the even cut (768) is a multiple of the
# rows OpenBLAS's float32 kernels make at a time on Intel (SkylakeX, 16) and on AMD (Haswell
# kernels, 24), so the parts have the whole one-thread product's bits on both.
def test_no_split_unless_every_condition_holds(split_on, monkeypatch):
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((1536, 33)).astype(np.float32), rng.standard_normal((33, 512)).astype(np.float32)
    out = np.empty((1536, 512), np.float32)
    cases = [
        (x[:8], y, out[:8]),  # small
        (x, y.astype(np.float64), out),  # mixed dtypes
        (x.astype(np.float16), y.astype(np.float16), np.zeros((1536, 512), np.float16)),
        (x, y, np.empty((512, 1536), np.float32).T),  # out not C-contiguous
        (x[::2], y, out[:768]),  # rows of x neither C- nor F-contiguous
        (np.ones((15, 8 * 1024 * 1024 // 15 // 512 + 1), np.float32), np.ones((560, 512), np.float32), out[:15]),
    ]
    for a, b, o in cases:
        assert not pair.split_matmul(a, b, o), (a.shape, b.shape, a.dtype)
    assert pair._agree == {}  # none of them was checked
    assert pair.split_matmul(x, y, out)  # all conditions hold: checked, split
    assert pair._agree == {("float32", 1536, 33, 512, "C", "C", 2): 768}
    assert pair.split_matmul(x, y, out)  # two BLAS threads: known, split again
    with monkeypatch.context() as m:
        m.setattr(pair, "blas_threads", lambda: 4)
        assert not pair.split_matmul(x, y, out)  # four: core keeps large products on OpenBLAS's threads
    with monkeypatch.context() as m:
        m.setattr(pair, "blas_threads", lambda: 1)
        assert not pair.split_matmul(x, y, out)
    with monkeypatch.context() as m:
        m.setattr(_blas, "machine_busy", lambda: True)
        assert not pair.split_matmul(x, y, out)
    with monkeypatch.context() as m:
        m.setattr(_blas, "openblas_spinning", lambda: True)  # an einsum just woke OpenBLAS's worker
        assert not pair.split_matmul(x, y, out)
    assert np.array_equal(out.view(np.uint8), _one_thread(x, y).view(np.uint8))


def test_a_narrow_product_is_split_by_rows_where_it_has_enough(split_on):
    # the first convolution's weight gradient, g.T @ columns: (32, N) @ (N, 9)
    rng = np.random.default_rng(5)
    g, cols = rng.standard_normal((40000, 32)).astype(np.float32), rng.standard_normal((40000, 9)).astype(np.float32)
    want = _one_thread(g.T, cols)
    out = np.full((32, 9), np.nan, np.float32)
    did = pair.split_matmul(g.T, cols, out)
    assert did == bool(pair._agree[("float32", 32, 40000, 9, "F", "C", 2)])
    if did:
        assert np.array_equal(out.view(np.uint8), want.view(np.uint8))
    narrow = np.empty((12, 9), np.float32)  # fewer than 2 * MIN_ROWS rows: whole
    assert not pair.split_matmul(g[:, :12].T.copy(), cols, narrow)


def test_core_counts_its_calls_on_openblas_threads():
    before = _blas.openblas_wakes()
    _blas._woke()
    assert _blas.openblas_wakes() == before + 1


def test_core_makes_no_product_on_openblas_threads(monkeypatch):
    threadpoolctl = pytest.importorskip("threadpoolctl")
    monkeypatch.setattr(_blas, "machine_busy", lambda: False)
    monkeypatch.setattr(_blas, "_spin_until", 0.0)
    x = np.ones((512, 512), np.float32)
    with threadpoolctl.threadpool_limits(2):
        _blas.matmul(np.stack([x, x]), np.stack([x, x]))  # batched, each product large: one thread
        _blas.matmul(x, x)
        assert not _blas.openblas_spinning()
        with _blas.wide(_blas.OPENBLAS_SINGLE):  # einsum's and QR's calls still run there
            np.matmul(x, x)
        assert _blas.openblas_spinning()


def test_at_most_max_shapes_are_checked(split_on, monkeypatch):
    monkeypatch.setattr(pair, "MAX_SHAPES", 2)
    rng = np.random.default_rng(4)
    did = []
    for m in (1536, 1537, 1538):
        x, y = rng.standard_normal((m, 33)).astype(np.float32), rng.standard_normal((33, 512)).astype(np.float32)
        did.append(pair.split_matmul(x, y, np.empty((m, 512), np.float32)))
    assert len(pair._agree) == 2 and not did[2]


def test_single_thread_sets_one_blas_thread_and_restores_the_count():
    threadpoolctl = pytest.importorskip("threadpoolctl")
    with threadpoolctl.threadpool_limits(2):
        before = recurrent.blas_threads()
        with _blas.single_thread():
            assert recurrent.blas_threads() == 1
        assert recurrent.blas_threads() == before


def test_lstm_training_steps_on_the_pair_match_the_numpy_path(monkeypatch):
    # The benchmark's LSTM step with everything on (scans on two threads, its large
    # products split), against kernels off: the same bits, step after step.
    monkeypatch.setattr(_blas, "machine_busy", lambda: False)
    monkeypatch.setattr(recurrent, "blas_threads", lambda: 2)
    monkeypatch.setattr(pair, "blas_threads", lambda: 2)
    monkeypatch.setattr(pair, "_agree", {})

    def train(steps=3):
        eo.manual_seed(0)
        model = eo.LSTM(32, 128)
        rng = np.random.default_rng(5)
        x = eo.tensor(rng.standard_normal((32, 50, 32), dtype=np.float32))
        y = eo.tensor(rng.standard_normal((32, 50, 128), dtype=np.float32))
        opt = eo.SGD(model.parameters(), lr=0.01)
        for _ in range(steps):
            loss = eo.sum(model(x)[0] * y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        return [p.data.copy() for p in model.parameters()] + [np.asarray(loss.data).reshape(1)]

    threadpoolctl = pytest.importorskip("threadpoolctl")
    with kernel_table.disabled(), threadpoolctl.threadpool_limits(2):
        want = train()
    calls = count_calls(monkeypatch, ("split_matmul", "lstm_forward_scan"))
    with threadpoolctl.threadpool_limits(2):
        got = train()
    for g, w in zip(got, want):
        assert np.array_equal(g.view(np.uint8), w.view(np.uint8))
    assert calls["lstm_forward_scan"] == 3 and calls["split_matmul"] >= 3 * 3


def test_a_users_model_has_the_same_bits_quiet_busy_and_on_one_blas_thread(monkeypatch):
    # The rule's point: a custom model's training (its own forward and activation, LayerNorm,
    # AdamW) ends with the same bits whether its large products were split over the pair (quiet),
    # made whole on one thread (busy), or OpenBLAS was set to one thread by the program.
    threadpoolctl = pytest.importorskip("threadpoolctl")
    monkeypatch.setattr(pair, "blas_threads", lambda: 2)
    monkeypatch.setattr(_blas, "openblas_spinning", lambda: False)

    class Net(eo.Module):
        def __init__(self):
            super().__init__()
            self.a, self.norm, self.b = eo.Linear(96, 256), eo.LayerNorm(256), eo.Linear(256, 40)

        def forward(self, x):
            h = self.norm(self.a(x))
            return self.b(h * eo.sigmoid(1.5 * h))  # the user's own activation

    def train(busy):
        monkeypatch.setattr(_blas, "machine_busy", lambda: busy)
        monkeypatch.setattr(pair, "_agree", {})
        eo.manual_seed(1)
        net = Net()
        rng = np.random.default_rng(2)
        x = eo.tensor(rng.standard_normal((1536, 96), dtype=np.float32))
        y = eo.tensor(rng.standard_normal((1536, 40), dtype=np.float32))
        opt = eo.AdamW(net.parameters(), lr=1e-3)
        for _ in range(3):
            loss = eo.mean((net(x) - y) ** 2)
            opt.zero_grad()
            loss.backward()
            opt.step()
        return [p.data.copy() for p in net.parameters()]

    with threadpoolctl.threadpool_limits(2):
        calls = count_calls(monkeypatch, ("split_matmul",))
        split = pair.run
        halves = []
        monkeypatch.setattr(pair, "run", lambda mine, theirs: halves.append(1) or split(mine, theirs))
        quiet = train(False)
        made_in_parts = len(halves)
        busy = train(True)
    with threadpoolctl.threadpool_limits(1):
        one = train(False)
    with kernel_table.disabled(), threadpoolctl.threadpool_limits(2):
        reference = train(False)
    assert calls["split_matmul"] > 0 and made_in_parts > 0  # products were split over the pair
    for q, b, o, r in zip(quiet, busy, one, reference):
        for got in (q, b, o):
            assert np.array_equal(got.view(np.uint8), r.view(np.uint8))


def test_core_offers_its_large_products_to_the_pair_without_an_out_array(split_on, monkeypatch):
    threadpoolctl = pytest.importorskip("threadpoolctl")
    with threadpoolctl.threadpool_limits(2):  # core's rule on two BLAS threads, on any machine
        _core_offers(monkeypatch)


def _core_offers(monkeypatch):
    calls = count_calls(monkeypatch, ["split_matmul"])
    rng = np.random.default_rng(7)
    x, y = rng.standard_normal((1536, 33)).astype(np.float32), rng.standard_normal((33, 512)).astype(np.float32)
    want = _one_thread(x, y)
    split = pair.run
    halves = []
    monkeypatch.setattr(pair, "run", lambda mine, theirs: halves.append(1) or split(mine, theirs))
    first = _blas.matmul(x, y)  # checked, made as two parts
    assert calls["split_matmul"] == 1 and pair._agree[("float32", 1536, 33, 512, "C", "C", 2)]
    got = _blas.matmul(x, y)
    assert calls["split_matmul"] == 2 and halves == [1, 1]
    for result in (first, got):
        assert result.shape == want.shape and result.flags.c_contiguous
        assert np.array_equal(result.view(np.uint8), want.view(np.uint8))
    monkeypatch.setattr(pair, "blas_threads", lambda: 1)  # refused: core's own product, same result
    again = _blas.matmul(x, y)
    assert calls["split_matmul"] == 3 and np.array_equal(again.view(np.uint8), want.view(np.uint8))
    ints = _blas.matmul(np.ones((1536, 33), np.int64), np.ones((33, 512), np.int64))
    assert calls["split_matmul"] == 3 and ints.dtype == np.int64 and (ints == 33).all()  # not offered


def test_the_worker_keeps_no_array_of_a_finished_job():
    # Its last job's closure (a split product's operands and result) used to stay alive until
    # the next job: 0.75 MiB more held by an autocast transformer's graph (test_saved_activations).
    import functools
    import gc
    import weakref

    big = np.ones(1 << 16, np.float32)
    gone = weakref.ref(big)
    pair.run(lambda: None, functools.partial(np.sum, big))  # holds the array itself, not a cell
    del big
    gc.collect()
    assert gone() is None


@pytest.mark.parametrize(
    ("x_shape", "y_shape", "transpose_y"),
    [
        ((32, 4, 64, 32), (32, 4, 32, 64), False),  # attention's scores, q @ k.T (k.T a view below)
        ((31, 4, 64, 64), (31, 4, 64, 32), False),  # weights @ v, an odd stack: halves of 15 and 16
        ((48, 50, 40), (48, 40, 50), True),  # 3-D, a transposed (F-ordered items) operand
    ],
)
def test_stacked_products_in_halves_have_the_bits_of_matmul(split_on, monkeypatch, x_shape, y_shape, transpose_y):
    monkeypatch.setattr(pair, "owns_second_core", lambda: True)
    monkeypatch.setattr(_blas, "SMALL_MNK", 1 << 18)
    rng = np.random.default_rng(sum(x_shape))
    x = rng.standard_normal(x_shape).astype(np.float32)
    y = rng.standard_normal(y_shape).astype(np.float32)
    if transpose_y:
        y = np.swapaxes(rng.standard_normal(y_shape[:-2] + y_shape[-1:] + y_shape[-2:-1]).astype(np.float32), -1, -2)
    want = np.matmul(x, y)
    halves = []
    run = pair.run
    monkeypatch.setattr(pair, "run", lambda mine, theirs: halves.append(1) or run(mine, theirs))
    for _ in range(2):  # the first call checks (on these operands), the second only splits
        out = np.full(want.shape, np.nan, np.float32)
        assert pair.split_batched(x, y, out)
        assert np.array_equal(out.view(np.uint8), want.view(np.uint8))
    assert halves == [1, 1] and list(pair._agree.values()) == [True]
    via_core = _blas.matmul(x, y, np.empty_like(want))  # core offers such a stack
    assert np.array_equal(via_core.view(np.uint8), want.view(np.uint8)) and halves == [1, 1, 1]


def test_no_stacked_split_unless_every_condition_holds(split_on, monkeypatch):
    monkeypatch.setattr(_blas, "SMALL_MNK", 1 << 19)
    monkeypatch.setattr(pair, "owns_second_core", lambda: True)
    rng = np.random.default_rng(8)
    x = rng.standard_normal((32, 64, 32)).astype(np.float32)
    y = rng.standard_normal((32, 32, 64)).astype(np.float32)
    out = np.empty((32, 64, 64), np.float32)
    cases = [
        (x[:1], y[:1], out[:1]),  # a stack of one
        (x[0], y[0], out[0]),  # 2-D: split_matmul's
        (x, y[:1], out),  # broadcast over the stack
        (x, y.astype(np.float64), out),  # mixed dtypes
        (x[:2], y[:2], out[:2]),  # too little work
        (np.ones((8, 128, 64), np.float32), np.ones((8, 64, 64), np.float32), np.empty((8, 128, 64), np.float32)),
        (x, y, np.empty((64, 64, 32), np.float32).transpose(2, 0, 1)),  # out not C-contiguous
    ]
    monkeypatch.setattr(_blas, "OPENBLAS_SINGLE", 128 * 64 * 64)  # case 5: each product "OpenBLAS's own"
    for a, b, o in cases:
        assert not pair.split_batched(a, b, o), (a.shape, b.shape, a.dtype)
    monkeypatch.setattr(pair, "owns_second_core", lambda: False)
    assert not pair.split_batched(x, y, out)
    monkeypatch.setattr(pair, "owns_second_core", lambda: True)
    assert pair.split_batched(x, y, out) and pair._agree
