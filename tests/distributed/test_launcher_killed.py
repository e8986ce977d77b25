"""A SIGKILLed launcher leaves no worker and no /dev/shm segment behind (everyo.distributed.reaper).

The workers signal with files that they hold their snapshots and wait; then the
launcher (the spawn parent, or ``python -m everyo.distributed.run``) is killed.
The test waits for every process the launcher had started -- the workers, the
spares, the reaper -- to be gone (events, not a chosen duration), then looks
in /dev/shm for any segment carrying the launcher's pid.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
SAFETY_NET = 300  # seconds; only a broken run ever gets there


def descendants(pid):
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rpartition(")")[2].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def wait_until(condition, what):
    deadline = time.monotonic() + SAFETY_NET
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.01)


def segments_of(pid):
    return [name for name in os.listdir("/dev/shm") if name.startswith(f"everyo_{pid}_")]


@pytest.mark.skipif(not os.path.isdir("/dev/shm") or not sys.platform.startswith("linux"), reason="Linux only")
@pytest.mark.parametrize("launcher", ["spawn", "tcp"])
def test_a_sigkilled_launcher_leaves_no_worker_and_no_segment(launcher, tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    script = [str(HERE / "orphan_workers.py"), launcher, str(tmp_path)]
    if launcher == "spawn":
        command = [sys.executable, *script]
    else:
        command = [sys.executable, "-m", "everyo.distributed.run", "--nproc", "2", "--max-restarts", "1"]
        command += ["--snapshot-every", "1", *script]
    proc = subprocess.Popen(command, env=env, stderr=subprocess.PIPE)
    try:
        wait_until(
            lambda: all((tmp_path / f"rank{r}").exists() for r in range(2)) or proc.poll() is not None,
            "both workers hold their snapshots",
        )
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
        assert segments_of(proc.pid), "the workers' snapshots should be in /dev/shm before the launcher dies"
        started = descendants(proc.pid)
        assert len(started) >= 3  # two workers and the reaper (and the next attempt's spares)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stderr.close()
    wait_until(lambda: not any(alive(pid) for pid in started), "every worker and the reaper are gone")
    assert segments_of(proc.pid) == []
