"""One OpenBLAS thread's bits for every product, quiet or busy (everyo._blas)."""

import os
import threading
import time

import numpy as np
import pytest

from everyo import _blas


@pytest.fixture
def readings(monkeypatch):
    """Feed machine_busy a sequence of runnable-thread counts on a 2-core machine."""
    values = []
    monkeypatch.setattr(_blas, "_CORES", 2)
    monkeypatch.setattr(_blas, "_busy", False)
    monkeypatch.setattr(_blas, "_runnable", 0.0)
    monkeypatch.setattr(_blas, "BUSY_CHECK_S", 0.0)
    monkeypatch.setattr(_blas, "_read_runnable", lambda: values.pop(0))
    return values


def test_busy_with_two_more_threads_than_cores_and_not_alone(readings):
    readings += [2, 2, 2, 2]  # this process's caller and BLAS worker on 2 cores
    assert not any(_blas.machine_busy() for _ in range(4))
    readings += [5, 5, 5]  # two CPU-bound processes beside them
    assert [_blas.machine_busy() for _ in range(3)][-1]


def test_busy_stays_while_the_cores_are_oversubscribed_then_ends(readings):
    readings += [6, 6, 6, 6]
    assert [_blas.machine_busy() for _ in range(4)][-1]
    readings += [3, 3, 3, 3, 3]  # one thread fewer once BLAS runs on one: still busy
    assert all(_blas.machine_busy() for _ in range(5))
    readings += [1, 1, 1, 1]  # the others ended
    assert not [_blas.machine_busy() for _ in range(4)][-1]


def test_unreadable_count_is_not_busy(readings):
    readings += [None]
    assert not _blas.machine_busy()


@pytest.mark.parametrize("shape", [(32, 128, 512), (4, 32, 128, 128), (256, 300, 400)])
def test_products_are_numpys_and_the_thread_count_is_restored(shape):
    rng = np.random.default_rng(0)
    *lead, m, k, n = shape
    x = rng.standard_normal((*lead, m, k)).astype(np.float32)
    y = rng.standard_normal((*lead, k, n)).astype(np.float32)
    found = _blas._find()
    before = found[0]() if found else None
    # NumPy's product on one OpenBLAS thread: core's rule, on two BLAS threads, for every
    # product OpenBLAS would split, and on any count for a small one (on OpenBLAS's Haswell
    # kernels, an AMD EPYC, one and two threads give most shapes other bits, so the count is
    # part of the result, the same whatever the machine's load). With more threads a large
    # product keeps them on a quiet machine.
    small = m * k * n < _blas.SMALL_MNK
    if m * k * n >= _blas.OPENBLAS_SINGLE and found and (small or _blas._count() <= 2):
        threadpoolctl = pytest.importorskip("threadpoolctl")
        with threadpoolctl.threadpool_limits(1):
            want = np.matmul(x, y)
    else:
        want = np.matmul(x, y)
    assert np.array_equal(_blas.matmul(x, y).view(np.uint8), want.view(np.uint8))
    out = np.empty((*lead, m, n), np.float32)
    assert _blas.matmul(x, y, out) is out
    assert np.array_equal(out.view(np.uint8), want.view(np.uint8))
    assert (found[0]() if found else None) == before


@pytest.fixture
def fake_openblas(monkeypatch):
    """A stand-in for OpenBLAS's process-wide thread count: (get, put) and the calls."""
    state = {"count": 2, "puts": []}

    def put(n):
        state["count"] = n
        state["puts"].append(n)

    monkeypatch.setattr(_blas, "_threads", (lambda: state["count"], put))
    monkeypatch.setattr(_blas, "_held", 0)
    monkeypatch.setattr(_blas, "_saved", 1)
    monkeypatch.setattr(_blas, "_hold_pid", os.getpid())
    # the two sides (holds, products on OpenBLAS's threads) start empty
    lock = threading.Lock()
    monkeypatch.setattr(_blas, "_switch_lock", lock)
    monkeypatch.setattr(_blas, "_switch", threading.Condition(lock))
    monkeypatch.setattr(_blas, "_side", 0)
    monkeypatch.setattr(_blas, "_inside", 0)
    monkeypatch.setattr(_blas, "_waiting", [0, 0, 0])
    monkeypatch.setattr(_blas, "_last", 0)
    return state


def test_overlapping_holds_of_two_threads_restore_the_count_once_the_last_ends(fake_openblas):
    # Thread A holds one BLAS thread, B takes a hold inside A's, A ends first: B's block must
    # still run on one thread (before the count of holds, A's end gave 2 back under B).
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def thread_a():
        with _blas.single_thread():
            a_in.set()
            b_in.wait()
        a_out.set()

    def thread_b():
        a_in.wait()
        with _blas.single_thread():
            b_in.set()
            a_out.wait()
            seen["inside B after A ended"] = fake_openblas["count"]
        seen["after both"] = fake_openblas["count"]

    threads = [threading.Thread(target=thread_a), threading.Thread(target=thread_b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == {"inside B after A ended": 1, "after both": 2}
    assert fake_openblas["puts"] == [1, 2]  # set once by the first hold, restored once by the last


def test_nested_holds_and_products_on_one_thread_keep_one_count(fake_openblas):
    with _blas.single_thread():
        with _blas.threads_for(_blas.OPENBLAS_SINGLE):  # a small product's rule inside a split
            assert fake_openblas["count"] == 1
        assert fake_openblas["count"] == 1
    assert fake_openblas["count"] == 2 and fake_openblas["puts"] == [1, 2]


def test_a_count_of_one_set_outside_is_left_alone(fake_openblas):
    fake_openblas["count"] = 1
    with _blas.single_thread():
        assert fake_openblas["count"] == 1 and _blas._held == 0  # nothing taken, so nothing to give back
    assert fake_openblas["puts"] == [] and fake_openblas["count"] == 1


def test_a_fork_child_gives_back_a_hold_whose_thread_it_does_not_have(fake_openblas, monkeypatch):
    # The parent's holding thread does not exist in a fork child: the child's first hold
    # restores the count that thread took, instead of staying on one thread for good.
    with _blas.single_thread():
        monkeypatch.setattr(_blas, "_hold_pid", -1)  # as in a child forked here
        child_lock = _blas._hold_lock
        with _blas.single_thread():
            assert fake_openblas["count"] == 1
        assert _blas._hold_lock is not child_lock  # a fresh lock: the parent's could be taken
        assert fake_openblas["puts"] == [1, 2, 1, 2]
    assert fake_openblas["puts"] == [1, 2, 1, 2]  # the forking thread's own end: nothing left to restore
    assert _blas._held == 0 and fake_openblas["count"] == 2


# --- a busy machine must not change a product's bits ---------------------------------------


@pytest.fixture
def fresh_checks(monkeypatch):
    # the thread rule alone: with everyo-kernels, a large product may go to its pair of
    # threads first (tests/kernels/test_pair.py), whose own check takes holds too
    get = _blas.kernel_table.get
    monkeypatch.setattr(_blas.kernel_table, "get", lambda name: None if name == "split_matmul" else get(name))


@pytest.mark.parametrize("shape", [(500, 500, 500), (100, 3000, 100), (256, 700, 301)])
def test_a_busy_machine_gives_the_quiet_machines_bits(fresh_checks, monkeypatch, shape):
    # OpenBLAS 0.3.31 gives these shapes other bits on one thread than on two (on its
    # SkylakeX kernels; on the Haswell kernels almost every shape): a product has one
    # thread's bits whether the machine is busy or not.
    m, k, n = shape
    rng = np.random.default_rng(m + k + n)
    x, y = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    monkeypatch.setattr(_blas, "machine_busy", lambda: False)
    quiet = _blas.matmul(x, y)
    monkeypatch.setattr(_blas, "machine_busy", lambda: True)
    busy = _blas.matmul(x, y)
    assert np.array_equal(busy.view(np.uint32), quiet.view(np.uint32))
    # and with x's columns contiguous, as in a weight gradient x.T @ g
    xf = np.asfortranarray(x)
    monkeypatch.setattr(_blas, "machine_busy", lambda: False)
    quiet = _blas.matmul(xf, y)
    monkeypatch.setattr(_blas, "machine_busy", lambda: True)
    assert np.array_equal(_blas.matmul(xf, y).view(np.uint32), quiet.view(np.uint32))


def _thread_dependent_matmul(monkeypatch, state, differs=True):
    """np.matmul of a BLAS whose bits change with its thread count (when ``differs``)."""
    real = np.matmul

    def fake(a, b, out=None):
        r = real(a, b)
        if differs and state["count"] > 1:
            r = r * (1 + np.finfo(r.dtype).eps)
        if out is None:
            return r
        out[...] = r
        return out

    monkeypatch.setattr(_blas.np, "matmul", fake)


@pytest.mark.parametrize("busy", [False, True])
@pytest.mark.parametrize("shape", [(256, 256, 256), (32, 128, 512), (3, 128, 64, 128)])
def test_every_product_openblas_would_split_takes_one_thread(fake_openblas, fresh_checks, monkeypatch, busy, shape):
    _thread_dependent_matmul(monkeypatch, fake_openblas)
    monkeypatch.setattr(_blas, "machine_busy", lambda: busy)
    *lead, m, k, n = shape
    x, y = np.ones((*lead, m, k), np.float32), np.ones((*lead, k, n), np.float32)
    got = _blas.matmul(x, y)
    assert (got == k).all()  # the one-thread bits of the fake BLAS (two threads: k * (1 + eps))
    assert fake_openblas["puts"] == [1, 2] and fake_openblas["count"] == 2  # held, then restored
    small = np.ones((32, 64), np.float32), np.ones((64, 64), np.float32)  # OpenBLAS's one thread anyway
    _blas.matmul(*small)
    assert fake_openblas["puts"] == [1, 2]  # no call made


@pytest.mark.parametrize("differs", [True, False])
def test_on_more_than_two_threads_the_check_decides_whether_a_busy_machine_takes_one(
    fake_openblas, fresh_checks, monkeypatch, differs
):
    fake_openblas["count"] = 4
    _thread_dependent_matmul(monkeypatch, fake_openblas, differs)
    monkeypatch.setattr(_blas, "_alone", {})
    x = np.ones((256, 256), np.float32)  # m * n * k = 2^24, large
    monkeypatch.setattr(_blas, "machine_busy", lambda: False)
    quiet = _blas.matmul(x, x)
    assert _blas._alone == {("<f4", 256, 256, 256, "C", "C", 4): not differs}  # checked at its first product
    assert fake_openblas["puts"] == [1, 4]  # the check's one-thread product; the product on four
    monkeypatch.setattr(_blas, "machine_busy", lambda: True)
    busy = _blas.matmul(x, x)
    assert np.array_equal(busy, quiet)  # the same bits, busy or not
    assert fake_openblas["puts"] == ([1, 4] if differs else [1, 4, 1, 4])  # one thread only where it agrees
    monkeypatch.setattr(_blas, "MAX_CHECKED", 1)
    assert not _blas._alone_same(np.dtype(np.float32), 400, 400, 400)  # past the cap: keep BLAS's threads
    assert _blas._alone_same(np.dtype(np.int64), 400, 400, 400)  # NumPy's own loop: no BLAS threads
    small = np.ones((32, 64), np.float32), np.ones((64, 128), np.float32)  # small: one thread on any count
    _blas.matmul(*small)
    assert fake_openblas["puts"][-2:] == [1, 4] and fake_openblas["count"] == 4


def test_threads_for_holds_one_thread_for_products_openblas_would_split(fake_openblas):
    with _blas.threads_for(1 << 24, (np.float32, 256, 256, 256)):
        assert fake_openblas["count"] == 1
    with _blas.threads_for(1 << 24):  # an older everyo-kernels: no shape, the same rule
        assert fake_openblas["count"] == 1
    with _blas.threads_for(_blas.OPENBLAS_SINGLE - 1):  # OpenBLAS's one thread anyway: nothing set
        assert fake_openblas["count"] == 2
    assert fake_openblas["count"] == 2
    fake_openblas["count"] = 4  # more threads, a quiet machine: large products keep them
    with _blas.threads_for(1 << 24, (np.float32, 256, 256, 256)):
        assert fake_openblas["count"] == 4


# --- a hold of one thread never reaches another thread's product on OpenBLAS's threads ------
# OpenBLAS's count is one number for the process: a product another thread started while a
# hold was in force ran on one thread, and for some shapes (above) got other bits.

BIG = 1 << 24  # a product OpenBLAS runs on its threads


def _until(condition, what):
    """Wait for another thread to reach a state (a handshake on _blas's own counters);
    the deadline only turns a deadlock into a failure."""
    deadline = time.monotonic() + 60
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.001)


def _run_together(*targets):
    """Run each target on a thread of its own, all at once; return when all have ended."""
    threads = [threading.Thread(target=t) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def test_a_product_on_blas_threads_waits_for_another_threads_hold(fake_openblas):
    seen = []
    holding = threading.Event()

    def hold():
        with _blas.single_thread():
            holding.set()
            _until(lambda: _blas._waiting[_blas.WIDE] == 1, "the product waits")
            seen.append("hold ends")

    def product():
        holding.wait()
        with _blas.wide(BIG):
            seen.append(("product runs on", fake_openblas["count"]))

    _run_together(hold, product)
    assert seen == ["hold ends", ("product runs on", 2)]


def test_a_hold_waits_for_another_threads_product_on_blas_threads(fake_openblas):
    seen = []
    running = threading.Event()

    def product():
        with _blas.wide(BIG):
            running.set()
            _until(lambda: _blas._waiting[_blas.ONE] == 1, "the hold waits")
            seen.append(("product ends on", fake_openblas["count"]))

    def hold():
        running.wait()
        with _blas.single_thread():
            seen.append(("hold runs on", fake_openblas["count"]))

    _run_together(product, hold)
    assert seen == [("product ends on", 2), ("hold runs on", 1)]
    assert fake_openblas["count"] == 2


def test_a_waiting_product_is_not_kept_out_by_later_holds(fake_openblas):
    # Holds may overlap, but not past a waiting product: a hold that comes after it waits too.
    seen = []
    holding = threading.Event()

    def first_hold():
        with _blas.single_thread():
            holding.set()
            _until(lambda: _blas._waiting[_blas.ONE] == 1, "the later hold waits")
            seen.append("first hold ends")

    def product():
        holding.wait()
        with _blas.wide(BIG):
            seen.append("product")

    def later_hold():
        _until(lambda: _blas._waiting[_blas.WIDE] == 1, "the product waits")
        with _blas.single_thread():
            seen.append("later hold")

    _run_together(first_hold, product, later_hold)
    assert seen == ["first hold ends", "product", "later hold"]


def test_holds_overlap_and_products_overlap(fake_openblas):
    # Same side: no waiting (two threads each inside at once).
    for enter in (_blas.single_thread, lambda: _blas.wide(BIG)):
        both_in = threading.Barrier(2)

        def inside(enter=enter, both_in=both_in):
            with enter():
                both_in.wait()

        _run_together(inside, inside)
    assert _blas._inside == 0 and _blas._side == 0


def test_a_product_inside_its_own_threads_hold_runs_at_once(fake_openblas):
    with _blas.single_thread():
        with _blas.wide(BIG):  # nested in this thread's own hold: one thread, as before
            assert fake_openblas["count"] == 1
    assert _blas._inside == 0 and fake_openblas["count"] == 2


def test_small_products_and_no_openblas_take_no_side(fake_openblas, monkeypatch):
    with _blas.wide(_blas.OPENBLAS_SINGLE - 1):
        assert _blas._inside == 0
    monkeypatch.setattr(_blas, "_threads", False)
    with _blas.wide(BIG):
        assert _blas._inside == 0


def test_a_product_beside_a_hold_keeps_its_bits_with_the_real_blas():
    # (500, 500) @ (500, 500): other bits on one OpenBLAS 0.3.31 thread than on two (above); a
    # call on OpenBLAS's threads beside another thread's hold keeps two threads' bits.
    rng = np.random.default_rng(0)
    x, y = (rng.standard_normal((500, 500)).astype(np.float32) for _ in range(2))
    alone = np.matmul(x, y)
    holding = threading.Event()

    def hold():
        with _blas.single_thread():
            holding.set()
            if _blas._held:  # OpenBLAS found with more than one thread: the product must wait
                _until(lambda: _blas._waiting[_blas.WIDE] == 1, "the product waits")

    beside = np.empty_like(alone)

    def product():  # a call EveryO leaves on OpenBLAS's threads (einsum's, QR's)
        holding.wait()
        with _blas.wide(x.shape[0] * x.shape[1] * y.shape[1]):
            np.matmul(x, y, out=beside)

    _run_together(hold, product)
    assert np.array_equal(beside.view(np.uint32), alone.view(np.uint32))


def test_a_thread_taking_holds_in_a_loop_lets_a_waiting_product_in(fake_openblas):
    seen = []
    holding = threading.Event()

    def holds():
        with _blas.single_thread():
            holding.set()
            _until(lambda: _blas._waiting[_blas.WIDE] == 1, "the product waits")
        seen.append("first hold ended")
        with _blas.single_thread():  # straight back: must not get in before the product
            seen.append("second hold")

    def product():
        holding.wait()
        with _blas.wide(BIG):
            _until(lambda: _blas._waiting[_blas.ONE] == 1 or "second hold" in seen, "the second hold comes")
            seen.append("product")

    _run_together(holds, product)
    assert seen == ["first hold ended", "product", "second hold"]
