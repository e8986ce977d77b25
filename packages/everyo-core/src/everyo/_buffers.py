"""Recycled result buffers for large op outputs and gradients (issue 24, item 2).

Why: a training step allocates the same megabyte-sized activations and
gradients every iteration, and EveryO drops them all together at the end of
the step (the graph frees its saved values, ``zero_grad`` the gradients). On
glibc, with its default (dynamic) thresholds, the top of the heap then holds
more free memory than the trim threshold (twice the largest array freed from
mmap so far, 4 MiB on the seed MLP), so ``free`` gives it back to the OS and
the next step faults every page in again: 3,650 minor page faults a step on
the seed MLP (12.5 MiB), against ~330 for the hand-written NumPy loop, whose
variables keep the previous step's arrays alive until each is replaced.
``eo.tune_allocator()`` hides this by raising the thresholds process-wide.

What: ops that produce a large float array (at least ``MIN_BYTES``) ask
:func:`empty` for it and compute into it (``out=``). The pool keeps every
array it handed out; one is reused for a new result of the same shape and
dtype only once nothing but the pool refers to it -- the graph has freed it,
no Tensor holds it, no view of it exists (a view refers to its base), no
user variable holds it. That is checked with the array's reference count, so
a buffer can never be handed out while anything in Python can still read it.
(Only a raw address taken from ``arr.ctypes.data`` or ``__array_interface__``
escapes the count, as it escapes NumPy's own memory management.)

Placement: a pooled float array starts on a page boundary (``PAGE`` bytes; a
view into a slightly larger byte array). Two arrays that malloc placed one
after the other start 16 bytes apart modulo 4 KiB (the chunk header after a
4 MiB array), and a loop that stores to one while it reads the other a few
elements ahead then stalls on every vector: the CPU takes the load to depend on
the earlier store whose address matches in its low 12 bits ("4K aliasing").
The GPT's GELU forward (read ``x``, write ``out`` and ``cdf``, made one after
the other) took 1.76 ms a call in the training step against 0.70 ms with the
three on page boundaries (everyo-kernels, same process, same data). Arrays of
the pool now all have the same low 12 bits, so a pass from one into another
reads and writes at the same offset.

Bounds: the pool is per thread; it holds at most ``MAX_FREE_BYTES`` of unused
arrays (the least recently used shapes go first), and :func:`clear` drops
every unused array now. Nothing process-wide changes: malloc keeps its
settings, and an array that is not EveryO's own is never touched.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

from everyo import _passes

__all__ = ["MIN_BYTES", "MAX_FREE_BYTES", "PAGE", "empty", "out_for", "copy_of", "clear", "stats", "suspended"]

# glibc's initial mmap threshold: smaller arrays come from the heap's bins, whose
# reuse malloc already does well.
MIN_BYTES = 128 * 1024
# Unused arrays kept at most (per thread): the tuned allocator kept up to 256 MiB.
MAX_FREE_BYTES = 256 * 1024 * 1024
# Where a pooled float array starts: a multiple of this many bytes (see the module doc).
PAGE = 4096

_local = threading.local()
_getrefcount = sys.getrefcount


class _Pool:
    __slots__ = ("arrays", "used", "bytes", "tick")

    def __init__(self) -> None:
        self.arrays: dict[tuple[Any, ...], list[np.ndarray]] = {}
        self.used: dict[tuple[Any, ...], int] = {}  # key -> tick of its last hand-out
        self.bytes = 0  # every pooled array, in use or not
        self.tick = 0


def _allocate(shape: tuple[int, ...], dtype: np.dtype, nbytes: int) -> np.ndarray:
    """A new C-contiguous array for the pool: a float array on a page boundary (a view
    into a byte array ``PAGE`` bytes longer: its ``.base``), any other a plain ``np.empty``."""
    if dtype.kind != "f":
        return np.empty(shape, dtype)
    raw = np.empty(nbytes + PAGE, np.uint8)
    start = -raw.__array_interface__["data"][0] % PAGE
    return raw[start : start + nbytes].view(dtype).reshape(shape)


def _unused(a: np.ndarray) -> bool:
    """Whether nothing but the pool's list refers to ``a`` or to the memory it views.

    A view of a pooled float array refers to the byte array, not to ``a`` (NumPy
    makes the array that owns the memory every view's base), so both are counted."""
    base = a.base
    if _getrefcount(a) != _UNREFERENCED:
        return False
    return base is None or _getrefcount(base) == _BASE_UNREFERENCED


def _free_index(arrays: list[np.ndarray]) -> int:
    """Index of an array nothing but ``arrays`` refers to, or -1."""
    for i in range(len(arrays)):
        if _unused(arrays[i]):
            return i
    return -1


def _calibrate() -> tuple[int, int]:
    # The counts _unused sees for an array only the list holds: measured the same
    # way here (a list's item passed to a function of the same form) rather than
    # assumed, so a different interpreter cannot make it wrong.
    probe = [_allocate((PAGE,), np.dtype(np.float32), 4 * PAGE)]
    for i in range(len(probe)):
        return _counts_as_unused_sees(probe[i])
    raise AssertionError("unreachable")


def _counts_as_unused_sees(a: np.ndarray) -> tuple[int, int]:
    base = a.base
    return _getrefcount(a), _getrefcount(base)


_UNREFERENCED, _BASE_UNREFERENCED = _calibrate()


def _pool() -> _Pool:
    pool = getattr(_local, "pool", None)
    if pool is None:
        pool = _local.pool = _Pool()
    return pool


def empty(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """An uninitialised C-contiguous array of ``shape`` and ``dtype``; a recycled one
    when an unreferenced pooled array of that shape and dtype exists.

    Small arrays (under ``MIN_BYTES``) are plain ``np.empty``. The caller must
    overwrite every element (it is used as an ``out=`` argument).
    """
    dtype = np.dtype(dtype)
    size = 1
    for n in shape:
        size *= n
    nbytes = size * dtype.itemsize
    if nbytes < MIN_BYTES or getattr(_local, "suspended", False):
        return np.empty(shape, dtype)
    pool = _pool()
    key = (shape, dtype)
    pool.tick += 1
    pool.used[key] = pool.tick
    arrays = pool.arrays.get(key)
    if arrays is None:
        arrays = pool.arrays[key] = []
    else:
        i = _free_index(arrays)
        if i >= 0:
            return arrays[i]
    out = _allocate(shape, dtype, nbytes)
    arrays.append(out)
    pool.bytes += nbytes
    if pool.bytes > MAX_FREE_BYTES:
        _shrink(pool, keep=key)
    return out


def out_for(*operands: Any, dtype: Any = None) -> np.ndarray | None:
    """A recycled buffer for the elementwise result of ``operands`` (an ``out=``
    argument; dtype: the result's, NumPy's by default), or None (a fresh array then).

    Only where every operand is an ndarray, the result has at least one axis and a
    floating dtype, and every full-size operand is C-contiguous: the array NumPy
    would allocate is then C-contiguous too, so later sums over it add in the same
    order and give the same bits."""
    if any(type(a) is not np.ndarray for a in operands):
        return None
    shape = np.broadcast_shapes(*(a.shape for a in operands))
    full = [a for a in operands if a.shape == shape]
    if not shape or not full or not all(a.flags.c_contiguous for a in full):
        return None
    dtype = np.result_type(*operands) if dtype is None else np.dtype(dtype)
    return empty(shape, dtype) if dtype.kind == "f" else None


def copy_of(a: np.ndarray, dtype: Any = None) -> np.ndarray:
    """``np.array(a, dtype, order="C")`` (a copy, cast unsafely as ``astype`` does)
    into a recycled buffer."""
    out = empty(a.shape, a.dtype if dtype is None else dtype)
    return _passes.run(_passes.copy, (a,), out)


@contextlib.contextmanager
def suspended() -> Iterator[None]:
    """No recycling in this thread inside the block: every result is a fresh ``np.empty``.

    For measurements that count allocations (tracemalloc sees a recycled buffer
    as no allocation at all); the arrays kept are the same either way."""
    before = getattr(_local, "suspended", False)
    _local.suspended = True
    try:
        yield
    finally:
        _local.suspended = before


def _shrink(pool: _Pool, keep: tuple[Any, ...]) -> None:
    """Drop unused arrays, least recently used shapes first, until the unused ones
    fit in MAX_FREE_BYTES (arrays in use are never dropped: they are not the pool's)."""
    free = stats()["free_bytes"]
    for key in sorted(pool.arrays, key=pool.used.__getitem__):
        if free <= MAX_FREE_BYTES:
            break
        if key == keep:
            continue
        arrays = pool.arrays[key]
        kept = []
        for i in range(len(arrays)):
            if free > MAX_FREE_BYTES and _unused(arrays[i]):
                free -= arrays[i].nbytes
                pool.bytes -= arrays[i].nbytes
            else:
                kept.append(arrays[i])
        if kept:
            pool.arrays[key] = kept
        else:
            del pool.arrays[key], pool.used[key]


def clear() -> None:
    """Drop every unused pooled array of the calling thread (arrays in use stay valid)."""
    pool = _pool()
    for key in list(pool.arrays):
        arrays = pool.arrays[key]
        kept = [arrays[i] for i in range(len(arrays)) if not _unused(arrays[i])]
        pool.bytes -= sum(a.nbytes for a in arrays) - sum(a.nbytes for a in kept)
        if kept:
            pool.arrays[key] = kept
        else:
            del pool.arrays[key], pool.used[key]


def stats() -> dict[str, int]:
    """Pooled arrays of the calling thread: ``arrays``, ``bytes``, ``free_bytes``."""
    pool = _pool()
    free = 0
    count = 0
    for arrays in pool.arrays.values():
        for i in range(len(arrays)):
            count += 1
            if _unused(arrays[i]):
                free += arrays[i].nbytes
    return {"arrays": count, "bytes": pool.bytes, "free_bytes": free}
