"""Every way a worker can fail makes spawn raise a specific error, fast, leaving nothing behind.

The ``no_leftovers`` fixture checks /dev/shm and child processes after each
test. ``timeout=60`` on the spawns below is only a safety net: the failures
must be reported long before it (a test that reached it would fail on the
message, since a timeout names different things).
"""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import shm_workers

from everyo.distributed import spawn
from everyo.errors import EveryODistributedError

pytestmark = pytest.mark.usefixtures("no_leftovers")


def spawn_error(worker, world_size=2, timeout=60, **kwargs):
    with pytest.raises(EveryODistributedError) as info:
        spawn(worker, world_size, timeout=timeout, **kwargs)
    return info.value, str(info.value)


def test_mismatched_operations_raise_naming_each_rank():
    _, message = spawn_error(shm_workers.mismatched_op)
    assert "collective mismatch" in message
    assert "rank 0 called all_reduce_mean(size=4, dtype=float32) as collective #0" in message
    assert "rank 1 called barrier() as collective #0" in message
    assert "different path through the loop" in message


def test_mismatched_sizes_raise_naming_each_rank():
    _, message = spawn_error(shm_workers.mismatched_size)
    assert "rank 0 called all_reduce_sum(size=5, dtype=float32) as collective #1" in message
    assert "rank 1 called all_reduce_sum(size=100000, dtype=float32) as collective #1" in message


def test_rank_that_returns_early_is_named_instead_of_hanging():
    _, message = spawn_error(shm_workers.returns_early)
    assert "rank 1 is waiting in all_reduce_mean(size=3, dtype=float64) as collective #1" in message
    assert "rank 0 returned from its worker without calling it" in message


def test_worker_exception_names_rank_and_shows_traceback():
    error, message = spawn_error(shm_workers.raises_on_rank_1)
    assert error.rank == 1
    assert message.startswith("rank 1 raised ValueError: boom from the worker")
    assert "Traceback of rank 1" in message and "in raises_on_rank_1" in message
    # Rank 0, blocked in all_reduce_mean, was released rather than waited for.
    assert "ranks also failed or were stopped: 0" in message


def test_worker_that_exits_is_reported_with_its_exit_code():
    error, message = spawn_error(shm_workers.exits_on_rank_1)
    assert error.rank == 1
    assert "rank 1 exited with code 3 without returning" in message


def test_killed_worker_is_reported_with_its_signal_and_peers_released():
    error, message = spawn_error(shm_workers.killed_on_rank_1)
    assert error.rank == 1
    assert "rank 1 was killed by SIGKILL" in message


class HandshakeClock:
    """spawn's clock, which jumps an hour ahead once ``flag`` exists: the timeout then fires at a
    known state (rank 0 waiting in the barrier), however slowly the ranks started."""

    def __init__(self, flag):
        self.flag = flag

    def monotonic(self):
        return time.monotonic() + (3600.0 if os.path.exists(self.flag) else 0.0)

    def __getattr__(self, name):
        return getattr(time, name)


def test_timeout_names_unfinished_ranks_and_gives_the_hint(tmp_path, monkeypatch):
    from everyo.distributed.sharedmem import spawn as spawn_module

    flag = str(tmp_path / "rank0-waits")
    monkeypatch.setattr(spawn_module, "time", HandshakeClock(flag))
    # (stall_timeout above the jump, so that the stall check, which wakes spawn every 0.25 s, does not fire first)
    error, message = spawn_error(shm_workers.hangs_on_rank_1, args=(flag,), timeout=60, stall_timeout=7200)
    assert "spawn timed out after 60 s; rank(s) 0, 1 had not finished" in message
    assert "rank 0: waiting in barrier() as collective #0" in message
    assert "rank 1: had not called any collective" in message
    assert "a rank that took a different path through the loop" in message


def test_a_rank_stuck_outside_the_collectives_is_named_without_any_timeout():
    # 0.1 waited forever here (timeout=None): rank 0 sat in the barrier, rank 1 slept 60 s.
    error, message = spawn_error(shm_workers.hangs_on_rank_1, timeout=None, stall_timeout=1.0)
    assert error.rank == 1
    assert "rank(s) 1 stuck outside the collectives: rank(s) 0 waited" in message
    assert "in barrier() as collective #0 (stall_timeout=1 s)" in message
    assert "rank 1: running, has not reached it (its last collective: none)" in message
    # Its Python stack, asked for by signal before spawn stopped it (the TCP launcher shows it too).
    stack = message.split("Python stack of rank 1 when spawn stopped it (most recent call first):\n")[1]
    assert "in hangs_on_rank_1" in stack and "shm_workers.py" in stack
    assert "--everyo-stack-end--" not in message


def test_long_work_on_every_rank_is_not_a_stall(tmp_path):
    # 4 s of work on every rank, longer than stall_timeout: nobody waits, so nothing trips. The ranks
    # meet outside the collectives first (a handshake), so a slow start-up is no wait in a collective.
    result = spawn(shm_workers.everyone_works_then_meets, 2, args=(4.0, str(tmp_path)), stall_timeout=3.0)
    assert result == [0, 1]


def test_the_stall_check_is_on_by_default_and_off_only_with_a_warning():
    import inspect

    from everyo.distributed.sharedmem import spawn as spawn_module

    assert spawn_module.DEFAULT_STALL_TIMEOUT == 600.0
    assert inspect.signature(spawn).parameters["stall_timeout"].default is spawn_module._NOT_GIVEN
    with pytest.warns(RuntimeWarning, match="stuck outside the collectives will make spawn wait forever"):
        assert spawn(shm_workers.everyone_works_then_meets, 2, args=(0.0,), stall_timeout=None) == [0, 1]
    with pytest.raises(ValueError, match="stall_timeout must be positive"):
        spawn(shm_workers.everyone_works_then_meets, 2, args=(0.0,), stall_timeout=0)


def test_unpicklable_result_is_a_clear_error():
    _, message = spawn_error(shm_workers.unpicklable_result)
    assert "returned a value that cannot be sent to the parent" in message


def test_unpicklable_worker_is_a_clear_error():
    with pytest.raises(EveryODistributedError, match="must be a module-level function"):
        spawn(lambda group: None, 2)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"world_size": 0}, "world_size must be a positive int"),
        ({"world_size": 2, "timeout": 0}, "timeout must be positive"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        spawn(shm_workers.thread_env, **kwargs)


SCRIPT = textwrap.dedent("""
    import warnings
    import numpy as np
    from everyo.distributed import spawn
    import shm_workers

    if __name__ == "__main__":
        warnings.simplefilter("ignore", RuntimeWarning)
        assert spawn(shm_workers.average_gradients_none, 2)[0][2] is None
        for worker in (shm_workers.raises_on_rank_1, shm_workers.killed_on_rank_1):
            try:
                spawn(worker, 2, timeout=60)
            except Exception as exc:
                print("raised", type(exc).__name__)
""")


def test_no_resource_tracker_warning_and_no_segment_after_the_interpreter_exits(tmp_path):
    # The resource tracker only complains when the parent interpreter exits, so
    # this runs spawn (a success and two failures) in a fresh interpreter.
    script = tmp_path / "run_spawn.py"
    script.write_text(SCRIPT)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(__file__)] + sys.path)
    proc = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    assert stdout.split("\n")[:2] == ["raised EveryODistributedError"] * 2
    assert "resource_tracker" not in stderr and "leaked" not in stderr, stderr
    leftovers = [n for n in os.listdir("/dev/shm") if n.startswith(f"everyo_{proc.pid}_")]
    assert leftovers == []


INTERRUPTED_SCRIPT = textwrap.dedent("""
    import sys
    from everyo.distributed import spawn
    import shm_workers

    if __name__ == "__main__":
        spawn(shm_workers.loops_forever, 2, args=(sys.argv[1],))
""")


def _default_signals():
    # An ignored signal is inherited through exec: under `nohup` (SIGHUP) or as a background job of
    # a script (SIGINT) the parent would ignore the very signal a test sends, and spawn rightly leaves
    # an ignored disposition alone. The tests are about a program that takes the default ones.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


def start_looping_parent(tmp_path):
    script = tmp_path / "loop.py"
    script.write_text(INTERRUPTED_SCRIPT)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(__file__)] + sys.path)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path)],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
        preexec_fn=_default_signals,  # noqa: PLW1509 - the child is single-threaded until exec
    )
    pid_files = [tmp_path / f"rank{r}.pid" for r in range(2)]
    deadline = time.monotonic() + 120  # a safety net only: the files appear once both ranks are in their loop
    while not all(p.exists() for p in pid_files):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
        time.sleep(0.05)
    return proc, [int(p.read_text()) for p in pid_files]


def wait_until_gone(pids, seconds=60):  # a safety net: they go as soon as the kernel has reaped them
    deadline = time.monotonic() + seconds
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        alive = [pid for pid in alive if _alive(pid)]
        time.sleep(0.05)
    return alive


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


def test_ctrl_c_in_the_parent_stops_workers_and_cleans_up(tmp_path):
    proc, workers = start_looping_parent(tmp_path)
    os.kill(proc.pid, signal.SIGINT)
    _, stderr = proc.communicate(timeout=30)
    assert "KeyboardInterrupt" in stderr
    assert wait_until_gone(workers) == []
    assert "resource_tracker" not in stderr, stderr
    assert [n for n in os.listdir("/dev/shm") if n.startswith(f"everyo_{proc.pid}_")] == []


def test_workers_die_with_a_killed_parent(tmp_path):
    proc, workers = start_looping_parent(tmp_path)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    assert wait_until_gone(workers) == []
    # The resource tracker (which outlives the parent) unlinks the segments once the workers are gone.
    deadline = time.monotonic() + 60  # a safety net: the tracker acts as soon as it sees the workers gone
    while [n for n in os.listdir("/dev/shm") if n.startswith(f"everyo_{proc.pid}_")]:
        assert time.monotonic() < deadline, "segments of a killed parent were not cleaned up"
        time.sleep(0.05)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_or_sighup_to_the_parent_cleans_up_without_warnings(tmp_path, sig):
    # 0.1: the parent died at once; the resource tracker then warned about (and unlinked) the segments.
    proc, workers = start_looping_parent(tmp_path)
    os.kill(proc.pid, sig)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 128 + sig, stderr
    assert wait_until_gone(workers) == []
    assert "resource_tracker" not in stderr and "leaked" not in stderr, stderr
    assert [n for n in os.listdir("/dev/shm") if n.startswith(f"everyo_{proc.pid}_")] == []


def test_a_retained_spawn_exception_holds_no_file_descriptors():
    import gc

    kept = []
    spawn_error(shm_workers.raises_on_rank_1)  # warm-up: the resource tracker's own pipe opens once
    gc.collect()
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(3):
        error, _ = spawn_error(shm_workers.raises_on_rank_1)
        kept.append(error)  # with its traceback, which references spawn's frame
    gc.collect()
    assert len(os.listdir("/proc/self/fd")) == before
    assert all(e.__traceback__ is not None for e in kept)


def test_concurrent_spawns_restore_the_parents_environment(monkeypatch):
    import threading

    for name in (
        "OMP_NUM_THREADS",
        "OPENBLAS_NUM_THREADS",
        "MKL_NUM_THREADS",
        "BLIS_NUM_THREADS",
        "VECLIB_MAXIMUM_THREADS",
    ):
        monkeypatch.delenv(name, raising=False)
    results = []
    threads = [threading.Thread(target=lambda: results.append(spawn(shm_workers.thread_env, 1))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(results) == 4
    assert "OMP_NUM_THREADS" not in os.environ and "OPENBLAS_NUM_THREADS" not in os.environ
