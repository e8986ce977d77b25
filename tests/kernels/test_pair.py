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
    """The conditions that make split_matmul split: the worker awake, the machine not busy,
    two BLAS threads, OpenBLAS's jobs on its own workers (an OpenBLAS without the threads
    callback: install_jobs); a fresh record of checked shapes, and no settling time."""
    monkeypatch.setattr(pair, "install_jobs", lambda: False)
    monkeypatch.setattr(pair, "jobs_on_pair", lambda: False)
    monkeypatch.setattr(pair, "awake", lambda: True)
    monkeypatch.setattr(_blas, "machine_busy", lambda: False)
    monkeypatch.setattr(pair, "blas_threads", lambda: 2)
    monkeypatch.setattr(pair, "_agree", {})
    monkeypatch.setattr(pair, "SETTLE_S", 0.0)
    monkeypatch.setattr(_blas, "openblas_spinning", lambda: False)


def _matrix(rng, shape, dtype, layout):
    a = rng.standard_normal(shape).astype(dtype)
    return a if layout == "C" else np.asfortranarray(a)


@pytest.mark.parametrize(
    ("m", "k", "n", "x_layout", "dtype"),
    [
        (1600, 33, 512, "C", np.float32),  # the benchmark LSTM's input projection: by rows
        (128, 1600, 512, "F", np.float32),  # W_hh's gradient, prev.T @ d: by columns
        (33, 1600, 512, "F", np.float32),  # W_ih's (and the bias row's) gradient
        (1601, 37, 301, "C", np.float32),  # odd sizes, no SIMD width divides them
        (64, 700, 301, "F", np.float32),  # K between one and two of OpenBLAS's K blocks
        (512, 300, 64, "C", np.float64),
    ],
)
def test_split_products_have_the_bits_of_matmul(split_on, m, k, n, x_layout, dtype):
    rng = np.random.default_rng(m + k + n)
    x, y = _matrix(rng, (m, k), dtype, x_layout), _matrix(rng, (k, n), dtype, "C")
    want = np.matmul(x, y)  # as core computes it (BLAS's threads as set)
    out = np.full((m, n), np.nan, dtype)
    assert not pair.split_matmul(x, y, out)  # a shape's first product: checked, left to core
    assert np.isnan(out).all()
    did = pair.split_matmul(x, y, out)
    key = (np.dtype(dtype).name, m, k, n, x_layout, "C", 2)
    assert did == pair._agree[key]  # split exactly where its check found the parts' bits equal
    if did:
        assert np.array_equal(out.view(np.uint8), want.view(np.uint8))
    else:
        assert np.isnan(out).all()  # nothing written: core then runs its own product


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
    assert pair._agree == {("float32", 1600, 33, 512, "C", "C", 2): False}
    assert not pair.split_matmul(x, y, out)  # known to differ: never split
    assert not out.any()


# The tests below that need a split use 1536 rows: the halves' cut (768) is a multiple of the
# rows OpenBLAS's float32 kernels make at a time on Intel (SkylakeX, 16) and on AMD (Haswell
# kernels, 12, counted from a range's first row), so the halves have the whole product's bits on
# both; 1600 rows (a cut at 800) gave other bits on an AMD EPYC, where the split is then, rightly,
# not made.
def test_no_split_unless_every_condition_holds(split_on, monkeypatch):
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((1536, 33)).astype(np.float32), rng.standard_normal((33, 512)).astype(np.float32)
    out = np.empty((1536, 512), np.float32)
    cases = [
        (x[:8], y, out[:8]),  # small: stays on one thread under core's rule anyway
        (x, y.astype(np.float64), out),  # mixed dtypes
        (x.astype(np.float16), y.astype(np.float16), np.zeros((1536, 512), np.float16)),
        (x, y, np.empty((512, 1536), np.float32).T),  # out not C-contiguous
        (x[::2], y, out[:768]),  # rows of x neither C- nor F-contiguous
        (np.ones((20, 8 * 1024 * 1024 // 20 // 512 + 1), np.float32), np.ones((420, 20), np.float32), out[:20, :20]),
    ]
    for a, b, o in cases:
        assert not pair.split_matmul(a, b, o), (a.shape, b.shape, a.dtype)
    assert not pair.split_matmul(x, y, out)  # the shape's first product: checked
    assert pair.split_matmul(x, y, out)  # all conditions hold
    with monkeypatch.context() as m:
        m.setattr(pair, "awake", lambda: False)
        assert pair.split_matmul(x, y, out)  # two BLAS threads: the pair owns the second core
        m.setattr(pair, "blas_threads", lambda: 4)
        assert not pair.split_matmul(x, y, out)  # four, and no scan just ran: OpenBLAS's threads
        m.setattr(pair, "awake", lambda: True)
        assert not pair.split_matmul(x, y, out)  # right after a scan, as before: a new key, checked
        assert pair.split_matmul(x, y, out)
    with monkeypatch.context() as m:
        m.setattr(pair, "blas_threads", lambda: 1)
        assert not pair.split_matmul(x, y, out)
    with monkeypatch.context() as m:
        m.setattr(_blas, "machine_busy", lambda: True)
        assert not pair.split_matmul(x, y, out)


def test_a_narrow_product_is_split_along_its_long_side(split_on):
    # the first convolution's weight gradient, g.T @ columns: (32, N) @ (N, 9)
    rng = np.random.default_rng(5)
    g, cols = rng.standard_normal((40000, 32)).astype(np.float32), rng.standard_normal((40000, 9)).astype(np.float32)
    want = np.matmul(g.T, cols)
    out = np.full((32, 9), np.nan, np.float32)
    assert not pair.split_matmul(g.T, cols, out)  # checked
    assert pair.split_matmul(g.T, cols, out) == pair._agree[("float32", 32, 40000, 9, "F", "C", 2)]
    if pair._agree[("float32", 32, 40000, 9, "F", "C", 2)]:
        assert np.array_equal(out.view(np.uint8), want.view(np.uint8))
    narrow = np.empty((12, 9), np.float32)  # no side of 16 or more: whole
    assert not pair.split_matmul(g[:, :12].T.copy(), cols, narrow)


def test_a_spinning_openblas_worker_is_waited_for_once_per_checked_shape(split_on, monkeypatch):
    spinning = [True]
    slept = []

    def sleep(seconds):  # a wait ends when OpenBLAS's worker settles
        slept.append(seconds)
        spinning[0] = False

    monkeypatch.setattr(pair.time, "sleep", sleep)
    monkeypatch.setattr(pair, "SETTLE_S", 3600.0)  # the longest wait (the fake sleep ends it at once)
    monkeypatch.setattr(_blas, "openblas_spinning", lambda: spinning[0])
    monkeypatch.setattr(pair, "_waits", 0)
    rng = np.random.default_rng(6)
    x, y = rng.standard_normal((1536, 33)).astype(np.float32), rng.standard_normal((33, 512)).astype(np.float32)
    out = np.full((1536, 512), np.nan, np.float32)
    key = ("float32", 1536, 33, 512, "C", "C", 2)
    assert not pair.split_matmul(x, y, out) and pair._waits == 1  # checked: one wait granted
    assert pair._agree[key], "this BLAS gives the halves other bits: nothing below would split"
    assert pair.split_matmul(x, y, out) and len(slept) == 1 and pair._waits == 0  # waited, then split
    assert np.array_equal(out.view(np.uint8), np.matmul(x, y).view(np.uint8))
    spinning[0] = True  # another product woke it again, no wait left: core makes this one
    out[...] = np.nan
    assert not pair.split_matmul(x, y, out) and np.isnan(out).all() and len(slept) == 1
    assert not pair.owns_second_core()  # no halves either while it spins
    spinning[0] = False
    assert pair.split_matmul(x, y, out) and pair.owns_second_core()


def test_no_wait_for_a_worker_the_programs_own_product_woke(split_on, monkeypatch):
    # a shape whose halves have other bits runs on OpenBLAS's threads in every step: waiting
    # SETTLE_S for the worker it wakes would cost every step that long (a CNN step on an AMD
    # EPYC: 71 -> 264 ms); only a check's own product is waited for
    spinning = [True]
    slept = []
    monkeypatch.setattr(pair.time, "sleep", lambda seconds: slept.append(seconds))
    monkeypatch.setattr(_blas, "openblas_spinning", lambda: spinning[0])
    monkeypatch.setattr(pair, "_waits", 0)
    rng = np.random.default_rng(6)
    x, y = rng.standard_normal((1536, 33)).astype(np.float32), rng.standard_normal((33, 512)).astype(np.float32)
    out = np.full((1536, 512), np.nan, np.float32)
    assert not pair.split_matmul(x, y, out) and pair._waits == 1  # checked: one wait granted
    assert pair._agree[("float32", 1536, 33, 512, "C", "C", 2)], "this BLAS gives the halves other bits"
    _blas._woke()  # the program's own product on OpenBLAS's threads, after the check
    assert not pair.split_matmul(x, y, out) and np.isnan(out).all()  # left to core, at once
    assert slept == [] and pair._waits == 1  # no wait, and none used up
    spinning[0] = False
    assert pair.split_matmul(x, y, out)
    assert np.array_equal(out.view(np.uint8), np.matmul(x, y).view(np.uint8))


def test_core_counts_its_products_on_openblas_threads():
    before = _blas.openblas_wakes()
    _blas._woke()
    assert _blas.openblas_wakes() == before + 1


def test_core_notes_its_products_on_openblas_threads(monkeypatch):
    threadpoolctl = pytest.importorskip("threadpoolctl")
    monkeypatch.setattr(_blas, "machine_busy", lambda: False)  # busy, the product would take one thread
    monkeypatch.setattr(_blas, "_spin_until", 0.0)
    x = np.ones((512, 512), np.float32)
    with threadpoolctl.threadpool_limits(2):
        assert not _blas.openblas_spinning()
        _blas.matmul(np.stack([x, x]), np.stack([x, x]))  # batched, each product large: on OpenBLAS's threads
        assert _blas.openblas_spinning()


def test_at_most_max_shapes_are_checked(split_on, monkeypatch):
    monkeypatch.setattr(pair, "MAX_SHAPES", 2)
    rng = np.random.default_rng(4)
    did = []
    for m in (1600, 1601, 1602):
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
    monkeypatch.setattr(pair, "awake", lambda: True)
    monkeypatch.setattr(pair, "_agree", {})
    monkeypatch.setattr(pair, "SETTLE_S", 0.0)

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

    with kernel_table.disabled():
        want = train()
    calls = count_calls(monkeypatch, ("split_matmul", "lstm_forward_scan"))
    got = train()
    for g, w in zip(got, want):
        assert np.array_equal(g.view(np.uint8), w.view(np.uint8))
    assert calls["lstm_forward_scan"] == 3 and calls["split_matmul"] >= 3 * 3


@pytest.mark.parametrize("route", ["matmul", "matmul_as_is"])
def test_core_offers_its_large_products_to_the_pair_without_an_out_array(split_on, monkeypatch, route):
    calls = count_calls(monkeypatch, ["split_matmul"])
    rng = np.random.default_rng(7)
    x, y = rng.standard_normal((1536, 33)).astype(np.float32), rng.standard_normal((33, 512)).astype(np.float32)
    want = np.matmul(x, y)
    first = getattr(_blas, route)(x, y)  # checked, made by core
    assert calls["split_matmul"] == 1 and pair._agree[("float32", 1536, 33, 512, "C", "C", 2)]
    split = pair.run
    halves = []
    monkeypatch.setattr(pair, "run", lambda mine, theirs: halves.append(1) or split(mine, theirs))
    got = getattr(_blas, route)(x, y)  # made as two halves
    assert calls["split_matmul"] == 2 and halves == [1]
    for result in (first, got):
        assert result.shape == want.shape and result.flags.c_contiguous
        assert np.array_equal(result.view(np.uint8), want.view(np.uint8))
    monkeypatch.setattr(pair, "blas_threads", lambda: 1)  # refused: core's own product, same result
    again = getattr(_blas, route)(x, y)
    assert calls["split_matmul"] == 3 and np.array_equal(again.view(np.uint8), want.view(np.uint8))
    ints = getattr(_blas, route)(np.ones((1536, 33), np.int64), np.ones((33, 512), np.int64))
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
