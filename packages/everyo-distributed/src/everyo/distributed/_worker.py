"""The entry point of each worker that ``python -m everyo.distributed.run`` starts.

``python -m everyo.distributed._worker script.py args...`` runs the script as
``__main__`` (as ``python script.py args...`` would). An exception that
escapes it is written, before the usual traceback, to the JSON file named by
``$TORCHELASTIC_ERROR_FILE`` in torchrun's layout (``message.message``,
``message.extraInfo.py_callstack``, ``.timestamp``) plus an ``everyo`` entry
saying whether it was a consequence of a peer's failure
(:func:`~everyo.distributed.protocol.is_consequence`) and which peer. The
launcher reads it, so the summary names the failing rank's own exception even
when the worker's stderr went elsewhere.
"""

from __future__ import annotations

import faulthandler
import json
import os
import runpy
import signal
import sys
import time
import traceback

from everyo.distributed.protocol import is_consequence

__all__: list[str] = []


def _failed_rank(exc: BaseException | None) -> int:
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        rank = getattr(exc, "failed_rank", None)
        if isinstance(rank, int):
            return rank
        seen.add(id(exc))
        exc = exc.__cause__ if exc.__cause__ is not None else exc.__context__
    return -1


def write_error_file(exc: BaseException, path: str | None = None) -> None:
    """Record ``exc`` in ``path`` (default ``$TORCHELASTIC_ERROR_FILE``), atomically; no-op without a path."""
    path = path or os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    consequence = is_consequence(exc)
    record = {
        "message": {
            "message": f"{type(exc).__name__}: {exc}",
            "extraInfo": {
                "py_callstack": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
                "timestamp": str(int(time.time())),
            },
        },
        "everyo": {
            "time": time.time(),
            "consequence": consequence,
            "failed_rank": _failed_rank(exc) if consequence else -1,
        },
    }
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            json.dump(record, f)
        os.replace(tmp, path)
    except OSError:
        pass  # the launcher still reports the exit code


def _standby() -> list[str] | None:
    """A spare: load what a worker needs, then wait for ``{"env": ..., "argv": ...}`` on stdin."""
    import everyo.distributed.ddp  # noqa: F401
    import everyo.distributed.elastic  # noqa: F401
    import everyo.distributed_tcp  # noqa: F401

    line = sys.stdin.buffer.readline()
    if not line.strip():
        return None  # the launcher has no work for this spare
    order = json.loads(line)
    os.environ.clear()
    os.environ.update({str(k): str(v) for k, v in order["env"].items()})
    return [str(a) for a in order["argv"]]


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--standby":
        standby = _standby()
        if standby is None:
            return
        argv = standby
    script = argv[0]
    sys.argv = list(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    stack_file = None
    if error_file:
        # A rank the others gave up waiting for (stuck) is asked for its stack before it is stopped.
        stack_file = open(error_file + ".stack", "w")  # noqa: SIM115 - open for the process's lifetime
        faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit:
        raise
    except BaseException as exc:  # noqa: B902 - every failure must reach the launcher
        write_error_file(exc)
        raise


if __name__ == "__main__":
    main()
