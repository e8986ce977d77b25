"""One BLAS thread for small products and on a busy machine (everyo._blas)."""

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
