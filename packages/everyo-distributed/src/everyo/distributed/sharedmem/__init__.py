"""The shared-memory backend: ``spawn`` and the group it hands each worker (one machine, POSIX shared memory).

Imported only by what uses it (``everyo.distributed.spawn`` loads it on first
use), so the TCP and MPI backends import where ``_posixshmem`` does not exist.
"""
from everyo.distributed.sharedmem.group import SharedMemoryGroup
from everyo.distributed.sharedmem.spawn import spawn

__all__ = ["spawn", "SharedMemoryGroup"]
