"""``python -m everyo.distributed.run``: start a TCP data-parallel job on this machine, torchrun-style.

Example (a command line, so not run as a doctest)::

    python -m everyo.distributed.run --nproc 2 --max-restarts 3 train.py --epochs 5

starts ``train.py`` in ``--nproc`` processes with torchrun's environment
(``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``,
``MASTER_ADDR``, ``MASTER_PORT``, ``TORCHELASTIC_RESTART_COUNT``,
``TORCHELASTIC_MAX_RESTARTS``, ``TORCHELASTIC_RUN_ID``,
``TORCHELASTIC_ERROR_FILE``), so ``init_tcp_process_group()`` with no
arguments forms the group. Options left out are read from torchrun's own
variables (``PET_NPROC_PER_NODE``, ``PET_MAX_RESTARTS``, ``PET_MASTER_ADDR``,
``PET_MASTER_PORT``); torchrun's spellings (``--nproc-per-node``,
``--nproc_per_node``, ``--max_restarts``, ``--standalone``) are accepted.

When a worker fails (an exception, an exit code, a signal), the others are
stopped, and the job is started again while restarts remain
(``--max-restarts``, default 0). The launcher exits with the failing
worker's code and prints a torchrun-style summary whose root cause is the
first worker that failed on its own -- its exception, message and traceback
(read from its error file, so they are there even when its stderr went
elsewhere), or its exit code or signal -- with the other ranks' errors listed
as consequences. A rank that the others timed out waiting for (stuck) is the
root cause too.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from everyo.distributed.reaper import Reaper

__all__ = ["main", "Failure"]

_GRACE_SECONDS = 2.0  # after a failure: how long the other workers get to stop on their own
_KILL_SECONDS = 3.0  # after SIGTERM: how long before SIGKILL
_STACK_SECONDS = 1.0  # how long a stuck worker gets to write its stack


@dataclass
class Failure:
    """One worker's failure, as the summary reports it."""

    rank: int
    exitcode: int
    pid: int
    time: float
    message: str = ""
    traceback: str = ""
    consequence: bool = False
    failed_rank: int = -1
    attempt: int = 0
    stack_of_blamed: str = ""  # the stack of the rank this one waited for, if that rank was stuck
    pid_of_blamed: int = -1
    notes: list[str] = field(default_factory=list)

    def describe(self, indent: str = "  ") -> str:
        when = time.strftime("%Y-%m-%d_%H:%M:%S", time.localtime(self.time))
        lines = [
            f"{indent}time      : {when}",
            f"{indent}rank      : {self.rank} (local_rank: {self.rank})",
            f"{indent}exitcode  : {self.exitcode} (pid: {self.pid})",
        ]
        if self.attempt:
            lines.append(f"{indent}restart   : {self.attempt}")
        if self.message:
            lines.append(f"{indent}error     : {self.message}")
        else:
            lines.append(f"{indent}error     : {_exit_text(self.exitcode)}")
        lines += [f"{indent}note      : {n}" for n in self.notes]
        if self.traceback:
            lines.append(f"{indent}traceback :")
            lines += [f"{indent}  {line}" for line in self.traceback.rstrip().splitlines()]
        return "\n".join(lines)


def _exit_text(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        text = f"killed by {name}"
        return text + (" (the kernel's out-of-memory killer sends this too)" if -code == signal.SIGKILL else "")
    return f"exited with code {code} without raising"


def _env_default(name: str, fallback: str | None) -> str | None:
    return os.environ.get(name) or fallback


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m everyo.distributed.run", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--nproc", "--nproc-per-node", "--nproc_per_node", dest="nproc", type=int,
        default=_env_default("PET_NPROC_PER_NODE", "1"), help="workers to start (default 1)",
    )  # fmt: skip
    p.add_argument(
        "--max-restarts", "--max_restarts", dest="max_restarts", type=int,
        default=_env_default("PET_MAX_RESTARTS", "0"), help="restarts after a failure (default 0)",
    )  # fmt: skip
    p.add_argument(
        "--snapshot-every", "--snapshot_every", dest="snapshot_every", type=int, default=0,
        help="elastic: keep an in-memory snapshot every K steps to resume from (0: restart from scratch)",
    )  # fmt: skip
    p.add_argument("--master-addr", "--master_addr", dest="master_addr", default=_env_default("PET_MASTER_ADDR", None))
    p.add_argument("--master-port", "--master_port", dest="master_port", type=int, default=None)
    p.add_argument("--standalone", action="store_true", help="accepted for torchrun compatibility (always standalone)")
    p.add_argument("script")
    p.add_argument("script_args", nargs=argparse.REMAINDER)
    return p


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _read_error(path: str) -> dict[str, Any] | None:
    try:
        with open(path) as f:
            data = json.load(f)
        return data if isinstance(data, dict) else None
    except (OSError, ValueError):
        return None


def _read_text(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _failure(rank: int, proc: subprocess.Popen[bytes], error_file: str, attempt: int) -> Failure:
    code = proc.returncode if proc.returncode is not None else 0
    fail = Failure(rank, code, proc.pid, time.time(), attempt=attempt)
    record = _read_error(error_file)
    if record is not None:
        message = record.get("message", {})
        fail.message = str(message.get("message", ""))
        fail.traceback = str(message.get("extraInfo", {}).get("py_callstack", ""))
        extra = record.get("everyo", {})
        fail.time = float(extra.get("time", fail.time))
        fail.consequence = bool(extra.get("consequence", False))
        fail.failed_rank = int(extra.get("failed_rank", -1))
    return fail


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + _KILL_SECONDS
    for p in procs:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def start_spares(nproc: int, reaper: Reaper | None = None) -> list[subprocess.Popen[bytes]]:
    """Workers for the next restart, started ahead: each imports NumPy and everyo, then waits on its
    stdin for its environment and command line (``_worker --standby``), so a restart costs no
    interpreter start-up."""
    command = [sys.executable, "-m", "everyo.distributed._worker", "--standby"]
    spares = [
        subprocess.Popen(command, stdin=subprocess.PIPE, preexec_fn=_die_with_parent)  # noqa: PLW1509
        for _ in range(nproc)
    ]
    for proc in spares:
        (reaper or Reaper.none()).own_pid(proc.pid)
    return spares


def stop_spares(spares: list[subprocess.Popen[bytes]]) -> None:
    for proc in spares:
        try:
            assert proc.stdin is not None
            proc.stdin.close()  # end of input: a spare that has nothing to run exits
        except OSError:
            pass
    _stop(spares)


def run_attempt(
    args: argparse.Namespace,
    attempt: int,
    run_id: str,
    workdir: str,
    spares: list[subprocess.Popen[bytes]] | None = None,
    next_spares: list[list[subprocess.Popen[bytes]]] | None = None,
) -> list[Failure]:
    """Start the workers once (``spares``, if given, become them) and supervise them; the failures
    (empty: every worker exited with 0). With ``next_spares``, the next restart's spares are started
    once these workers are, and appended to it."""
    host = args.master_addr or "127.0.0.1"
    port = args.master_port or _free_port(host)
    procs: list[subprocess.Popen[bytes]] = []
    files: list[str] = []
    for rank in range(args.nproc):
        error_file = os.path.join(workdir, f"attempt{attempt}_rank{rank}.json")
        files.append(error_file)
        env = {
            **os.environ,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "GROUP_RANK": "0",
            "WORLD_SIZE": str(args.nproc),
            "LOCAL_WORLD_SIZE": str(args.nproc),
            "MASTER_ADDR": host,
            "MASTER_PORT": str(port),
            "TORCHELASTIC_RESTART_COUNT": str(attempt),
            "TORCHELASTIC_MAX_RESTARTS": str(args.max_restarts),
            "TORCHELASTIC_RUN_ID": run_id,
            "TORCHELASTIC_ERROR_FILE": error_file,
            "EVERYO_SNAPSHOT_EVERY": str(args.snapshot_every),
            "EVERYO_ELASTIC_BASE": args.snapshot_base,
        }
        argv = [args.script, *args.script_args]
        if spares:
            proc = spares[rank]
            try:
                assert proc.stdin is not None
                proc.stdin.write(json.dumps({"env": env, "argv": argv}).encode() + b"\n")
                proc.stdin.close()
            except OSError:
                pass  # it died while waiting: supervised like any other rank
            procs.append(proc)
        else:
            command = [sys.executable, "-m", "everyo.distributed._worker", *argv]
            procs.append(subprocess.Popen(command, env=env, preexec_fn=_die_with_parent))  # noqa: PLW1509
            args.reaper.own_pid(procs[-1].pid)
    if next_spares is not None:
        next_spares.append(start_spares(args.nproc, args.reaper))
    failures: list[Failure] = []
    try:
        _supervise(procs, files, attempt, failures)
    finally:
        _stop(procs)
    return failures


def _supervise(procs: list[subprocess.Popen[bytes]], files: list[str], attempt: int, failures: list[Failure]) -> None:
    pidfds = {os.pidfd_open(p.pid): r for r, p in enumerate(procs)} if hasattr(os, "pidfd_open") else {}
    from multiprocessing import connection

    try:
        pending = set(range(len(procs)))
        grace_deadline = None
        while pending:
            if grace_deadline is not None and time.monotonic() >= grace_deadline:
                break
            timeout = None if grace_deadline is None else max(0.0, grace_deadline - time.monotonic())
            if pidfds:
                connection.wait([fd for fd, r in pidfds.items() if r in pending], timeout)
            else:  # pragma: no cover - Linux < 5.3
                time.sleep(0.01)
            for rank in sorted(pending):
                proc = procs[rank]
                if proc.poll() is None:
                    continue
                pending.discard(rank)
                if proc.returncode != 0:
                    failures.append(_failure(rank, proc, files[rank], attempt))
                    if grace_deadline is None:
                        grace_deadline = time.monotonic() + _GRACE_SECONDS
                    first = failures[0]
                    if first.consequence and first.failed_rank in pending:
                        grace_deadline = time.monotonic()  # the peer it waited for is stuck: stop it now
                        stuck = first.failed_rank
                        _dump_stack(procs[stuck], files[stuck] + ".stack")
                        first.stack_of_blamed = _read_text(files[stuck] + ".stack")
                        first.pid_of_blamed = procs[stuck].pid
    finally:
        for fd in pidfds:
            os.close(fd)


def _dump_stack(proc: subprocess.Popen[bytes], path: str) -> None:
    """Ask a stuck worker for its Python stack (its faulthandler writes it to ``path`` on SIGUSR1).

    Diagnostics only: the launcher waits at most ``_STACK_SECONDS`` for it before stopping the worker.
    """
    try:
        proc.send_signal(signal.SIGUSR1)
    except OSError:
        return
    deadline = time.monotonic() + _STACK_SECONDS
    while time.monotonic() < deadline:
        try:
            with open(path) as f:
                if "File " in f.read():
                    return
        except OSError:
            return
        time.sleep(0.02)


def root_cause(failures: list[Failure], nproc: int) -> Failure | None:
    """The first failure that is not a consequence; else, the rank the consequences name (stuck)."""
    own = sorted((f for f in failures if not f.consequence), key=lambda f: f.time)
    if own:
        return own[0]
    blamed = [f for f in sorted(failures, key=lambda f: f.time) if 0 <= f.failed_rank < nproc]
    if blamed:
        first = blamed[0]
        stuck = Failure(first.failed_rank, -int(signal.SIGTERM), first.pid_of_blamed, first.time, attempt=first.attempt)
        stuck.message = (
            f"rank {first.failed_rank} stuck: rank {first.rank} gave up waiting for it ({first.message}); "
            "the launcher stopped it"
        )
        stuck.traceback = first.stack_of_blamed
        return stuck
    return failures[0] if failures else None


def summary(script: str, failures: list[Failure], cause: Failure | None) -> str:
    """torchrun's end-of-job report: every failure but the root cause (consequences marked), then the root cause."""
    rule = "=" * 60
    lines = [rule, f"{script} FAILED", "-" * 60, "Failures:"]
    others = [f for f in failures if f is not cause]
    if not others:
        lines.append("  <NO_OTHER_FAILURES>")
    for i, f in enumerate(others, 1):
        if f.consequence:
            f.notes.append(
                f"a consequence of rank {f.failed_rank}'s failure" if f.failed_rank >= 0 else "a consequence"
            )
        lines += [f"[{i}]:", f.describe()]
    lines += ["-" * 60, "Root Cause (first observed failure):", "[0]:"]
    if cause is not None:
        lines.append(cause.describe())
    lines.append(rule)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the job (restarting it up to ``--max-restarts`` times); return the launcher's exit code."""
    args = _parser().parse_args(argv)
    args.nproc, args.max_restarts = int(args.nproc), int(args.max_restarts)
    if args.master_port is None and os.environ.get("PET_MASTER_PORT"):
        args.master_port = int(os.environ["PET_MASTER_PORT"])
    if args.nproc < 1 or args.max_restarts < 0 or args.snapshot_every < 0:
        _parser().error("--nproc must be >= 1, --max-restarts and --snapshot-every >= 0")
    run_id = uuid.uuid4().hex[:12]
    # Elastic snapshots (everyo.distributed.elastic) live in shared memory on this machine; removed at the end.
    args.snapshot_base = f"/everyo_{os.getpid()}_{run_id}_snap"
    # If this launcher is SIGKILLed, its workers die with it (PR_SET_PDEATHSIG) and the reaper removes the rest.
    args.reaper = Reaper()
    args.reaper.own_prefix(args.snapshot_base)
    history: list[Failure] = []
    try:
        return _run_all(args, run_id, history)
    finally:
        from everyo.distributed.elastic import remove_snapshots

        remove_snapshots(args.snapshot_base, args.nproc)
        args.reaper.close()


def _run_all(args: argparse.Namespace, run_id: str, history: list[Failure]) -> int:
    failures: list[Failure] = []
    with tempfile.TemporaryDirectory(prefix="everyo-run-") as workdir:
        args.reaper.own_dir(workdir)
        spares: list[subprocess.Popen[bytes]] | None = None
        try:
            for attempt in range(args.max_restarts + 1):
                started: list[list[subprocess.Popen[bytes]]] = []
                try:
                    nxt = started if attempt < args.max_restarts else None
                    failures = run_attempt(args, attempt, run_id, workdir, spares, nxt)
                finally:
                    spares = started[0] if started else None
                if not failures:
                    return 0
                history.extend(failures)
                cause = root_cause(failures, args.nproc)
                if attempt < args.max_restarts:
                    print(
                        f"everyo.distributed.run: rank {cause.rank if cause else '?'} failed "
                        f"({cause.message or _exit_text(cause.exitcode) if cause else ''}); "
                        f"restarting all {args.nproc} workers ({attempt + 1}/{args.max_restarts})",
                        file=sys.stderr,
                    )
        finally:
            if spares is not None:
                stop_spares(spares)
    final = root_cause(failures, args.nproc)  # the last attempt's; every attempt's failures are listed
    print(summary(args.script, history, final), file=sys.stderr)
    code = final.exitcode if final is not None else 1
    return code if 0 < code < 256 else 1


if __name__ == "__main__":
    sys.exit(main())
