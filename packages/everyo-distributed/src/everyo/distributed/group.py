"""The process-group interface every backend implements, and the collective protocol they share.

A backend (shared memory here, TCP and MPI in ``everyo.distributed_tcp`` /
``everyo.distributed_mpi``) subclasses :class:`ProcessGroup`. Three pieces are
shared so that every backend behaves the same way:

* :class:`CollectiveRecord` -- what one rank says it is calling (operation,
  element count, dtype, sequence number, root). Every collective publishes one
  before it moves data, and :func:`check_records` raises
  :class:`~everyo.errors.EveryODistributedError` naming the ranks and what
  each called when they disagree. That turns the classic data-parallel hang
  (one rank took a different path through the loop) into an error. It is
  always on: one small record per rank per collective.
* :func:`prepare_array` -- the dtype policy (floats, integers; mean of integers
  refused because it would silently truncate).
* :func:`reduce_in_rank_order` -- the reduction: float64 accumulation, ranks
  added in order 0, 1, 2, ... on every rank, so every rank gets bit-identical
  results whatever the backend.
"""
from __future__ import annotations

import abc
import struct
from typing import NamedTuple, Optional, Sequence

import numpy as np

from everyo.errors import EveryODistributedError

__all__ = [
    "ProcessGroup",
    "CollectiveRecord",
    "describe_mismatch",
    "check_records",
    "prepare_array",
    "reduce_in_rank_order",
    "REDUCE_OPS",
]

REDUCE_OPS = ("sum", "mean")


class CollectiveRecord(NamedTuple):
    """What one rank is calling: compared across ranks before any data moves.

    ``op`` is the public method name (``'all_reduce_mean'``, ``'broadcast'``,
    ``'barrier'``...), ``size`` the element count, ``dtype`` NumPy's name,
    ``seq`` how many collectives this rank has called before on this group,
    ``root`` the broadcast root (``-1`` when the op has none).
    """

    op: str
    size: int
    dtype: str
    seq: int
    root: int = -1

    # Fixed 64-byte little-endian layout so a backend can put a record in a
    # shared-memory slot or on a socket without pickle.
    _FORMAT = struct.Struct("<qqq24s16s")
    PACKED_SIZE = _FORMAT.size

    def pack(self) -> bytes:
        return self._FORMAT.pack(
            self.seq, self.size, self.root, self.op.encode("ascii"), self.dtype.encode("ascii")
        )

    @classmethod
    def unpack(cls, data) -> "CollectiveRecord":
        seq, size, root, op, dtype = cls._FORMAT.unpack(bytes(data))
        return cls(op.rstrip(b"\0").decode("ascii"), size, dtype.rstrip(b"\0").decode("ascii"), seq, root)

    def describe(self) -> str:
        if self.op == "barrier":
            call = "barrier()"
        elif self.root >= 0:
            call = f"{self.op}(size={self.size}, dtype={self.dtype}, root={self.root})"
        else:
            call = f"{self.op}(size={self.size}, dtype={self.dtype})"
        return f"{call} as collective #{self.seq}"


_HINT = (
    "Every rank must call the same collectives in the same order, with arrays of the same "
    "size and dtype; the usual cause is a rank that took a different path through the loop."
)


def describe_mismatch(records: Sequence[Optional[CollectiveRecord]]) -> Optional[str]:
    """Return ``None`` when every rank's record agrees, else a message naming each group of ranks.

    ``records[r]`` is rank ``r``'s record (``None``: rank ``r`` had not published one).
    """
    if all(r is not None for r in records) and len(set(records)) <= 1:
        return None
    groups: dict = {}
    for rank, record in enumerate(records):
        groups.setdefault(record, []).append(rank)
    lines = []
    for record, ranks in groups.items():
        who = ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))
        what = "had not called a collective" if record is None else "called " + record.describe()
        lines.append(f"  {who} {what}")
    return "collective mismatch: the ranks did not call the same collective:\n" + "\n".join(lines) + "\n" + _HINT


def check_records(records: Sequence[Optional[CollectiveRecord]]) -> None:
    """Raise :class:`EveryODistributedError` unless every rank called the same collective."""
    message = describe_mismatch(records)
    if message is not None:
        raise EveryODistributedError(message)


def prepare_array(array, op: str) -> np.ndarray:
    """A C-contiguous NumPy view/copy of ``array`` that a collective ``op`` accepts.

    Floats and integers are accepted; bool, complex and object arrays are not
    (there is no sensible float64 reduction for them). ``all_reduce_mean`` of an
    integer array is refused: returning it in the input dtype would truncate.
    """
    if not isinstance(array, np.ndarray):
        inner = getattr(array, "data", None)      # an everyo Tensor holds its array in .data
        array = inner if isinstance(inner, np.ndarray) else np.asarray(array)
    # (np.ascontiguousarray would turn a 0-d array into shape (1,).)
    data = array if array.flags.c_contiguous else np.ascontiguousarray(array)
    if not data.dtype.isnative:
        # Records compare dtype names, which ignore byte order: stage native bytes only.
        data = data.astype(data.dtype.newbyteorder("="))
    kind = data.dtype.kind
    if kind not in ("fiub" if op == "broadcast" else "fiu"):
        raise EveryODistributedError(
            f"{op}: dtype {data.dtype} is not supported; collectives take float or integer arrays"
        )
    if op == "all_reduce_mean" and kind != "f":
        raise EveryODistributedError(
            f"all_reduce_mean: integer dtype {data.dtype} would truncate the mean; "
            "call all_reduce_sum and divide, or cast to a float dtype first"
        )
    return data


def reduce_in_rank_order(slots: Sequence[np.ndarray], op: str, out: Optional[np.ndarray] = None,
                         block: int = 1 << 15) -> np.ndarray:
    """Sum (or average) ``slots[0] + slots[1] + ...`` in exactly that order, in float64.

    Every rank calls this on the same inputs in the same order, so every rank
    gets the same bits. Floats accumulate in float64 and are rounded once to
    the input dtype; integers accumulate in 64-bit integers (exact, NumPy's
    wrap-around on overflow). Work goes in cache-sized blocks so the float64
    scratch never leaves L2. ``out`` (optional) receives the result.

    Two shortcuts give the same bits for less work (the tests compare them
    with the plain float64 loop on edge cases):

    * two ranks, sum: one IEEE addition in the input dtype. Rounding the exact
      sum of two precision-p numbers first to float64 and then to precision p
      equals rounding it once whenever 53 >= 2p + 2 (Figueroa, "When is double
      rounding innocuous?", 1995): p = 11 (float16), 24 (float32); float64
      adds in float64 anyway. NumPy's float16 add rounds through float32
      (24 >= 2 * 11 + 2), which is innocuous too.
    * two ranks, mean of float32/float64: ``(a + b) * 0.5`` in the input
      dtype. If ``a + b`` is exact, the product rounds the exact half once. If
      it was rounded, ``|a + b| >= 2**(e_min + 1)`` (smaller sums are exact
      multiples of the smallest subnormal), so its half is
      normal and halving is exact and commutes with the rounding. The float64
      path rounds ``(a + b) / 2`` twice, which is innocuous as above. Only an
      overflow to inf (or inf/NaN inputs) can differ: then the whole array is
      recomputed in float64. Not used when ``out`` overlaps an input.
    * mean over a power-of-two number of ranks: multiply by ``1 / world_size``
      instead of dividing; both are the correctly rounded value of the same
      real number.
    """
    if op not in REDUCE_OPS:
        raise ValueError(f"unknown reduction {op!r}; expected one of {REDUCE_OPS}")
    first = slots[0]
    if out is None:
        out = np.empty(first.shape, first.dtype)
    n = first.size
    flat_out = out.reshape(-1)
    flats = [s.reshape(-1) for s in slots]
    world = len(flats)
    if world == 1:   # x -> float64 -> x is exact, and so is x / 1
        np.copyto(flat_out, flats[0])
        return out
    if first.dtype.kind == "f" and world == 2 and op == "sum":
        np.add(flats[0], flats[1], out=flat_out)
        return out
    if (first.dtype.kind == "f" and first.dtype.itemsize >= 4 and world == 2 and op == "mean"
            and not any(np.may_share_memory(flat_out, f) for f in flats)):
        np.add(flats[0], flats[1], out=flat_out)
        np.multiply(flat_out, 0.5, out=flat_out)
        if np.isfinite(flat_out).all():
            return out
        # an overflow, or inf/NaN inputs: recompute everything below in float64
    if first.dtype.kind == "f":
        acc_dtype = np.float64
    else:
        acc_dtype = np.uint64 if first.dtype.kind == "u" else np.int64
    power_of_two = world & (world - 1) == 0
    scratch = np.empty(min(block, max(n, 1)), acc_dtype)
    for start in range(0, n, block):
        stop = min(start + block, n)
        acc = scratch[: stop - start]
        np.add(flats[0][start:stop], flats[1][start:stop], out=acc, dtype=acc_dtype)
        for other in flats[2:]:
            np.add(acc, other[start:stop], out=acc, dtype=acc_dtype)
        if op == "mean":
            if power_of_two:
                np.multiply(acc, 1.0 / world, out=acc)
            else:
                np.divide(acc, float(world), out=acc)
        np.copyto(flat_out[start:stop], acc, casting="unsafe")
    return out


class ProcessGroup(abc.ABC):
    """A fixed set of ``world_size`` processes that run collectives together.

    Every collective is blocking and must be called by every rank, in the
    same order, with arrays of the same size and dtype; a mismatch raises
    :class:`~everyo.errors.EveryODistributedError` on every rank instead of
    hanging. Results are new arrays in the input's dtype and shape, identical
    bit for bit on every rank. Use as a context manager to ``close()``.
    """

    # Backends set these two in __init__.
    _rank: int
    _world_size: int

    @property
    def rank(self) -> int:
        """This process's index, ``0 <= rank < world_size``."""
        return self._rank

    @property
    def world_size(self) -> int:
        """How many processes are in the group."""
        return self._world_size

    def all_reduce_sum(self, array) -> np.ndarray:
        """Element-wise sum over ranks (float64 accumulation, ranks in order), in the input dtype."""
        return self._all_reduce(array, "all_reduce_sum", "sum")

    def all_reduce_mean(self, array) -> np.ndarray:
        """Element-wise mean over ranks, computed in float64 and rounded once to the input dtype."""
        return self._all_reduce(array, "all_reduce_mean", "mean")

    @abc.abstractmethod
    def _all_reduce(self, array, op_name: str, op: str) -> np.ndarray:
        """The backend's all-reduce: ``op_name`` is the public method, ``op`` one of REDUCE_OPS."""

    @abc.abstractmethod
    def barrier(self) -> None:
        """Return once every rank has called ``barrier()``."""

    @abc.abstractmethod
    def broadcast(self, array, root: int = 0) -> np.ndarray:
        """Return ``root``'s array on every rank (every rank passes an array of the same size and dtype)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release this rank's resources; idempotent."""

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()
        return False

    def __repr__(self):
        return f"{type(self).__name__}(rank={self.rank}, world_size={self.world_size})"
