"""Elastic restart: a worker SIGKILLed at a random step, the job resumed from the in-memory snapshot,
and the result bit-identical to an uninterrupted run (final weights, and every loss after the restart).

The reference is the same training without restarts or snapshots (shared memory; the TCP group
gives the same bits). Both launchers are checked: ``spawn(max_restarts=, snapshot_every=)`` and
``python -m everyo.distributed.run --max-restarts --snapshot-every``; nothing may be left in
/dev/shm or running afterwards.
"""

import os
import subprocess
import sys
from pathlib import Path

import elastic_workers
import numpy as np
import pytest

from everyo.distributed import spawn
from everyo.errors import EveryODistributedError

HERE = Path(__file__).resolve().parent
STEPS, EVERY = 14, 4
CASES = [("mlp", 2), ("mlp", 3), ("cnn", 2), ("cnn", 3)]


def kill_step(kind, world):
    """A random step after the first snapshot (seeded per case, so a failure can be replayed)."""
    rng = np.random.default_rng([len(kind), world, 27])
    return int(rng.integers(EVERY + 1, STEPS))


@pytest.fixture(scope="module")
def references():
    return {case: spawn(elastic_workers.train, case[1], args=(case[0], STEPS, -1), timeout=300) for case in CASES}


def assert_identical(got, reference, world):
    assert len(got) == world
    for rank, (g, r) in enumerate(zip(got, reference)):
        assert int(g["restarts"]) == 1, "the job was not restarted"
        resumed = int(g["resumed"])
        assert resumed > 0 and resumed % EVERY == 0, resumed  # resumed from a snapshot, not from scratch
        for a, b in zip(g["params"], r["params"]):
            assert a.tobytes() == b.tobytes(), f"rank {rank}: final weights differ"
        assert g["losses"][resumed:].tobytes() == r["losses"][resumed:].tobytes(), f"rank {rank}: losses differ"
        assert np.isnan(g["losses"][:resumed]).all()  # the steps before the snapshot were not run again


@pytest.mark.usefixtures("no_leftovers")
@pytest.mark.parametrize("kind, world", CASES)
def test_spawn_resumes_bit_identical_after_a_sigkill(references, kind, world):
    got = spawn(
        elastic_workers.train,
        world,
        args=(kind, STEPS, kill_step(kind, world)),
        timeout=300,
        max_restarts=1,
        snapshot_every=EVERY,
    )
    assert_identical(got, references[kind, world], world)


def processes_mentioning(marker):
    found = []
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    found.append(pid)
        except OSError:
            continue
    return found


def launch(world, argv, *options):
    """Run the launcher; returns (exit code, stderr), after checking it left no snapshot segment behind."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    command = [sys.executable, "-m", "everyo.distributed.run", "--nproc", str(world), *options]
    command += [str(HERE / "elastic_workers.py"), *argv]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, stderr = proc.communicate(timeout=300)
    # The launcher's snapshot segments carry its pid (other test runs may have theirs meanwhile).
    assert [n for n in os.listdir("/dev/shm") if n.startswith(f"everyo_{proc.pid}_")] == []
    return proc.returncode, stderr


@pytest.mark.parametrize("kind, world", CASES)
def test_tcp_launcher_resumes_bit_identical_after_a_sigkill(references, kind, world, tmp_path):
    argv = [kind, str(STEPS), str(kill_step(kind, world)), str(tmp_path)]
    code, stderr = launch(world, argv, "--max-restarts", "1", "--snapshot-every", str(EVERY))
    assert code == 0, stderr[-4000:]
    assert f"rank {world - 1} failed (killed by SIGKILL" in stderr
    got = []
    for rank in range(world):
        with np.load(tmp_path / f"rank{rank}.npz") as data:
            params = [data[f"p{i}"] for i in range(sum(k.startswith("p") for k in data.files))]
            got.append({"params": params, **{k: data[k] for k in ("losses", "resumed", "restarts")}})
    assert_identical(got, references[kind, world], world)
    assert processes_mentioning(str(tmp_path)) == []


@pytest.mark.usefixtures("no_leftovers")
def test_a_worker_that_keeps_dying_exhausts_the_restarts_and_every_failure_is_listed():
    with pytest.raises(EveryODistributedError) as info:
        spawn(elastic_workers.always_dies, 2, timeout=120, max_restarts=2, snapshot_every=1)
    message = str(info.value)
    assert "failed 3 times, and max_restarts=2 restarts are used up" in message
    for attempt in range(3):
        assert f"[attempt {attempt}] rank 1 exited with code 3" in message
    assert info.value.rank == 1 and len(info.value.failures) == 3


def test_the_tcp_launcher_lists_every_failure_when_the_restarts_are_used_up():
    code, stderr = launch(2, ["always_dies"], "--max-restarts", "2", "--snapshot-every", "1")
    assert code == 3, stderr[-3000:]
    report = stderr.split("Failures:")[1]
    assert report.count("exitcode  : 3") == 3  # every attempt's failure, the root cause last
    assert "restart   : 1" in report and "restart   : 2" in report
    assert "Root Cause" in report and "rank      : 1" in report.split("Root Cause")[1]


@pytest.mark.usefixtures("no_leftovers")
def test_spawn_resumes_bit_identical_with_a_grad_scaler():
    # The MLP under autocast, its GradScaler growing every 3 steps: the snapshot carries the scale.
    pytest.importorskip("everyo.amp")
    args = ("mlp_amp", STEPS, 10)
    reference = spawn(elastic_workers.train, 2, args=(*args[:2], -1), timeout=300)
    got = spawn(elastic_workers.train, 2, args=args, timeout=300, max_restarts=1, snapshot_every=EVERY)
    assert_identical(got, reference, 2)
