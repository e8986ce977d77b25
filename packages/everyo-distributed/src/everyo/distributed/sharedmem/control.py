"""The control block: a small shared-memory segment holding the barrier, the abort word and the records.

Layout, in 64-byte lines (one cache line each, so ranks spinning on a peer's
counter do not fight over the line the peer writes):

* line 0: ``abort`` (0, or ``failed rank + 1`` once anything failed),
  ``generation`` and ``capacity`` of the data segment, ``world_size``;
* line ``1 + r``: rank ``r``'s barrier ``counter``, its ``state``
  (running / returned / failed) and its pid -- written only by rank ``r``;
* then ``2 * world_size`` :class:`CollectiveRecord` slots (96 bytes), double
  buffered by the collective's parity: a rank can only reuse the slot of
  collective ``n`` at ``n + 2``, after every rank passed the barrier of
  ``n + 1``, i.e. after every rank finished reading the records of ``n``.

The barrier needs no atomic read-modify-write: at its ``k``-th barrier a rank
stores ``k`` into its own counter and waits until every peer's counter is at
least ``k``. An aligned 8-byte store is atomic on x86-64 and stores are seen in
program order (TSO), so a peer that sees the counter also sees the data written
before it. (Weakly ordered CPUs would need a fence here; this module targets
x86-64 Linux, where it is tested.)

Waiting spins briefly (a barrier between two busy cores costs about a
microsecond), then yields the core, then sleeps, so oversubscribed workers
(more ranks than cores) do not starve the rank everybody is waiting for.
While waiting it notices an abort, a peer that returned or failed without
reaching the barrier, and a parent that died.
"""

from __future__ import annotations

import os
import threading
import time

from everyo.distributed.protocol import HINT, CollectiveRecord, PeerFailedError
from everyo.distributed.sharedmem.segment import Segment, attach_segment, create_segment
from everyo.errors import EveryODistributedError

__all__ = ["ControlBlock", "RUNNING", "RETURNED", "FAILED", "PeerAbortedError"]

_LINE_WORDS = 8  # 64 bytes
_ABORT, _GENERATION, _CAPACITY, _WORLD = 0, 1, 2, 3
_COUNTER, _STATE, _PID = 0, 1, 2
RUNNING, RETURNED, FAILED = 0, 1, 2
_STATE_NAMES = {RUNNING: "running", RETURNED: "returned from its worker", FAILED: "failed"}

# How long to spin adapts to how long the recent barriers waited. When peers
# arrive within microseconds (back-to-back collectives), a ~1 ms spin catches
# them at the lowest latency (MPI spins forever). When they arrive
# milliseconds apart (training: one rank's backward pass took longer), or there
# are more ranks than cores, spinning only takes CPU from the rank everybody
# waits for -- or from whatever else runs on the machine -- so the spin is
# short and the rank soon yields and sleeps. Measured on 2 cores, the spec's
# training ran ~1.2x faster at 2 workers with a 1 ms spin and ~1.9x with a
# short one, while a short spin tripled the 1e3-element all-reduce latency.
_SPIN_CHECKS = 20000  # ~1 ms of pure spinning while recent waits were short
_SPIN_CHECKS_SHORT = 300  # ~20 us after a long wait, or with more ranks than cores
_LONG_WAIT_SECONDS = 0.0005
_RECENT_BARRIERS = 0b1111  # a long wait among the last 4 barriers keeps spins short
_YIELD_SECONDS = 0.001  # then sched_yield until 1 ms has passed
_SLEEP_SECONDS = 0.0001  # then sleep in 0.1 ms steps: a waiting rank must not steal the
# core from the rank it waits for when there are more ranks than cores
_PARENT_CHECK_SECONDS = 0.1


class PeerAbortedError(PeerFailedError):
    """Raised in a rank released from a collective because another rank failed first.

    ``spawn`` reports the first failure, not these consequences of it.
    """


def control_size(world_size: int) -> int:
    return (1 + world_size) * _LINE_WORDS * 8 + 2 * world_size * CollectiveRecord.PACKED_SIZE


class ControlBlock:
    """One process's view of the control segment."""

    def __init__(self, segment: Segment, world_size: int, rank: int = -1) -> None:
        self.segment = segment
        self.world_size = world_size
        self.rank = rank
        self.words = memoryview(segment.buf).cast("q")
        self._records_offset = (1 + world_size) * _LINE_WORDS * 8
        self._barriers = 0
        self._parent = os.getppid()
        self.oversubscribed = False  # set by the group when world_size > cores
        self._recent_long_waits = 0  # bit i: the i-th last barrier waited long

    # -- creation / attachment ------------------------------------------------
    @classmethod
    def create(cls, name: str, world_size: int) -> ControlBlock:
        block = cls(create_segment(name, control_size(world_size)), world_size)
        block.words[_WORLD] = world_size
        return block

    @classmethod
    def attach(cls, name: str, world_size: int, rank: int) -> ControlBlock:
        block = cls(attach_segment(name, control_size(world_size)), world_size, rank)
        block.words[block._line(rank) + _PID] = os.getpid()
        return block

    def close(self) -> None:
        self.words.release()  # idempotent
        self.segment.close()

    # -- fields -----------------------------------------------------------------
    @staticmethod
    def _line(rank: int) -> int:
        return (1 + rank) * _LINE_WORDS

    @property
    def abort_rank(self) -> int:
        """The rank whose failure aborted the group, or -1."""
        return self.words[_ABORT] - 1

    def abort(self, failed_rank: int) -> None:
        if self.words[_ABORT] == 0:
            self.words[_ABORT] = failed_rank + 1

    def data_segment(self) -> tuple[int, int]:
        return self.words[_GENERATION], self.words[_CAPACITY]

    def set_data_segment(self, generation: int, capacity: int) -> None:
        self.words[_CAPACITY] = capacity
        self.words[_GENERATION] = generation

    def state(self, rank: int) -> int:
        return self.words[self._line(rank) + _STATE]

    def set_state(self, state: int) -> None:
        self.words[self._line(self.rank) + _STATE] = state

    def counter(self, rank: int) -> int:
        return self.words[self._line(rank) + _COUNTER]

    # -- records ------------------------------------------------------------------
    def _record_offset(self, seq: int, rank: int) -> int:
        return self._records_offset + ((seq & 1) * self.world_size + rank) * CollectiveRecord.PACKED_SIZE

    def publish(self, record: CollectiveRecord) -> bytes:
        packed = record.pack()
        start = self._record_offset(record.seq, self.rank)
        self.segment.buf[start : start + len(packed)] = packed
        return packed

    def records_match(self, seq: int, packed: bytes) -> bool:
        buf, size = self.segment.buf, CollectiveRecord.PACKED_SIZE
        for rank in range(self.world_size):
            start = self._record_offset(seq, rank)
            if buf[start : start + size] != packed:
                return False
        return True

    def records(self, seq: int) -> list[CollectiveRecord]:
        size = CollectiveRecord.PACKED_SIZE
        out = []
        for rank in range(self.world_size):
            start = self._record_offset(seq, rank)
            out.append(CollectiveRecord.unpack(self.segment.buf[start : start + size]))
        return out

    def last_record(self, rank: int) -> CollectiveRecord | None:
        """The latest record ``rank`` published (for diagnostics), or ``None``."""
        size = CollectiveRecord.PACKED_SIZE
        best = None
        for parity in (0, 1):
            start = self._record_offset(parity, rank)
            raw = self.segment.buf[start : start + size]
            if raw == bytes(size):
                continue
            record = CollectiveRecord.unpack(raw)
            if best is None or record.seq > best.seq:
                best = record
        return best

    def is_waiting(self, rank: int) -> bool:
        """Whether ``rank`` has arrived at a barrier its peers have not all reached."""
        mine = self.counter(rank)
        return any(self.counter(peer) < mine for peer in range(self.world_size))

    # -- the barrier ----------------------------------------------------------------
    def barrier(self, record: CollectiveRecord) -> None:
        """Wait until every rank has arrived at this barrier (``record`` is only for errors)."""
        self._barriers += 1
        target = self._barriers
        words = self.words
        words[self._line(self.rank) + _COUNTER] = target
        # Off the main thread (DistributedDataParallel's background all-reduce) a pure-Python
        # spin would hold the GIL the main thread's backward pass needs: spin briefly, then sleep.
        patient = not (
            self.oversubscribed or self._recent_long_waits or threading.current_thread() is not threading.main_thread()
        )
        spin = _SPIN_CHECKS if patient else _SPIN_CHECKS_SHORT
        long_wait = False
        for peer in range(self.world_size):
            index = self._line(peer) + _COUNTER
            checks = 0
            while words[index] < target:
                checks += 1
                if words[_ABORT] or checks >= spin:
                    waited = self._wait_slowly(peer, target, record)
                    long_wait = long_wait or patient or waited > _LONG_WAIT_SECONDS
                    break
        self._recent_long_waits = ((self._recent_long_waits << 1) | long_wait) & _RECENT_BARRIERS

    def _wait_slowly(self, peer: int, target: int, record: CollectiveRecord) -> float:
        """Yield, then sleep, until ``peer`` arrives; return the seconds this took."""
        words = self.words
        index = self._line(peer) + _COUNTER
        state_index = self._line(peer) + _STATE
        start = time.monotonic()
        next_parent_check = start + _PARENT_CHECK_SECONDS
        while words[index] < target:
            if words[_ABORT]:
                failed = words[_ABORT] - 1
                raise PeerAbortedError(
                    f"rank {self.rank} was released from {record.describe()} because rank {failed} failed", failed
                )
            if words[state_index] == FAILED and words[index] < target:
                raise PeerAbortedError(
                    f"rank {self.rank} was released from {record.describe()} because rank {peer} failed", peer
                )
            if words[state_index] != RUNNING and words[index] < target:
                # Re-read the counter: the peer stores it before its state.
                raise EveryODistributedError(
                    f"rank {self.rank} is waiting in {record.describe()} but rank {peer} "
                    f"{_STATE_NAMES[words[state_index]]} without calling it. {HINT}"
                )
            now = time.monotonic()
            if now - start < _YIELD_SECONDS:
                os.sched_yield()
            else:
                if now > next_parent_check and os.getppid() != self._parent:
                    raise EveryODistributedError(
                        f"rank {self.rank}: the parent process died while this rank waited in "
                        f"{record.describe()}; stopping"
                    )
                if now > next_parent_check:
                    next_parent_check = now + _PARENT_CHECK_SECONDS
                time.sleep(_SLEEP_SECONDS)
        return time.monotonic() - start
