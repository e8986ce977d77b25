"""Data-parallel training: ``spawn``, ``DistributedDataParallel``, ``DistributedSampler``, the collectives.

See the spec's "Data-parallel training" section. One folder per backend over
one protocol module:

* :mod:`everyo.distributed.protocol` -- the :class:`ProcessGroup` interface
  and what every backend shares (:class:`CollectiveRecord`,
  :func:`check_records`, :func:`reduce_in_rank_order`, :func:`split_blocks`);
* :mod:`everyo.distributed.sharedmem` -- ``spawn`` and its shared-memory group
  (one machine);
* :mod:`everyo.distributed.tcp` -- public as ``everyo.distributed_tcp``;
* :mod:`everyo.distributed.mpi` -- public as ``everyo.distributed_mpi``.

Shared memory is loaded only when ``spawn`` is first used, so this package
(and the TCP and MPI backends) import where ``_posixshmem`` does not exist.
"""

from everyo.distributed._version import __version__  # noqa: F401
from everyo.distributed.ddp import DistributedDataParallel
from everyo.distributed.gradients import average_gradients
from everyo.distributed.protocol import (
    CollectiveRecord,
    PeerFailedError,
    ProcessGroup,
    check_records,
    describe_mismatch,
    prepare_array,
    reduce_in_rank_order,
    split_blocks,
)
from everyo.distributed.sampler import DistributedSampler
from everyo.distributed.sharding import shard_indices
from everyo.distributed.threads import available_cores, worker_thread_env
from everyo.errors import EveryODistributedError

__all__ = [
    "spawn",
    "DistributedDataParallel",
    "DistributedSampler",
    "shard_indices",
    "average_gradients",
    "EveryODistributedError",
    "PeerFailedError",
    "ProcessGroup",
    "CollectiveRecord",
    "describe_mismatch",
    "check_records",
    "prepare_array",
    "reduce_in_rank_order",
    "split_blocks",
    "worker_thread_env",
    "available_cores",
]


def __getattr__(name):
    # PEP 562: ``spawn`` (and the shared-memory group) load on first use, not at import.
    if name == "spawn":
        from everyo.distributed.sharedmem.spawn import spawn

        globals()["spawn"] = spawn
        return spawn
    raise AttributeError(f"module 'everyo.distributed' has no attribute {name!r}")
