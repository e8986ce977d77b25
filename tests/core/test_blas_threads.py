"""One BLAS thread for small products and on a busy machine (everyo._blas)."""

import os
import threading

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
    np.testing.assert_array_equal(_blas.matmul(x, y), np.matmul(x, y))
    out = np.empty((*lead, m, n), np.float32)
    assert _blas.matmul(x, y, out) is out
    np.testing.assert_array_equal(out, np.matmul(x, y))
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
