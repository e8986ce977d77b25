"""Whichever rank fails first is the one named, with its own cause; the others' errors are consequences.

Rank 1 fails (fault_workers.FAULTS) in each place of a training loop
(fault_workers.PLACES), under ``spawn`` (shared memory) and under
``python -m everyo.distributed.run`` (TCP); an exception also under mpiexec.
Nothing here waits for a state by time: the hang is detected by the stall
check (shared memory) or the collective timeout (TCP), both of which name the
stuck rank whatever the machine's speed.
"""

import os
import subprocess
import sys
from pathlib import Path

import fault_workers
import pytest

from everyo.distributed import spawn
from everyo.errors import EveryODistributedError

HERE = Path(__file__).resolve().parent
CASES = [(f, p) for f in fault_workers.FAULTS for p in fault_workers.PLACES]


@pytest.mark.usefixtures("no_leftovers")
@pytest.mark.parametrize("fault, place", CASES)
def test_spawn_names_rank_1_with_its_own_cause(fault, place):
    with pytest.raises(EveryODistributedError) as info:
        # Only the hang needs the stall check soon; elsewhere a slow start-up must not look like one.
        spawn(fault_workers.train, 2, args=(fault, place), **({"stall_timeout": 1.0} if fault == "hang" else {}))
    error, message = info.value, str(info.value)
    assert error.rank == 1, message
    expected = {
        "raise": "rank 1 raised ValueError: boom on rank 1",
        "exit": "rank 1 exited with code 3 without returning",
        "signal": "rank 1 was killed by SIGKILL",
        "hang": "rank(s) 1 stuck outside the collectives",
    }[fault]
    assert message.startswith(expected) or message.startswith("spawn: " + expected), message
    if fault == "raise":
        assert "Traceback of rank 1" in message and "in fail" in message
    assert "rank 0 raised" not in message.split("\n\n(ranks also failed")[0]


def run_launcher(fault, place, *extra):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    command = [sys.executable, "-m", "everyo.distributed.run", "--nproc", "2", *extra, str(HERE / "fault_workers.py")]
    proc = subprocess.run(command + [fault, place], env=env, capture_output=True, text=True, timeout=120)
    return proc.returncode, proc.stderr


def root_cause(report):
    assert "Root Cause (first observed failure):" in report, report[-3000:]
    return report.split("Root Cause (first observed failure):")[1]


@pytest.mark.parametrize("fault, place", CASES)
def test_tcp_launcher_names_rank_1_with_its_own_cause(fault, place):
    code, report = run_launcher(fault, place)
    cause = root_cause(report)
    assert "rank      : 1 (local_rank: 1)" in cause, report[-3000:]
    if fault == "raise":
        assert code == 1 and "error     : ValueError: boom on rank 1" in cause and "in fail" in cause
    elif fault == "exit":
        assert code == 3 and "exitcode  : 3" in cause and "exited with code 3" in cause
    elif fault == "signal":
        assert "exitcode  : -9" in cause and "killed by SIGKILL" in cause
    else:
        assert "rank 1 stuck: rank 0 gave up waiting for it" in cause and "timed out" in cause
    # Rank 0's error, if it had one, is listed as a consequence, never as the cause.
    failures = report.split("Root Cause")[0]
    if "rank      : 0" in failures:
        assert "a consequence of rank 1's failure" in failures


def test_mpi_names_the_raising_rank_in_every_place():
    from mpi_launch import run_mpiexec

    for place in fault_workers.PLACES:
        returncode, output = run_mpiexec(2, [HERE / "fault_workers.py", "raise", place, "--mpi"], timeout=60)
        assert returncode != 0
        assert "ValueError: boom on rank 1" in output and "uncaught ValueError on rank 1" in output, output[-3000:]
        assert "on rank 0" not in output


def test_the_launcher_reads_torchruns_variables(monkeypatch):
    from everyo.distributed import run

    monkeypatch.setenv("PET_NPROC_PER_NODE", "3")
    monkeypatch.setenv("PET_MAX_RESTARTS", "2")
    args = run._parser().parse_args(["train.py", "--lr", "0.1"])
    assert (int(args.nproc), int(args.max_restarts), args.script, args.script_args) == (
        3,
        2,
        "train.py",
        ["--lr", "0.1"],
    )
    args = run._parser().parse_args(["--nproc_per_node", "4", "--max_restarts", "1", "--standalone", "train.py"])
    assert (args.nproc, args.max_restarts, args.standalone) == (4, 1, True)
