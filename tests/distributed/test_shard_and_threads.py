"""shard_indices properties, and the BLAS thread count spawn gives its workers."""

import os
import warnings

import numpy as np
import pytest
import shm_workers
from hypothesis import given
from hypothesis import strategies as st

from everyo.distributed import available_cores, shard_indices, spawn, worker_thread_env
from everyo.distributed.threads import THREAD_VARIABLES


@given(n=st.integers(0, 10_000), world_size=st.integers(1, 64))
def test_shards_are_disjoint_covering_balanced_and_deterministic(n, world_size):
    shards = [shard_indices(n, r, world_size) for r in range(world_size)]
    joined = np.concatenate(shards)
    np.testing.assert_array_equal(joined, np.arange(n))  # covering, disjoint, in rank order
    lengths = [len(s) for s in shards]
    assert max(lengths) - min(lengths) <= 1
    again = [shard_indices(n, r, world_size) for r in range(world_size)]
    assert all(np.array_equal(a, b) for a, b in zip(shards, again))


def test_shard_example_and_indexing():
    assert [shard_indices(10, r, 3).tolist() for r in range(3)] == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    rows = np.arange(20).reshape(10, 2)
    assert rows[shard_indices(10, 2, 3)].tolist() == [[14, 15], [16, 17], [18, 19]]


@pytest.mark.parametrize(
    "args, match",
    [
        ((10, 3, 3), "rank 3 is outside 0..2"),
        ((10, -1, 3), "rank -1 is outside"),
        ((10, 0, 0), "world_size must be >= 1"),
        ((-1, 0, 1), "n must be >= 0"),
    ],
)
def test_shard_errors(args, match):
    with pytest.raises(ValueError, match=match):
        shard_indices(*args)


def test_shard_rejects_floats():
    with pytest.raises(TypeError):
        shard_indices(10.0, 0, 2)


def test_thread_env_when_nothing_is_set():
    updates, warning = worker_thread_env(2, environ={}, cores=8)
    assert updates == {name: "4" for name in THREAD_VARIABLES}
    assert warning is None
    updates, warning = worker_thread_env(3, environ={}, cores=2)
    assert set(updates.values()) == {"1"}
    assert "3 workers on 2 cores" in warning and "time-share" in warning


def test_thread_env_respects_the_user_and_warns_only_on_oversubscription():
    assert worker_thread_env(2, environ={"OMP_NUM_THREADS": "1"}, cores=2) == ({}, None)
    assert worker_thread_env(2, environ={"OMP_NUM_THREADS": "4"}, cores=8) == ({}, None)
    updates, warning = worker_thread_env(4, environ={"OMP_NUM_THREADS": "4"}, cores=8)
    assert updates == {}
    assert "OMP_NUM_THREADS=4 with 4 workers asks for 16 threads on 8 cores" in warning
    # OpenBLAS reads its own variable first, so that one is the effective count.
    _, warning = worker_thread_env(2, environ={"OPENBLAS_NUM_THREADS": "2", "OMP_NUM_THREADS": "1"}, cores=2)
    assert "OPENBLAS_NUM_THREADS=2" in warning


@pytest.mark.usefixtures("no_leftovers")
def test_workers_start_with_the_thread_count_and_the_parent_env_is_restored(monkeypatch):
    for name in THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # 2 workers: no oversubscription warning on >= 2 cores
        if available_cores() < 2:
            warnings.simplefilter("ignore")
        results = spawn(shm_workers.thread_env, 2, timeout=60)
    expected = str(max(1, available_cores() // 2))
    for env, blas_threads in results:
        assert env["OMP_NUM_THREADS"] == env["OPENBLAS_NUM_THREADS"] == expected
        assert blas_threads and set(blas_threads) == {int(expected)}  # the BLAS really uses it
    assert not any(name in os.environ for name in THREAD_VARIABLES)


@pytest.mark.usefixtures("no_leftovers")
def test_user_thread_setting_is_kept_and_oversubscription_warned(monkeypatch):
    for name in THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    threads = max(2, available_cores())  # threads x 2 workers > cores: oversubscribed
    monkeypatch.setenv("OMP_NUM_THREADS", str(threads))
    with pytest.warns(RuntimeWarning, match=f"OMP_NUM_THREADS={threads} with 2 workers"):
        results = spawn(shm_workers.thread_env, 2, timeout=60)
    for env, blas_threads in results:
        assert env == {"OMP_NUM_THREADS": str(threads), "OPENBLAS_NUM_THREADS": None, "MKL_NUM_THREADS": None}
        assert set(blas_threads) == {threads}
