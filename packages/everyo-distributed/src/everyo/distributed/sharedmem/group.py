"""The shared-memory process group: the spec's collective on one machine.

Data lives in one POSIX shared-memory buffer with one slot per rank (plus one
result slot). An all-reduce is: publish this rank's :class:`CollectiveRecord`,
copy the array into this rank's slot, barrier (after the write), check every
rank's record, reduce in rank order in float64, barrier (after the read, so
nobody overwrites a slot a peer is still reading).

Small arrays: every rank reduces all of it into its own new array. Large
arrays (from ``_SPLIT_ELEMENTS``): the reduction is split -- rank ``r``
reduces the ``r``-th block of elements into the result slot, then, after the
second barrier, every rank copies the result slot out. Each element is still
reduced once, in rank order, in float64, so the bits are the same as the
unsplit path, but each rank does ``1 / world_size`` of the arithmetic (the
float64 casts cost four times a plain copy). The result slot needs no third
barrier: it is next written after the next collective's first barrier, which
no rank passes before every rank finished copying it out.

The buffer grows when a collective needs more room than it has. Growth is
decided after the records agree, so every rank takes the same decision: rank 0
creates the next generation, a barrier, the others map it, and the data is
written there. Training calls the same collective every step, so this happens
once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from everyo.distributed.protocol import (
    CollectiveRecord,
    ProcessGroup,
    check_records,
    reduce_in_rank_order,
    split_blocks,
)
from everyo.distributed.sharedmem.control import FAILED, RETURNED, ControlBlock
from everyo.distributed.sharedmem.segment import attach_segment, create_segment, unlink_segment
from everyo.distributed.threads import available_cores
from everyo.errors import EveryODistributedError

if TYPE_CHECKING:
    from everyo.distributed.sharedmem.segment import Segment

__all__ = ["SharedMemoryGroup", "data_segment_name"]

_MIN_CAPACITY = 1 << 16
_SPLIT_ELEMENTS = 1 << 15  # below this, splitting costs more in Python overhead than it saves
_ALIGN = 4096
_DIRECT_PAIRS = True  # see _all_reduce (a switch for the benchmark's A/B comparison)


def data_segment_name(control_name: str, generation: int) -> str:
    return f"{control_name}_d{generation}"


class SharedMemoryGroup(ProcessGroup):
    """A rank's handle on the shared-memory group that :func:`~everyo.distributed.spawn` created.

    Not constructed by users: ``spawn`` passes one to each worker as its first argument.
    """

    def __init__(self, control_name: str, rank: int, world_size: int) -> None:
        super().__init__(rank, world_size)
        self._control_name = control_name
        self._control = ControlBlock.attach(control_name, world_size, rank)
        self._control.oversubscribed = world_size > available_cores()
        self._data: Segment | None = None  # Segment of the current generation
        self._generation = 0
        self._capacity = 0  # bytes per slot; identical on every rank

    def _close(self) -> None:
        """Unmap this rank's views (the parent unlinks the segments)."""
        if self._data is not None:
            try:
                self._data.close()
            except BufferError:
                pass  # a traceback still holds a view; the mapping dies with the process
            self._data = None
        self._control.close()  # idempotent

    # -- used by spawn's worker entry point -------------------------------------
    def _finish(self, ok: bool) -> None:
        if self._closed:  # the worker closed its group itself
            return
        if not ok:
            self._control.abort(self._rank)
        self._control.set_state(RETURNED if ok else FAILED)

    # -- protocol ---------------------------------------------------------------------
    def _check(self, record: CollectiveRecord, packed: bytes) -> None:
        if not self._control.records_match(record.seq, packed):
            check_records(self._control.records(record.seq))

    def _slot(self, rank: int, dtype: np.dtype[Any], size: int) -> np.ndarray:
        if size == 0:
            return np.empty(0, dtype)
        assert self._data is not None  # a collective that moves data has grown the buffer first
        return np.frombuffer(self._data.buf, dtype=dtype, count=size, offset=rank * self._capacity)

    def _exchange(self, record: CollectiveRecord, data: np.ndarray, writes: bool) -> None:
        """Publish, write (if ``writes`` and it fits), barrier, check, grow if needed."""
        control = self._control
        packed = control.publish(record)
        fits = data.nbytes <= self._capacity
        if writes and fits and data.size:
            self._slot(self._rank, data.dtype, data.size)[...] = data.reshape(-1)
        control.barrier(record)
        self._check(record, packed)
        if not fits:
            self._grow(data.nbytes, record)
            if writes:
                self._slot(self._rank, data.dtype, data.size)[...] = data.reshape(-1)
            control.barrier(record)

    def _all_reduce(self, record, data, op):
        self._exchange(record, data, writes=True)
        world, n = self._world_size, data.size
        slots = [self._slot(r, data.dtype, n) for r in range(world)]
        if (
            n < _SPLIT_ELEMENTS
            or world == 1
            or (world == 2 and op == "sum" and data.dtype.kind == "f" and _DIRECT_PAIRS)
        ):
            # Two ranks' float sum is one add in the input dtype, no dearer than the copy out of a
            # split reduction: every rank adds everything straight into its own result, saving the
            # result slot's round trip and a barrier. (The mean's add, halve and finiteness check
            # cost more than that copy, so the mean stays split.)
            out = reduce_in_rank_order(slots, op)
        else:
            result = self._slot(world, data.dtype, n)
            lo, hi = split_blocks(n, world)[self._rank]
            reduce_in_rank_order([s[lo:hi] for s in slots], op, out=result[lo:hi])
            self._control.barrier(record)
            out = result.copy()
            del result
        del slots
        self._control.barrier(record)
        return out

    def _reduce_scatter(self, record, data, op, blocks):
        self._exchange(record, data, writes=True)
        lo, hi = blocks[self._rank]
        slots = [self._slot(r, data.dtype, data.size)[lo:hi] for r in range(self._world_size)]
        out = reduce_in_rank_order(slots, op)
        del slots
        self._control.barrier(record)
        return out

    def _all_gather(self, record, data):
        self._exchange(record, data, writes=True)
        out = np.empty((self._world_size, data.size), data.dtype)
        for r in range(self._world_size):
            out[r] = self._slot(r, data.dtype, data.size)
        self._control.barrier(record)
        return out

    def _broadcast(self, record, data, root):
        self._exchange(record, data, writes=self._rank == root)
        out = self._slot(root, data.dtype, data.size).copy()
        self._control.barrier(record)
        return out

    def _barrier(self, record):
        packed = self._control.publish(record)
        self._control.barrier(record)
        self._check(record, packed)

    def _grow(self, nbytes: int, record: CollectiveRecord) -> None:
        capacity = max(nbytes, 2 * self._capacity, _MIN_CAPACITY)
        capacity = -(-capacity // _ALIGN) * _ALIGN
        generation = self._generation + 1
        name = data_segment_name(self._control_name, generation)
        old = self._data
        self._data = None
        if self._rank == 0:
            self._data = create_segment(name, capacity * (self._world_size + 1))
            self._control.set_data_segment(generation, capacity)
            if old is not None:
                old.close()
                unlink_segment(old.name)  # the peers still hold their mappings until they swap
        elif old is not None:
            old.close()
        self._control.barrier(record)
        if self._rank != 0:
            published = self._control.data_segment()
            if published != (generation, capacity):
                raise EveryODistributedError(
                    f"rank {self._rank}: expected data segment generation {generation} "
                    f"({capacity} bytes per slot), rank 0 published {published}"
                )
            self._data = attach_segment(name, capacity * (self._world_size + 1))
        self._generation, self._capacity = generation, capacity
