"""Data-parallel training on one machine: ``spawn``, ``shard_indices``, ``average_gradients``.

See the spec's "Data-parallel training" section. ``spawn`` starts worker
processes (spawn start method) joined by a shared-memory process group; other
backends (``everyo.distributed_tcp``, ``everyo.distributed_mpi``) implement the
same :class:`ProcessGroup` interface.
"""
from everyo.errors import EveryODistributedError
from everyo.distributed.group import (
    ProcessGroup,
    CollectiveRecord,
    describe_mismatch,
    check_records,
    reduce_in_rank_order,
)
from everyo.distributed.gradients import average_gradients

__all__ = [
    "EveryODistributedError",
    "ProcessGroup",
    "CollectiveRecord",
    "describe_mismatch",
    "check_records",
    "reduce_in_rank_order",
    "average_gradients",
]
