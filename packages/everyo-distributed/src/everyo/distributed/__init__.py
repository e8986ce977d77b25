"""Data-parallel training on one machine: ``spawn``, ``shard_indices``, ``average_gradients``.

See the spec's "Data-parallel training" section. ``spawn`` starts worker
processes (spawn start method) joined by a shared-memory process group; other
backends (``everyo.distributed_tcp``, ``everyo.distributed_mpi``) implement the
same :class:`ProcessGroup` interface and reuse its collective protocol
(:class:`CollectiveRecord`, :func:`check_records`, :func:`reduce_in_rank_order`).
"""
from everyo.distributed._version import __version__  # noqa: F401
from everyo.errors import EveryODistributedError
from everyo.distributed.group import (
    ProcessGroup,
    CollectiveRecord,
    describe_mismatch,
    check_records,
    prepare_array,
    reduce_in_rank_order,
)
from everyo.distributed.gradients import average_gradients
from everyo.distributed.sharding import shard_indices
from everyo.distributed.spawn import spawn
from everyo.distributed.threads import worker_thread_env, available_cores

__all__ = [
    "spawn",
    "shard_indices",
    "average_gradients",
    "EveryODistributedError",
    "ProcessGroup",
    "CollectiveRecord",
    "describe_mismatch",
    "check_records",
    "prepare_array",
    "reduce_in_rank_order",
    "worker_thread_env",
    "available_cores",
]
