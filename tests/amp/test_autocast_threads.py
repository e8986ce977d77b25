"""One autocast object shared by threads, and entered again while open, works as torch's
does (per-thread state): each thread's block turns 16-bit on for that thread only, and leaving
it in any order restores that thread's previous state. Sequenced with barriers, not timing."""

import threading

import numpy as np
import pytest

import everyo as eo
from everyo.amp import is_autocast_enabled

X = eo.tensor(np.ones((2, 3), np.float32))
W = eo.tensor(np.ones((3, 2), np.float32))


def test_one_object_entered_from_two_threads_left_in_either_order():
    shared = eo.autocast()
    both_inside, first_left, errors, seen = threading.Barrier(2), threading.Barrier(2), [], {}

    def worker(name, leaves_first):
        try:
            with shared:
                both_inside.wait(timeout=30)
                seen[name, "inside"] = ((X @ W).dtype, is_autocast_enabled())
                if not leaves_first:
                    first_left.wait(timeout=30)  # the other thread has left the same object
                    seen[name, "after other left"] = ((X @ W).dtype, is_autocast_enabled())
            seen[name, "outside"] = ((X @ W).dtype, is_autocast_enabled())
            if leaves_first:
                first_left.wait(timeout=30)
        except Exception as exc:  # reported in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=("a", True)), threading.Thread(target=worker, args=("b", False))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    f16, f32 = np.dtype("float16"), np.dtype("float32")
    assert seen["a", "inside"] == seen["b", "inside"] == (f16, True)
    assert seen["b", "after other left"] == (f16, True)
    assert seen["a", "outside"] == seen["b", "outside"] == (f32, False)
    assert not is_autocast_enabled()


def test_many_rounds_with_threads_reusing_one_object():
    shared, barrier, errors = eo.autocast(dtype="bfloat16"), threading.Barrier(4), []

    def worker():
        try:
            for _ in range(200):
                with shared:
                    barrier.wait(timeout=30)
                    assert (X @ W).dtype.name == "bfloat16"
                assert not is_autocast_enabled()
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_reentered_and_nested_in_one_thread():
    outer, island = eo.autocast(), eo.autocast(enabled=False)
    with outer:
        with island:
            assert not is_autocast_enabled()
            with outer:  # the same object again, while open
                assert (X @ W).dtype == np.float16
            assert not is_autocast_enabled()
        assert is_autocast_enabled()
    assert not is_autocast_enabled()


def test_leaving_where_it_was_not_entered_is_a_clear_error():
    with pytest.raises(RuntimeError, match="not entered in"):
        eo.autocast().__exit__(None, None, None)
