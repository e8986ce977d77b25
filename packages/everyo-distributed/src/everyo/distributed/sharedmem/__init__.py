"""The shared-memory backend (one machine, POSIX shared memory): ``spawn`` (in
:mod:`~everyo.distributed.sharedmem.spawn`, public as ``everyo.distributed.spawn``)
and the group it hands each worker (:mod:`~everyo.distributed.sharedmem.group`),
over the control block (``control``) and the segments (``segment``).

Imported only by what uses it (``everyo.distributed.spawn`` loads it on first
use), so the TCP and MPI backends import where ``_posixshmem`` does not exist.
"""
