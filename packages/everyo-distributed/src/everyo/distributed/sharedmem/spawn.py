"""``spawn``: run ``worker(group, *args)`` in ``world_size`` processes, loudly.

The parent owns every resource (the processes, the control segment, the data
segments) and releases all of them in one ``finally``, whatever happened. It
waits on the workers' result pipes and process sentinels together, so a worker
that raised, one that died without a word (a signal, ``os._exit``) and a
timeout are all noticed at once; it then sets the control block's abort word,
which releases every rank blocked in a collective, and stops whatever is left.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import multiprocessing
import os
import signal
import threading
import time
import traceback
import warnings
from multiprocessing import connection
from typing import TYPE_CHECKING, Any, Final

from everyo.distributed.protocol import HINT, is_consequence
from everyo.distributed.reaper import Reaper
from everyo.distributed.sharedmem.control import ControlBlock
from everyo.distributed.sharedmem.group import SharedMemoryGroup, data_segment_name
from everyo.distributed.sharedmem.segment import new_segment_name, unlink_segment
from everyo.distributed.threads import worker_thread_env
from everyo.errors import EveryODistributedError

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from typing import Concatenate, TypeVar

    from everyo.distributed.protocol import ProcessGroup

    _R = TypeVar("_R")

__all__ = ["spawn"]

DEFAULT_STALL_TIMEOUT = 600.0  # as long as PyTorch's NCCL watchdog waits by default
_STALL_CHECK_SECONDS = 0.25  # how often the parent looks at the barrier counters
_GRACE_SECONDS = 1.0  # after a failure: how long the other ranks get to stop on their own
_EXIT_SECONDS = 10.0  # after success: how long the ranks get to exit before being terminated
_STACK_SIGNAL = signal.SIGUSR1  # asks a stuck rank for its Python stacks (as the TCP launcher does)
_STACK_END = b"\n--everyo-stack-end--\n"
_STACK_SECONDS = 5.0  # at most this long for a stuck rank's stacks before it is stopped anyway
_TIMEOUT_HINT = "If spawn times out: " + HINT[0].lower() + HINT[1:]


class _NotGiven(enum.Enum):
    NOT_GIVEN = "not given"


_NOT_GIVEN: Final = _NotGiven.NOT_GIVEN


def spawn(
    worker: Callable[Concatenate[ProcessGroup, ...], _R],
    world_size: int,
    args: Iterable[Any] = (),
    timeout: float | None = None,
    *,
    stall_timeout: float | None | _NotGiven = _NOT_GIVEN,
    max_restarts: int = 0,
    snapshot_every: int = 0,
) -> list[_R]:
    """Run ``worker(group, *args)`` in ``world_size`` new processes; return their results by rank.

    Processes use the ``spawn`` start method, so ``worker`` must be a
    module-level function, ``args`` and the results must pickle, and a script
    calling ``spawn`` must do so under ``if __name__ == "__main__":``. Each
    worker's first argument is a :class:`~everyo.distributed.ProcessGroup`
    backed by shared memory.

    ``timeout`` (seconds, default ``None``: no limit) bounds the whole run.
    ``stall_timeout`` (default 600 s, as PyTorch's NCCL watchdog) bounds how
    long ranks may wait in a collective that another rank has not reached
    while that rank's state does not change: the rank stuck outside the
    collectives (an endless loop, a blocking read, a deadlock) is named, and
    long trainings are unaffected, since it is measured from the last
    collective every rank completed. ``stall_timeout=None`` turns it off (a
    ``RuntimeWarning`` says that a stuck rank will then hang ``spawn``).

    Unless the user set a BLAS thread variable (``OMP_NUM_THREADS`` ...), each
    worker gets ``max(1, cores // world_size)`` BLAS threads through its
    environment; a ``RuntimeWarning`` says when the cores are still
    oversubscribed.

    Elastic restart (:mod:`everyo.distributed.elastic`): with
    ``max_restarts=N``, when a worker fails the others are stopped at their
    next collective and all ``world_size`` workers are started again, up to
    ``N`` times; with ``snapshot_every=K`` the workers'
    ``DistributedDataParallel`` keeps an in-memory snapshot every ``K`` steps,
    from which ``elastic.state(...)`` resumes them (``timeout`` applies to
    each attempt).

    Raises:
        EveryODistributedError: a worker raised (the message names the rank and
            shows its traceback), died (rank and exit code or signal), or
            ``timeout`` seconds passed (which ranks had not finished, and where
            they were) -- with restarts, once they are used up, listing every
            attempt's failure. The other workers are stopped, and no process or
            shared-memory segment is left behind.
    """
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ValueError(f"spawn: world_size must be a positive int, got {world_size!r}")
    if not callable(worker):
        raise TypeError(f"spawn: worker must be callable, got {worker!r}")
    if timeout is not None and not timeout > 0:
        raise ValueError(f"spawn: timeout must be positive seconds or None, got {timeout!r}")
    if stall_timeout is _NOT_GIVEN:
        stall_timeout = DEFAULT_STALL_TIMEOUT
    elif stall_timeout is None:
        warnings.warn(
            "spawn(stall_timeout=None): a rank stuck outside the collectives will make spawn wait "
            "forever (unless timeout= is set)",
            RuntimeWarning,
            stacklevel=2,
        )
    elif not stall_timeout > 0:
        raise ValueError(f"spawn: stall_timeout must be positive seconds or None, got {stall_timeout!r}")
    for name, value in (("max_restarts", max_restarts), ("snapshot_every", snapshot_every)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"spawn: {name} must be an int >= 0, got {value!r}")
    args = tuple(args)
    updates, warning = worker_thread_env(world_size)
    if warning:
        warnings.warn(warning, RuntimeWarning, stacklevel=2)
    reaper = Reaper()  # cleans up even if this process is SIGKILLed (its workers die with it)
    try:
        return _spawn_job(
            worker, world_size, args, timeout, stall_timeout, max_restarts, snapshot_every, updates, reaper
        )
    finally:
        reaper.close()


def _spawn_job(worker, world_size, args, timeout, stall_timeout, max_restarts, snapshot_every, updates, reaper):
    if not max_restarts and not snapshot_every:
        return _spawn_once(worker, world_size, args, timeout, stall_timeout, updates, reaper=reaper)
    from everyo.distributed import elastic

    base = new_segment_name("everyo").lstrip("/") + "_snap"
    reaper.own_prefix(base)

    def env(attempt: int) -> dict[str, str]:
        return {
            **updates,
            elastic.BASE_ENV: "/" + base,
            elastic.EVERY_ENV: str(snapshot_every),
            elastic.RESTART_ENV: str(attempt),
        }

    failures: list[EveryODistributedError] = []
    spares: _Spares | None = None
    try:
        for attempt in range(max_restarts + 1):
            current, spares = spares, None
            # The next attempt's workers start once this attempt's have, and wait, imported, for their
            # rank: a restart then costs no interpreter start-up (most of a restart's time under load).
            start_spares = None
            if attempt < max_restarts:
                start_spares = functools.partial(_Spares, worker, args, world_size, env(attempt + 1), reaper)
            started: list[_Spares] = []
            try:
                return _spawn_once(
                    worker,
                    world_size,
                    args,
                    timeout,
                    stall_timeout,
                    env(attempt),
                    current,
                    start_spares,
                    started,
                    reaper,
                )
            except EveryODistributedError as exc:
                failures.append(exc)
            finally:
                spares = started[0] if started else None
        raise _exhausted(failures, max_restarts)
    finally:
        if spares is not None:
            spares.close()
        elastic.remove_snapshots("/" + base, world_size)


class _Spares:
    """``world_size`` processes started ahead of a restart: the interpreter is up and the worker
    unpickled (its module imported); each waits on a pipe for its rank and group (``_standby_main``)."""

    def __init__(self, worker, args, world_size, env, reaper):
        context = multiprocessing.get_context("spawn")
        self.processes, self.pipes, self.gos, self.stacks = [], [], [], []
        with _ENVIRONMENT_LOCK, _environment(env):
            for _ in range(world_size):
                reader, writer = context.Pipe(duplex=False)
                go_reader, go_writer = context.Pipe(duplex=False)
                stack_reader, stack_writer = context.Pipe(duplex=False)
                process = context.Process(
                    target=_standby_main,
                    args=(worker, args, go_reader, writer, stack_writer, os.getpid()),
                    name="everyo-spare",
                )
                try:
                    process.start()
                finally:
                    writer.close()
                    go_reader.close()
                    stack_writer.close()
                # Listed before the reaper hears of it: a SIGTERM/SIGHUP between the two must not
                # leave a started process that the cleanup does not stop but the reaper waits for.
                self.processes.append(process)
                reaper.own_pid(process.pid)
                self.pipes.append(reader)
                self.gos.append(go_writer)
                self.stacks.append(stack_reader)

    def go(self, world_size, control_name):
        """Hand every spare its rank; returns (processes, result pipes) as a fresh start would."""
        for rank, go in enumerate(self.gos):
            try:
                go.send((rank, world_size, control_name))
            except OSError:
                pass  # it died while waiting: spawn sees its exit like any other rank's
            go.close()
        self.gos = []
        return self.processes, self.pipes, self.stacks

    def close(self):
        """Unused spares: tell them to exit, then stop whatever is left."""
        for go in self.gos:
            try:
                go.send(None)
            except OSError:
                pass
            go.close()
        _stop(self.processes)
        for process in self.processes:
            process.close()
        for pipe in self.pipes + self.stacks:
            pipe.close()


def _standby_main(worker, args, go, pipe, stack, parent_pid):
    """A spare's entry point: wait (imported) for ``(rank, world_size, control_name)``, then be that rank."""
    _die_with_parent(parent_pid)
    import everyo.distributed.ddp  # noqa: F401 - what a training worker needs anyway, loaded while waiting
    import everyo.distributed.elastic  # noqa: F401

    try:
        message = go.recv()
    except (EOFError, OSError):
        message = None
    go.close()
    if message is None:
        pipe.close()
        stack.close()
        return
    rank, world_size, control_name = message
    _worker_main(worker, args, rank, world_size, control_name, pipe, stack, parent_pid)


def _exhausted(failures: list[EveryODistributedError], max_restarts: int) -> EveryODistributedError:
    parts = [f"[attempt {i}] {exc}" for i, exc in enumerate(failures)]
    error = EveryODistributedError(
        f"spawn: the job failed {len(failures)} times, and max_restarts={max_restarts} restarts are used up. "
        "Every failure, in order:\n\n" + "\n\n".join(parts)
    )
    error.rank = getattr(failures[-1], "rank", None)  # type: ignore[attr-defined]
    error.failures = failures  # type: ignore[attr-defined]
    return error


def _spawn_once(
    worker, world_size, args, timeout, stall_timeout, updates, spares=None, start_spares=None, started=None, reaper=None
):
    control_name = new_segment_name("everyo")
    reaper = reaper or Reaper.none()
    reaper.own_prefix(control_name)  # the control block and rank 0's data segments (control_name + "_d<g>")
    control = ControlBlock.create(control_name, world_size)
    context = multiprocessing.get_context("spawn")
    processes, pipes, stacks = [], [], []
    try:
        with _termination_raises():
            if spares is not None:
                processes, pipes, stacks = spares.go(world_size, control_name)
            with _ENVIRONMENT_LOCK, _environment(updates):
                for rank in range(len(processes), world_size):
                    reader, writer = context.Pipe(duplex=False)
                    stack_reader, stack_writer = context.Pipe(duplex=False)
                    pipes.append(reader)
                    stacks.append(stack_reader)
                    process = context.Process(
                        target=_worker_main,
                        args=(worker, args, rank, world_size, control_name, writer, stack_writer, os.getpid()),
                        name=f"everyo-rank-{rank}",
                    )
                    try:
                        process.start()
                    except Exception as exc:
                        raise EveryODistributedError(
                            f"spawn could not start rank {rank}: {type(exc).__name__}: {exc}. The worker "
                            "and its args are pickled into each new process, so the worker must be a "
                            "module-level function and args must be picklable."
                        ) from exc
                    finally:
                        writer.close()
                        stack_writer.close()
                    # Listed before the reaper hears of it: a SIGTERM/SIGHUP between the two would
                    # leave a rank that _stop does not stop but the reaper waits for (and the parent
                    # waits for the reaper): a 30 s deadlock instead of a prompt exit.
                    processes.append(process)
                    reaper.own_pid(process.pid)
            if start_spares is not None:
                started.append(start_spares())
            results = _supervise(processes, pipes, control, timeout, stall_timeout, stacks)
            # Every rank has sent its result; let them exit on their own (flushing their
            # output) rather than be terminated in the middle of it.
            _join_all(processes, _EXIT_SECONDS)
            return results
    finally:
        _stop(processes)
        for process in processes:
            process.close()  # its sentinel fd: a retained exception must not keep it open
        for pipe in pipes + stacks:
            pipe.close()
        generation, _ = control.data_segment()
        control.close()
        # Rank 0 unlinks superseded generations itself; one past the published
        # one covers a rank 0 that died between creating and publishing it.
        for g in range(1, generation + 2):
            unlink_segment(data_segment_name(control_name, g))
        unlink_segment(control_name)


# Two spawn calls in different threads must not interleave their save/set/restore of the
# BLAS variables: the second would save the first's value and put it back for good.
_ENVIRONMENT_LOCK = threading.Lock()


class _Terminated(BaseException):
    """Raised in the parent by SIGTERM/SIGHUP while spawn runs, so its cleanup runs too."""


@contextlib.contextmanager
def _termination_raises():
    """While spawn runs (main thread only), SIGTERM and SIGHUP raise instead of killing the parent
    outright, so the workers are stopped and the segments unlinked (the resource tracker would
    otherwise warn about them); the previous handlers come back afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {}

    def handler(signum, frame):
        raise _Terminated(f"spawn's parent received {signal.Signals(signum).name}")

    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) is signal.SIG_DFL:  # leave a handler the program installed alone
            previous[sig] = signal.signal(sig, handler)
    try:
        yield
    except _Terminated as exc:
        signum = signal.SIGTERM if "SIGTERM" in str(exc) else signal.SIGHUP
        raise SystemExit(128 + signum) from None
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@contextlib.contextmanager
def _environment(updates):
    saved = {name: os.environ.get(name) for name in updates}
    os.environ.update(updates)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _die_with_parent(parent_pid):
    """Have the kernel kill this worker if the parent dies (Linux), so no orphan keeps running.

    The barrier also watches for a dead parent, but only while it waits; a
    worker busy computing, or passing quick barriers, would never look.
    """
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: the barrier's parent check remains
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def _listen_for_stack_requests(stack):
    """On ``_STACK_SIGNAL``, write this process's Python stacks (every thread) to the ``stack`` pipe.

    faulthandler writes from the signal handler itself, so a rank stuck in C code answers too; the
    handler it chains to (Python's) then writes ``_STACK_END`` once the main thread runs Python again,
    which tells spawn the dump is complete.
    """
    import faulthandler

    def end(signum, frame):
        try:
            os.write(stack.fileno(), _STACK_END)
        except OSError:
            pass

    signal.signal(_STACK_SIGNAL, end)
    faulthandler.register(_STACK_SIGNAL, file=stack.fileno(), all_threads=True, chain=True)


def _worker_main(worker, args, rank, world_size, control_name, pipe, stack, parent_pid):
    """Entry point of each spawned process."""
    _die_with_parent(parent_pid)
    _listen_for_stack_requests(stack)
    group = None
    try:
        group = SharedMemoryGroup(control_name, rank, world_size)
        result = worker(group, *args)
        group._finish(ok=True)
        try:
            pipe.send(("ok", result))
        except Exception as exc:
            group._control.abort(rank)
            pipe.send(
                (
                    "error",
                    f"rank {rank} returned a value that cannot be sent to the parent "
                    f"({type(exc).__name__}: {exc}); return NumPy arrays or plain Python data",
                    traceback.format_exc(),
                    False,
                )
            )
    except BaseException as exc:  # noqa: B902 - every failure must reach the parent
        if group is not None:
            group._finish(ok=False)
        # Raised because a peer failed first (also when user code wrapped that error): listed, not blamed.
        secondary = is_consequence(exc)
        pipe.send(("error", f"rank {rank} raised {type(exc).__name__}: {exc}", traceback.format_exc(), secondary))
    finally:
        if group is not None:
            group.close()
        pipe.close()


def _stack_of(process, stack):
    """Ask a stuck rank for its Python stacks (``_listen_for_stack_requests``) and return them.

    Diagnostics on the way to an error: waits for the end marker, at most ``_STACK_SECONDS``
    (a rank stuck in C code writes its stacks but no marker). Returns "" if nothing came.
    """
    try:
        os.kill(process.pid, _STACK_SIGNAL)
    except OSError:
        return ""
    data = b""
    deadline = time.monotonic() + _STACK_SECONDS
    while _STACK_END not in data:
        left = deadline - time.monotonic()
        if left <= 0 or not stack.poll(left):
            break
        try:
            chunk = os.read(stack.fileno(), 65536)
        except OSError:
            break
        if not chunk:
            break
        data += chunk
    return data.split(_STACK_END)[0].decode("utf-8", "replace").rstrip()


def _supervise(processes, pipes, control, timeout, stall_timeout=None, stacks=None):
    world_size = len(processes)
    results = [None] * world_size
    finished = [False] * world_size
    # (priority, order, rank, message): a rank's own failure (an exception, a death) is priority 0, a
    # consequence of a peer's failure 1; the first failure in arrival order among the lowest is the cause.
    failures = []
    by_handle = {}
    for rank, (process, pipe) in enumerate(zip(processes, pipes)):
        by_handle[pipe] = ("pipe", rank)
        by_handle[process.sentinel] = ("exit", rank)
    deadline = None if timeout is None else time.monotonic() + timeout
    grace_deadline = None
    watch = _StallWatch(control, stall_timeout, finished)

    def receive(rank, pipe):
        try:
            message = pipe.recv()
        except (EOFError, OSError):
            return False
        if message[0] == "ok":
            results[rank] = message[1]
            finished[rank] = True
        else:
            _, text, remote_tb, secondary = message
            failures.append(
                (
                    1 if secondary else 0,
                    len(failures),
                    rank,
                    f"{text}\n\nTraceback of rank {rank}:\n{remote_tb.rstrip()}",
                )
            )
        return True

    while by_handle and not all(finished):
        now = time.monotonic()
        if failures and grace_deadline is None:
            control.abort(failures[0][2])
            grace_deadline = now + _GRACE_SECONDS
        if not failures:
            stalled = watch.check(now)
            if stalled is not None:
                message = stalled[1]
                if stacks is not None:
                    dump = _stack_of(processes[stalled[0]], stacks[stalled[0]])
                    message += (
                        f"\n\nPython stack of rank {stalled[0]} when spawn stopped it (most recent call first):\n"
                        + (dump or "(none came: the rank did not answer faulthandler's signal)")
                    )
                error = EveryODistributedError(message)
                error.rank = stalled[0]
                raise error
        limits = [d for d in (deadline, grace_deadline, watch.next_check) if d is not None]
        wait_for = None if not limits else max(0.0, min(limits) - now)
        if grace_deadline is not None and now >= grace_deadline:
            break
        if deadline is not None and now >= deadline and not failures:
            raise EveryODistributedError(_timeout_message(timeout, finished, control))
        ready = connection.wait(list(by_handle), timeout=wait_for)
        for handle in ready:
            kind, rank = by_handle.pop(handle)
            if kind == "pipe":
                receive(rank, handle)
                continue
            # The process exited: read a message it sent just before, if any.
            pipe = pipes[rank]
            if pipe in by_handle:
                del by_handle[pipe]
                if pipe.poll() and receive(rank, pipe):
                    continue
            if not finished[rank] and not any(f[2] == rank for f in failures):
                processes[rank].join()
                failures.append((0, len(failures), rank, _death_message(rank, processes[rank].exitcode)))
    if failures:
        failures.sort()
        first = failures[0]
        others = sorted({f[2] for f in failures[1:] if f[2] != first[2]})
        message = first[3]
        if others:
            message += f"\n\n(ranks also failed or were stopped: {', '.join(map(str, others))})"
        error = EveryODistributedError(message)
        error.rank = first[2]
        raise error
    return results


class _StallWatch:
    """Notices ranks waiting in a collective that a peer does not reach while nothing changes.

    The parent samples every rank's barrier counter; while some rank waits
    (its counter is ahead of a peer's) and no counter moves, the stall
    grows. A rank still computing between collectives moves nothing either,
    but then nobody waits -- so long steps never trip it.
    """

    def __init__(self, control, stall_timeout, finished):
        self.control, self.stall_timeout, self.finished = control, stall_timeout, finished
        self.next_check = None if stall_timeout is None else time.monotonic() + _STALL_CHECK_SECONDS
        self.state, self.since = None, None

    def check(self, now):
        if self.stall_timeout is None or now < self.next_check:
            return None
        self.next_check = now + min(_STALL_CHECK_SECONDS, self.stall_timeout / 4)
        control, world = self.control, len(self.finished)
        counters = tuple(control.counter(r) for r in range(world))
        if counters != self.state:
            self.state, self.since = counters, now
            return None
        top = max(counters)
        behind = [r for r in range(world) if counters[r] < top and not self.finished[r]]
        if not behind or now - self.since < self.stall_timeout:
            return None
        waiting = [r for r in range(world) if counters[r] == top]
        record = control.last_record(waiting[0])
        where = record.describe() if record is not None else "a collective"
        lines = []
        for r in behind:
            last = control.last_record(r)
            lines.append(
                f"  rank {r}: running, has not reached it (its last collective: "
                f"{last.describe() if last is not None else 'none'})"
            )
        stuck = ", ".join(map(str, behind))
        return behind[0], (
            f"spawn: rank(s) {stuck} stuck outside the collectives: rank(s) {', '.join(map(str, waiting))} "
            f"waited {now - self.since:.0f} s in {where} (stall_timeout={self.stall_timeout:g} s) while "
            f"rank(s) {stuck} made no progress towards it:\n" + "\n".join(lines) + "\n"
            "Look for an endless loop, a blocking read or a deadlock on those ranks, or a rank that "
            "took a different path through the loop; raise stall_timeout= if a rank legitimately "
            "works that long alone (an evaluation, a checkpoint)."
        )


def _death_message(rank, exitcode):
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        cause = f"was killed by {name}"
        if -exitcode == signal.SIGKILL:
            cause += " (the kernel's out-of-memory killer sends this too)"
    else:
        cause = f"exited with code {exitcode}"
    message = f"rank {rank} {cause} without returning from its worker or raising."
    if exitcode == 1:
        # Python's own exit code when the new process failed before the worker ran.
        message += (
            " If its stderr above shows a bootstrapping RuntimeError, the script that calls spawn "
            'needs an `if __name__ == "__main__":` guard; if it shows "Can\'t get attribute", '
            "the worker must be defined in an importable module (not in a notebook or an "
            "interactive session)."
        )
    return message


def _timeout_message(timeout, finished, control):
    lines = []
    for rank, done in enumerate(finished):
        if done:
            lines.append(f"  rank {rank}: finished")
            continue
        record = control.last_record(rank)
        if record is None:
            where = "had not called any collective"
        elif control.is_waiting(rank):
            where = f"waiting in {record.describe()}"
        else:
            where = f"running (its last collective: {record.describe()})"
        lines.append(f"  rank {rank}: {where}")
    unfinished = [str(r) for r, done in enumerate(finished) if not done]
    return (
        f"spawn timed out after {timeout} s; rank(s) {', '.join(unfinished)} had not finished:\n"
        + "\n".join(lines)
        + "\n"
        + _TIMEOUT_HINT
    )


def _join_all(processes, seconds):
    deadline = time.monotonic() + seconds
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))


def _stop(processes):
    for process in processes:
        if process.is_alive():
            process.terminate()
    for process in processes:
        process.join(2.0)
        if process.is_alive():
            process.kill()
            process.join()
