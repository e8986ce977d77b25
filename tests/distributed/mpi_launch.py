"""Run a script under a real ``mpiexec`` for the MPI tests (one launcher for all of them)."""

import os
import signal
import subprocess
import sys

import pytest


def run_mpiexec(world_size, argv, timeout):
    """``mpiexec -n world_size python *argv``; returns ``(returncode, output)``
    (stdout and stderr together). Skips when mpi4py is not installed. On
    timeout, mpiexec and every rank (its own session) are killed, so nothing
    is left behind, and ``subprocess.TimeoutExpired`` is raised."""
    pytest.importorskip("mpi4py", reason="mpi4py is not installed: pip install everyo-distributed[mpi]")
    from everyo.distributed_mpi import find_mpiexec

    mpiexec = find_mpiexec()
    assert mpiexec, "mpi4py is installed but no mpiexec was found on PATH or beside the Python executable"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    proc = subprocess.Popen(
        [mpiexec, "-n", str(world_size), sys.executable, *map(str, argv)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return proc.returncode, output
