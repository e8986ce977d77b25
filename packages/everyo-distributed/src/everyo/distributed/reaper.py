"""Cleanup that does not depend on the launcher surviving.

``spawn`` and ``python -m everyo.distributed.run`` remove their shared-memory
segments (and the TCP launcher its error-file directory) when they end. If the
launcher itself is killed with ``SIGKILL``, nothing of it runs any more: its
workers die with it (each asked the kernel for ``PR_SET_PDEATHSIG``), and this
module's reaper -- a tiny separate interpreter, in a session of its own, that
imports nothing but the standard library -- does the rest. The launcher tells
it, one line at a time over a pipe, which names it owns (``prefix`` of the
``/dev/shm`` segments, worker ``pid``, ``dir``). When the pipe closes -- at the
launcher's orderly end or at its death -- the reaper waits for those workers
to be gone, unlinks every ``/dev/shm`` entry under the prefixes, removes the
directories and exits. On an orderly end all of that is already done, and it
finds nothing. Linux only (``/dev/shm``); elsewhere no reaper is started.
"""

from __future__ import annotations

import os
import subprocess
import sys

__all__ = ["Reaper"]

_SHM_DIR = "/dev/shm"
_PID_WAIT_SECONDS = 30.0  # a worker in uninterruptible sleep may take a while to go; bounded anyway

# Runs as ``python -I -S -c _PROGRAM``: the standard library only, no EveryO, no NumPy.
_PROGRAM = r"""
import os, shutil, signal, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
prefixes, pids, dirs = [], [], []
for line in sys.stdin:
    kind, _, value = line.rstrip("\n").partition(" ")
    if kind == "prefix" and value:
        prefixes.append(value)
    elif kind == "pid":
        pids.append(int(value))
    elif kind == "dir" and value:
        dirs.append(value)

def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False

deadline = time.monotonic() + float(sys.argv[2])
while any(alive(p) for p in pids) and time.monotonic() < deadline:
    time.sleep(0.01)
try:
    names = os.listdir(sys.argv[1])
except OSError:
    names = []
for name in names:
    if any(name.startswith(p) for p in prefixes):
        try:
            os.unlink(os.path.join(sys.argv[1], name))
        except OSError:
            pass
for d in dirs:
    shutil.rmtree(d, ignore_errors=True)
"""


class Reaper:
    """The launcher's handle on its reaper: ``own_prefix``, ``own_pid``, ``own_dir``, then ``close``.

    Every method is a no-op where there is no ``/dev/shm`` or the reaper could not start.
    """

    def __init__(self, start: bool = True) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        if not start or not os.path.isdir(_SHM_DIR):
            return
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _PROGRAM, _SHM_DIR, str(_PID_WAIT_SECONDS)],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                # Nor the launcher's stderr: a caller reading it to EOF must not wait on the reaper.
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # a Ctrl-C to the launcher's process group does not stop it
            )
        except OSError:
            self._proc = None

    @classmethod
    def none(cls) -> Reaper:
        """A handle that starts no reaper (every method a no-op)."""
        return cls(start=False)

    def _tell(self, kind: str, value: object) -> None:
        if self._proc is None or self._proc.stdin is None:
            return
        try:
            self._proc.stdin.write(f"{kind} {value}\n".encode())
            self._proc.stdin.flush()
        except (OSError, ValueError):
            pass

    def own_prefix(self, name: str) -> None:
        """Unlink every ``/dev/shm`` segment whose name starts with ``name`` (leading slash optional)."""
        self._tell("prefix", name.lstrip("/"))

    def own_pid(self, pid: int | None) -> None:
        """Wait for this worker to be gone before unlinking (it may still be creating a segment)."""
        if pid is not None:
            self._tell("pid", pid)

    def own_dir(self, path: str) -> None:
        """Remove this directory tree too."""
        self._tell("dir", path)

    def close(self) -> None:
        """The launcher's orderly end (after its own cleanup): let the reaper check and exit."""
        if self._proc is None:
            return
        proc, self._proc = self._proc, None
        if proc.stdin is not None:
            try:
                proc.stdin.close()
            except OSError:
                pass
        proc.wait()
