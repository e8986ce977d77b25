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

import numpy as np

from everyo.errors import EveryODistributedError
from everyo.distributed.control import FAILED, RETURNED, ControlBlock
from everyo.distributed.group import (
    CollectiveRecord,
    ProcessGroup,
    check_records,
    prepare_array,
    reduce_in_rank_order,
)
from everyo.distributed.shm import attach_segment, create_segment, unlink_segment
from everyo.distributed.threads import available_cores

__all__ = ["SharedMemoryGroup", "data_segment_name"]

_MIN_CAPACITY = 1 << 16
_SPLIT_ELEMENTS = 1 << 15   # below this, splitting costs more in Python overhead than it saves
_ALIGN = 4096


_DTYPE_NAMES = {}


def _dtype_name(dtype) -> str:
    # numpy's dtype.name is computed on every access (~1 us); collectives are latency-bound.
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = dtype.name
    return name


def data_segment_name(control_name: str, generation: int) -> str:
    return f"{control_name}_d{generation}"


class SharedMemoryGroup(ProcessGroup):
    """A rank's handle on the shared-memory group that :func:`~everyo.distributed.spawn` created.

    Not constructed by users: ``spawn`` passes one to each worker as its first argument.
    """

    def __init__(self, control_name: str, rank: int, world_size: int):
        self._rank, self._world_size = rank, world_size
        self._control_name = control_name
        self._control = ControlBlock.attach(control_name, world_size, rank)
        self._control.oversubscribed = world_size > available_cores()
        self._data = None          # Segment of the current generation
        self._generation = 0
        self._capacity = 0         # bytes per slot; identical on every rank
        self._seq = 0
        self._broken = None        # message once a collective failed on this rank

    # -- public collectives ---------------------------------------------------------
    def barrier(self) -> None:
        record = self._begin("barrier", 0, "none", -1)
        self._guarded(self._barrier_body, record)

    def broadcast(self, array, root: int = 0) -> np.ndarray:
        if not 0 <= root < self._world_size:
            raise EveryODistributedError(
                f"broadcast: root {root} is not a rank of this group (world_size {self._world_size})"
            )
        data = prepare_array(array, "broadcast")
        record = self._begin("broadcast", data.size, _dtype_name(data.dtype), root)
        return self._guarded(self._broadcast_body, record, data, root)

    def close(self) -> None:
        """Unmap this rank's views (the parent unlinks the segments)."""
        if self._data is not None:
            try:
                self._data.close()
            except BufferError:
                pass  # a traceback still holds a view; the mapping dies with the process
            self._data = None
        if self._control is not None:
            self._control.close()
            self._control = None

    # -- used by spawn's worker entry point -------------------------------------
    def _finish(self, ok: bool) -> None:
        if self._control is None:
            return
        if not ok:
            self._control.abort(self._rank)
        self._control.set_state(RETURNED if ok else FAILED)

    # -- protocol ---------------------------------------------------------------------
    def _begin(self, op: str, size: int, dtype: str, root: int) -> CollectiveRecord:
        if self._broken is not None:
            raise EveryODistributedError(
                f"rank {self._rank}: the group is unusable after an earlier failure: {self._broken}"
            )
        if self._control is None:
            raise EveryODistributedError(f"rank {self._rank}: {op} on a closed group")
        record = CollectiveRecord(op, size, dtype, self._seq, root)
        self._seq += 1
        return record

    def _guarded(self, body, record, *args):
        try:
            return body(record, *args)
        except BaseException as exc:
            self._broken = f"{type(exc).__name__}: {exc}"
            raise

    def _check(self, record: CollectiveRecord, packed: bytes) -> None:
        if not self._control.records_match(record.seq, packed):
            check_records(self._control.records(record.seq))

    def _slot(self, rank: int, dtype, size: int) -> np.ndarray:
        if size == 0:
            return np.empty(0, dtype)
        return np.frombuffer(self._data.buf, dtype=dtype, count=size, offset=rank * self._capacity)

    def _exchange(self, record, data, writes: bool) -> None:
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

    def _all_reduce(self, array, op_name: str, op: str) -> np.ndarray:
        data = prepare_array(array, op_name)
        record = self._begin(op_name, data.size, _dtype_name(data.dtype), -1)
        return self._guarded(self._all_reduce_body, record, data, op)

    def _all_reduce_body(self, record, data, op):
        self._exchange(record, data, writes=True)
        world, n = self._world_size, data.size
        slots = [self._slot(r, data.dtype, n) for r in range(world)]
        if n < _SPLIT_ELEMENTS or world == 1:
            out = reduce_in_rank_order(slots, op)
        else:
            result = self._slot(world, data.dtype, n)
            base, extra = divmod(n, world)
            lo = self._rank * base + min(self._rank, extra)
            hi = lo + base + (self._rank < extra)
            reduce_in_rank_order([s[lo:hi] for s in slots], op, out=result[lo:hi])
            self._control.barrier(record)
            out = result.copy()
            del result
        del slots
        self._control.barrier(record)
        return out.reshape(data.shape)

    def _broadcast_body(self, record, data, root):
        self._exchange(record, data, writes=self._rank == root)
        out = self._slot(root, data.dtype, data.size).copy().reshape(data.shape)
        self._control.barrier(record)
        return out

    def _barrier_body(self, record):
        packed = self._control.publish(record)
        self._control.barrier(record)
        self._check(record, packed)

    def _grow(self, nbytes: int, record) -> None:
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
                unlink_segment(old.name)   # the peers still hold their mappings until they swap
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
