"""POSIX shared-memory segments with exactly one owner each, and no resource-tracker noise.

Python 3.11's ``SharedMemory`` registers a segment with the resource tracker
on *attach* as well as on create, and the spawned workers share the parent's
tracker; a worker that attached and exited would then make the tracker warn
about (or unlink) a segment still in use. So here:

* the creator registers the segment with the tracker (the safety net that
  unlinks it if every process dies without cleaning up);
* attaching maps the segment with ``shm_open`` + ``mmap`` and registers nothing;
* :func:`unlink_segment` unlinks and unregisters exactly once; unlinking a
  name that is already gone is not an error (a cleanup path may run twice).
"""

from __future__ import annotations

import _posixshmem  # type: ignore[import-not-found]  # CPython's module behind shared_memory; no stub
import mmap
import os
import secrets
from multiprocessing import resource_tracker

from everyo.errors import EveryODistributedError

__all__ = ["Segment", "create_segment", "attach_segment", "unlink_segment", "new_segment_name"]

_SHM_DIR = "/dev/shm"


def new_segment_name(prefix: str = "everyo") -> str:
    """A fresh, unguessable name (the leading slash is POSIX's convention)."""
    return f"/{prefix}_{os.getpid()}_{secrets.token_hex(4)}"


class Segment:
    """A mapped shared-memory segment: ``.name``, ``.size``, ``.buf`` (an ``mmap``)."""

    __slots__ = ("name", "size", "buf")

    def __init__(self, name: str, size: int, buf: mmap.mmap) -> None:
        self.name, self.size, self.buf = name, size, buf

    def close(self) -> None:
        """Unmap this process's view; raises ``BufferError`` if NumPy views of it still exist."""
        if not self.buf.closed:
            self.buf.close()


def _check_free_space(size: int) -> None:
    # tmpfs reserves nothing at ftruncate time: a segment larger than the free
    # space maps fine and then kills the process with SIGBUS on first touch.
    try:
        stat = os.statvfs(_SHM_DIR)
    except OSError:
        return
    free = stat.f_bavail * stat.f_frsize
    if size > free:
        raise EveryODistributedError(
            f"the shared-memory buffer needs {size / 2**20:.1f} MiB but {_SHM_DIR} has only "
            f"{free / 2**20:.1f} MiB free; free space there (e.g. docker --shm-size) or use smaller arrays"
        )


def create_segment(name: str, size: int) -> Segment:
    """Create, size and map a new segment, registered with the resource tracker."""
    _check_free_space(size)
    fd = _posixshmem.shm_open(name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
    try:
        resource_tracker.register(name, "shared_memory")
        try:
            os.ftruncate(fd, size)
            buf = mmap.mmap(fd, size)
        except BaseException:
            unlink_segment(name)
            raise
    finally:
        os.close(fd)
    return Segment(name, size, buf)


def attach_segment(name: str, size: int) -> Segment:
    """Map an existing segment without registering it anywhere."""
    try:
        fd = _posixshmem.shm_open(name, os.O_RDWR, mode=0o600)
    except FileNotFoundError:
        raise EveryODistributedError(
            f"shared-memory segment {name} does not exist; the process that created it "
            "has already cleaned up (did the parent exit?)"
        ) from None
    try:
        buf = mmap.mmap(fd, size)
    finally:
        os.close(fd)
    return Segment(name, size, buf)


def unlink_segment(name: str) -> bool:
    """Unlink ``name`` and unregister it; ``False`` if it was already gone."""
    try:
        _posixshmem.shm_unlink(name)
    except FileNotFoundError:
        return False
    resource_tracker.unregister(name, "shared_memory")
    return True
