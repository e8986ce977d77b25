"""The process-group interface every backend implements, and the collective protocol they share.

A backend (``sharedmem/``, ``tcp/``, ``mpi.py``) subclasses :class:`ProcessGroup`,
which owns everything that is the same whatever moves the bytes: argument
checks, the dtype policy, the per-call bookkeeping (sequence counter, the
broken state after a failed collective, the closed state), the block split
and the error hint. A backend implements only the data movement
(``_all_reduce``, ``_broadcast``, ``_all_gather``, ``_reduce_scatter``,
``_barrier``, ``_close``). Shared pieces:

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
* :func:`split_blocks` -- which contiguous block of elements (or rows) each
  rank owns in a split reduction or a reduce-scatter.

bfloat16 (``ml_dtypes.bfloat16``, NumPy kind ``'V'``) is handled like the
other floats, by name, without importing ml_dtypes: it widens exactly to
float64 and the float64 result is rounded once (ml_dtypes' cast, round to
nearest even).
"""

from __future__ import annotations

import abc
import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import numpy as np

from everyo.errors import EveryODistributedError

if TYPE_CHECKING:
    from collections.abc import Callable

    from typing_extensions import Self

    from everyo._typing import TensorLike

__all__ = [
    "ProcessGroup",
    "CollectiveRecord",
    "describe_mismatch",
    "check_records",
    "prepare_array",
    "reduce_in_rank_order",
    "split_blocks",
    "shape_text",
    "is_float_dtype",
    "HINT",
    "REDUCE_OPS",
    "PeerFailedError",
    "is_consequence",
]

REDUCE_OPS = ("sum", "mean")


class _RecordFields(NamedTuple):
    op: str
    size: int
    dtype: str
    seq: int
    root: int = -1
    shape: str = ""


_SHAPE_BYTES = 32


def shape_text(shape: tuple[int, ...]) -> str:
    """``(2, 6)`` -> ``'2,6'`` (``''`` for 0-d); a shape too long for a record becomes a digest."""
    text = ",".join(map(str, shape))
    if len(text) <= _SHAPE_BYTES:
        return text
    import hashlib

    return "#" + hashlib.blake2b(text.encode("ascii"), digest_size=15).hexdigest()


class CollectiveRecord(_RecordFields):
    """What one rank is calling: compared across ranks before any data moves.

    ``op`` is the public method name (``'all_reduce_mean'``, ``'broadcast'``,
    ``'barrier'``...), ``size`` the element count, ``dtype`` NumPy's name,
    ``seq`` how many collectives this rank has called before on this group,
    ``root`` the broadcast root (``-1`` when the op has none), ``shape`` the
    array's shape as text (``'2,6'``; see :func:`shape_text`), so that arrays
    of the same size but different shapes are told apart.
    """

    # The fields are _RecordFields' (a NamedTuple cannot hold the class
    # attributes below for type checkers); no per-instance __dict__.
    __slots__ = ()

    # Fixed 64-byte little-endian layout so a backend can put a record in a
    # shared-memory slot or on a socket without pickle.
    _FORMAT = struct.Struct(f"<qqq24s16s{_SHAPE_BYTES}s")
    PACKED_SIZE = _FORMAT.size

    def pack(self) -> bytes:
        return self._FORMAT.pack(
            self.seq,
            self.size,
            self.root,
            self.op.encode("ascii"),
            self.dtype.encode("ascii"),
            self.shape.encode("ascii"),
        )

    @classmethod
    def unpack(cls, data: bytes | bytearray | memoryview) -> CollectiveRecord:
        seq, size, root, op, dtype, shape = cls._FORMAT.unpack(bytes(data))
        return cls(
            op.rstrip(b"\0").decode("ascii"),
            size,
            dtype.rstrip(b"\0").decode("ascii"),
            seq,
            root,
            shape.rstrip(b"\0").decode("ascii", errors="replace"),
        )

    def describe(self) -> str:
        if self.op == "barrier":
            call = "barrier()"
        else:
            shape = ""
            if self.shape != str(self.size):  # a 1-d array's shape says no more than its size
                shape = f", shape={_shape_repr(self.shape)}"
            root = f", root={self.root}" if self.root >= 0 else ""
            call = f"{self.op}(size={self.size}{shape}, dtype={self.dtype}{root})"
        return f"{call} as collective #{self.seq}"


def _shape_repr(text: str) -> str:
    if text.startswith("#"):
        return f"<{text[1:9]}...>"  # a digest: shapes too long to carry whole
    dims = text.split(",") if text else []
    return "(" + ", ".join(dims) + ("," if len(dims) == 1 else "") + ")"


HINT = (
    "Every rank must call the same collectives in the same order, with arrays of the same "
    "shape and dtype; the usual cause is a rank that took a different path through the loop."
)


def describe_mismatch(records: Sequence[CollectiveRecord | None]) -> str | None:
    """Return ``None`` when every rank's record agrees, else a message naming each group of ranks.

    ``records[r]`` is rank ``r``'s record (``None``: rank ``r`` had not published one).
    """
    if all(r is not None for r in records) and len(set(records)) <= 1:
        return None
    groups: dict[CollectiveRecord | None, list[int]] = {}
    for rank, record in enumerate(records):
        groups.setdefault(record, []).append(rank)
    lines = []
    for record, ranks in groups.items():
        who = ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))
        what = "had not called a collective" if record is None else "called " + record.describe()
        lines.append(f"  {who} {what}")
    return "collective mismatch: the ranks did not call the same collective:\n" + "\n".join(lines) + "\n" + HINT


def check_records(records: Sequence[CollectiveRecord | None]) -> None:
    """Raise :class:`EveryODistributedError` unless every rank called the same collective."""
    message = describe_mismatch(records)
    if message is not None:
        raise EveryODistributedError(message)


class PeerFailedError(EveryODistributedError):
    """Raised on a rank because another rank failed first: a consequence, not a cause.

    ``failed_rank`` is the rank this rank saw fail (``-1`` when unknown). The
    launchers (``spawn``, ``python -m everyo.distributed.run``) report the
    first failure that is not a consequence as the root cause, and list these
    after it.
    """

    def __init__(self, message: str, failed_rank: int = -1) -> None:
        super().__init__(message)
        self.failed_rank = failed_rank

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.failed_rank))


def is_consequence(exc: BaseException | None) -> bool:
    """Whether ``exc`` is, or was raised while handling or because of, a :class:`PeerFailedError`.

    Walks ``__cause__`` and ``__context__``, so user code that wraps the
    error (``raise RuntimeError("step failed") from e``) is still recognised
    as a consequence of the peer's failure.
    """
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, PeerFailedError):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ if exc.__cause__ is not None else exc.__context__
    return False


_MOVE_ONLY = ("broadcast", "all_gather")  # no arithmetic: bool is fine


def is_float_dtype(dtype: np.dtype[Any]) -> bool:
    """Whether a collective treats ``dtype`` as a float: NumPy's floats, and bfloat16 by name."""
    return dtype.kind == "f" or (dtype.kind == "V" and dtype.name == "bfloat16")


def split_blocks(n: int, world_size: int) -> list[tuple[int, int]]:
    """``[(lo, hi), ...]``: rank ``r`` owns ``range(lo, hi)`` of ``n`` items; contiguous, in
    rank order, lengths differing by at most one (the first ``n % world_size`` get one more).

    Examples:
        >>> from everyo.distributed.protocol import split_blocks
        >>> split_blocks(10, 3)
        [(0, 4), (4, 7), (7, 10)]
    """
    base, extra = divmod(n, world_size)
    starts = [r * base + min(r, extra) for r in range(world_size + 1)]
    return [(starts[r], starts[r + 1]) for r in range(world_size)]


def prepare_array(array: TensorLike, op: str) -> np.ndarray:
    """A C-contiguous NumPy view/copy of ``array`` that a collective ``op`` accepts.

    Floats (bfloat16 included) and integers are accepted; bool only by the
    collectives that move data without arithmetic (``broadcast``,
    ``all_gather``); complex and object arrays never (there is no sensible
    float64 reduction for them). A mean of an integer array is refused:
    returning it in the input dtype would truncate.
    """
    if not isinstance(array, np.ndarray):
        inner = getattr(array, "data", None)  # an everyo Tensor holds its array in .data
        array = inner if isinstance(inner, np.ndarray) else np.asarray(array)
    # (np.ascontiguousarray would turn a 0-d array into shape (1,).)
    data = array if array.flags.c_contiguous else np.ascontiguousarray(array)
    if not data.dtype.isnative:
        # Records compare dtype names, which ignore byte order: stage native bytes only.
        data = data.astype(data.dtype.newbyteorder("="))
    kind = "f" if is_float_dtype(data.dtype) else data.dtype.kind
    if kind not in ("fiub" if op in _MOVE_ONLY else "fiu"):
        raise EveryODistributedError(
            f"{op}: dtype {data.dtype} is not supported; collectives take float (float16, bfloat16, "
            "float32, float64) or integer arrays"
            + (" (and bool for broadcast and all_gather)" if op not in _MOVE_ONLY else "")
        )
    if op.endswith("_mean") and kind != "f":
        raise EveryODistributedError(
            f"{op}: integer dtype {data.dtype} would truncate the mean; "
            f"call {op[:-5]}_sum and divide, or cast to a float dtype first"
        )
    return data


def _halved_sum(a: np.ndarray, b: np.ndarray, out: np.ndarray, block: int) -> bool:
    """``out = (a + b) * 0.5`` in the input dtype, in cache-sized blocks (the
    halving reads what the add just wrote); False when an overflow or
    ``inf - inf`` raised its IEEE flag, which NumPy checks after each loop:
    cheaper than a finiteness pass."""
    try:
        with np.errstate(over="raise", invalid="raise"):
            for start in range(0, out.size, block):
                part = out[start : start + block]
                np.add(a[start : start + block], b[start : start + block], out=part)
                np.multiply(part, 0.5, out=part)
    except FloatingPointError:
        return False
    return True


def reduce_in_rank_order(
    slots: Sequence[np.ndarray], op: str, out: np.ndarray | None = None, block: int = 1 << 16
) -> np.ndarray:
    """Sum (or average) ``slots[0] + slots[1] + ...`` in exactly that order, in float64.

    Every rank calls this on the same inputs in the same order, so every rank
    gets the same bits. Floats accumulate in float64 and are rounded once to
    the input dtype; integers accumulate in 64-bit integers (exact, NumPy's
    wrap-around on overflow). Work goes in cache-sized blocks of ``block``
    elements (the float64 scratch, and the two-rank mean's halving, stay in
    L2; 64K measured ~10% faster than 32K for that mean and the same for the
    float64 path). ``out`` (optional) receives the result.

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
      overflow to inf in ``a + b`` can differ (the float64 half may be
      finite); it raises the IEEE overflow flag, as ``inf - inf`` raises the
      invalid flag, and then the whole array is recomputed in float64. An inf
      or NaN input otherwise propagates as it does in float64. Not used when
      ``out`` overlaps an input.
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
    if world == 1:  # x -> float64 -> x is exact, and so is x / 1
        np.copyto(flat_out, flats[0])
        return out
    floating = is_float_dtype(first.dtype)
    native = first.dtype.kind == "f"  # bfloat16 always takes the float64 path below
    if native and world == 2 and op == "sum":
        np.add(flats[0], flats[1], out=flat_out)
        return out
    if (
        native
        and first.dtype.itemsize >= 4
        and world == 2
        and op == "mean"
        and not any(np.may_share_memory(flat_out, f) for f in flats)
    ):
        if _halved_sum(flats[0], flats[1], flat_out, block):
            return out
        # an overflow, or inf - inf: recompute everything below in float64
    acc_dtype: type[np.generic]
    if floating:
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
    hanging. Results are new arrays in the input's dtype, identical bit for
    bit on every rank. After a collective failed on a rank (a mismatch, a lost
    peer, a timeout) that rank's group refuses further calls, naming the first
    failure. Use as a context manager to ``close()``.

    Collectives: ``all_reduce_sum``, ``all_reduce_mean``, ``broadcast``,
    ``all_gather``, ``reduce_scatter_sum``, ``reduce_scatter_mean``, ``barrier``.

    Backends call ``super().__init__(rank, world_size)`` and implement the
    data movement only: ``_all_reduce(record, data, op)``,
    ``_broadcast(record, data, root)``, ``_all_gather(record, data)`` (returns
    ``(world_size, data.size)``), ``_reduce_scatter(record, data, op, blocks)``
    (returns this rank's reduced elements ``blocks[rank]`` of the flat array),
    ``_barrier(record)`` and ``_close()``. ``data`` is C-contiguous and native.
    """

    def __init__(self, rank: int, world_size: int) -> None:
        self._rank, self._world_size = rank, world_size
        self._seq = 0  # collectives called so far: the record's sequence number
        self._broken: str | None = None  # the first failure's message, once a collective failed
        self._broken_by_peer: int | None = None  # the failed peer, when that failure was a consequence
        self._closed = False

    @property
    def rank(self) -> int:
        """This process's index, ``0 <= rank < world_size``."""
        return self._rank

    @property
    def world_size(self) -> int:
        """How many processes are in the group."""
        return self._world_size

    # -- the public collectives (argument checks, then the backend) ---------------------------
    def all_reduce_sum(self, array: TensorLike) -> np.ndarray:
        """Element-wise sum over ranks (float64 accumulation, ranks in order), in the input dtype."""
        data = prepare_array(array, "all_reduce_sum")
        return self._call(self._all_reduce, "all_reduce_sum", data, -1, "sum").reshape(data.shape)

    def all_reduce_mean(self, array: TensorLike) -> np.ndarray:
        """Element-wise mean over ranks, computed in float64 and rounded once to the input dtype."""
        data = prepare_array(array, "all_reduce_mean")
        return self._call(self._all_reduce, "all_reduce_mean", data, -1, "mean").reshape(data.shape)

    def broadcast(self, array: TensorLike, root: int = 0) -> np.ndarray:
        """Return ``root``'s array on every rank (every rank passes an array of the same size and dtype)."""
        self._check_root("broadcast", root)
        data = prepare_array(array, "broadcast")
        return self._call(self._broadcast, "broadcast", data, root, root).reshape(data.shape)

    def all_gather(self, array: TensorLike) -> np.ndarray:
        """Every rank's array, stacked in rank order: shape ``(world_size, *array.shape)``.

        Every rank passes an array of the same size and dtype.

        Example (needs a running process group, so not run as a doctest)::

            group.all_gather(np.array([group.rank]))   # array([[0], [1]]) on two ranks
        """
        data = prepare_array(array, "all_gather")
        out = self._call(self._all_gather, "all_gather", data, -1)
        return out.reshape((self._world_size,) + data.shape)

    def reduce_scatter_sum(self, array: TensorLike) -> np.ndarray:
        """The sum over ranks of ``array`` (as ``all_reduce_sum``), but only this rank's rows.

        The rows (first axis) are split in rank order into blocks whose
        lengths differ by at most one (:func:`split_blocks`); rank ``r`` gets
        block ``r`` -- the same bits ``all_reduce_sum(array)[lo:hi]`` gives.

        Shape:
            array: ``(n, *rest)`` on every rank; result: ``(hi - lo, *rest)``.
        """
        return self._reduce_scatter_call(array, "reduce_scatter_sum", "sum")

    def reduce_scatter_mean(self, array: TensorLike) -> np.ndarray:
        """As :meth:`reduce_scatter_sum`, with the mean (float64, rounded once)."""
        return self._reduce_scatter_call(array, "reduce_scatter_mean", "mean")

    def barrier(self) -> None:
        """Return once every rank has called ``barrier()``."""
        self._call(self._barrier_call, "barrier", None, -1)

    def close(self) -> None:
        """Release this rank's resources; idempotent."""
        if not self._closed:
            self._closed = True
            self._close()

    # -- bookkeeping shared by every backend ----------------------------------------------------
    def _check_root(self, op: str, root: object) -> None:
        if not isinstance(root, (int, np.integer)) or isinstance(root, bool) or not 0 <= root < self._world_size:
            raise EveryODistributedError(
                f"{op}: root {root!r} is not a rank of this group (world_size {self._world_size})"
            )

    def _reduce_scatter_call(self, array: TensorLike, op_name: str, op: str) -> np.ndarray:
        data = prepare_array(array, op_name)
        if data.ndim == 0:
            raise EveryODistributedError(
                f"{op_name}: a 0-d array has no rows to scatter; pass an array of rank >= 1 "
                "(its first axis is split across the ranks)"
            )
        row = data.size // data.shape[0] if data.shape[0] else 0
        rows = split_blocks(data.shape[0], self._world_size)
        blocks = [(lo * row, hi * row) for lo, hi in rows]
        lo, hi = rows[self._rank]
        out = self._call(self._reduce_scatter, op_name, data, -1, op, blocks)
        return out.reshape((hi - lo,) + data.shape[1:])

    def _barrier_call(self, record: CollectiveRecord, _data: None) -> None:
        return self._barrier(record)

    def _call(self, body: Callable[..., Any], op: str, data: np.ndarray | None, root: int, *args: Any) -> Any:
        """Check the group is usable, number the call, run the backend; a failure breaks the group."""
        if self._broken is not None:
            message = f"rank {self._rank}: the group is unusable after an earlier failure: {self._broken}"
            if self._broken_by_peer is not None:
                raise PeerFailedError(message, self._broken_by_peer)
            raise EveryODistributedError(message)
        if self._closed:
            raise EveryODistributedError(f"rank {self._rank}: {op} on a closed group")
        refusal = self._refuse(op, data)
        if refusal is not None:  # refused locally, before any communication: the group stays usable
            raise EveryODistributedError(refusal)
        if data is None:
            record = CollectiveRecord(op, 0, "none", self._seq, root)
        else:
            record = CollectiveRecord(op, data.size, _dtype_name(data.dtype), self._seq, root, _shape(data.shape))
        self._seq += 1
        try:
            return body(record, data, *args)
        except BaseException as exc:
            self._broken = f"{type(exc).__name__}: {exc}"
            if is_consequence(exc):
                self._broken_by_peer = getattr(exc, "failed_rank", -1)
            raise

    # -- what a backend implements ---------------------------------------------------------------
    def _refuse(self, op: str, data: np.ndarray | None) -> str | None:
        """Why this backend cannot run ``op`` on ``data`` (checked on every rank alike), or None."""
        return None

    @abc.abstractmethod
    def _all_reduce(self, record: CollectiveRecord, data: np.ndarray, op: str) -> np.ndarray:
        """The reduced flat array (``op`` is one of REDUCE_OPS)."""

    @abc.abstractmethod
    def _broadcast(self, record: CollectiveRecord, data: np.ndarray, root: int) -> np.ndarray:
        """A new array holding ``root``'s data."""

    @abc.abstractmethod
    def _all_gather(self, record: CollectiveRecord, data: np.ndarray) -> np.ndarray:
        """A new ``(world_size, data.size)`` array, row ``r`` holding rank ``r``'s data."""

    @abc.abstractmethod
    def _reduce_scatter(
        self, record: CollectiveRecord, data: np.ndarray, op: str, blocks: Sequence[tuple[int, int]]
    ) -> np.ndarray:
        """This rank's block ``blocks[rank]`` (flat element range) of the reduction, as a new array."""

    @abc.abstractmethod
    def _barrier(self, record: CollectiveRecord) -> None:
        """Return once every rank has reached this barrier."""

    @abc.abstractmethod
    def _close(self) -> None:
        """Release the backend's resources (called once)."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> Literal[False]:
        self.close()
        return False

    def __repr__(self) -> str:
        return f"{type(self).__name__}(rank={self.rank}, world_size={self.world_size})"


_DTYPE_NAMES: dict[np.dtype[Any], str] = {}
_SHAPES: dict[tuple[int, ...], str] = {}


def _shape(shape: tuple[int, ...]) -> str:
    # Training calls the same few shapes every step: remember their text.
    text = _SHAPES.get(shape)
    if text is None:
        if len(_SHAPES) > 4096:
            _SHAPES.clear()
        text = _SHAPES[shape] = shape_text(shape)
    return text


def _dtype_name(dtype: np.dtype[Any]) -> str:
    # numpy's dtype.name is computed on every access (~1 us); collectives are latency-bound.
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = dtype.name
    return name
