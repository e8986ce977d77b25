"""One OpenBLAS thread's bits for every matrix product (issue 24, item 3).

OpenBLAS splits a product over its threads once ``m * n * k`` passes about 262,144,
and its workers spin-wait for the next call. Two things follow on a 2-core machine:

- On a busy machine (other processes on the cores), a worker is often not running
  when its part is due, and the calling thread waits for it whole scheduler slices:
  a (128, 4096) @ (4096, 128) product (the seed MLP's weight gradient) took 9-168 ms
  on two threads beside CPU-bound processes against 1-2 ms quiet, and the MLP step
  swung between ~25 and ~240 ms from one process to the next
  (``benchmarks/bench_busy_threads.py``). One thread does not stall that way.
- One thread and two give many products other bits. OpenBLAS's kernels make a call's
  rows a tile at a time from its first row (24 rows on the Haswell kernels of an AMD
  EPYC), and its two threads cut the rows at the middle, on no such multiple: 39 of the
  40 large products of the benchmarks' five workloads differ there. The bits of a
  result must not depend on how busy the machine was, so a busy machine could not
  simply take one thread.

So where OpenBLAS has two threads (a 2-core machine, as OpenBLAS sets itself), every
product here has **one OpenBLAS thread's bits**, whatever the machine's load:
:func:`matmul` holds one OpenBLAS thread around each product OpenBLAS would split.
Where the machine is quiet and everyo-kernels is installed, a large 2-D product
(``SMALL_MNK`` and up) runs as two row parts on everyo-kernels' pair of threads, each
on one OpenBLAS thread, cut where the parts were found to give the whole one-thread
product's bits (everyo-kernels' ``pair`` module: a multiple of the kernels' row tile;
checked once per shape), so the second core still helps. Where no such cut is found,
or the machine is busy (:func:`machine_busy`), or without everyo-kernels, the product
runs whole on one thread. A program that sets one BLAS thread itself (a ``spawn``
worker, ``threadpool_limits(1)``) gets the same bits, so a data-parallel worker's
products match a one-process run's on two threads.

With more than two OpenBLAS threads (a larger machine) one thread would give up
cores the pair cannot make up for, so a large product runs on OpenBLAS's threads,
with their bits; on a busy machine it moves to one thread only where a check found
the bits the same (:func:`_alone_same`: once per dtype, shape, layouts and thread
count, with random operands, at the shape's first large product), so there too the
bits do not depend on the load. Small products (below ``SMALL_MNK``) take one thread
on any machine.

How: ``openblas_set_num_threads`` of the OpenBLAS that NumPy loaded (found on first
use through /proc/self/maps, never at import; the calls threadpoolctl makes), set to
1 around the product and restored to the count read just before, so the setting is
back as it was when the product returns (a count of 1 is left alone: nothing is
called). OpenBLAS keeps one count for the whole process (its
``openblas_set_num_threads_local`` sets that same global count), so EveryO counts
the holds of all its threads together and the last to end restores the count
(:func:`_set_one`); a count another thread sets while a hold is in force is
overwritten when it ends, so set thread limits around EveryO's calls, not beside
them. The few calls EveryO leaves on OpenBLAS's threads (einsum's contractions,
LAPACK's QR for orthogonal initialisation: :func:`wide`) and its holds exclude each
other across threads (any number of holds at once, or any number of such calls,
never both; see :func:`_enter`), so a hold never gives such a call one thread midway.
A product of the user's own NumPy code in another thread is not covered: it runs on
the count in force when it starts, and on a 2-core machine may then run on one
thread, with one thread's bits. Where OpenBLAS is not found (another BLAS, another
OS) :func:`matmul` is ``np.matmul`` and NumPy runs as configured.

Up to the fifth stop of issue 24 that was the rule on two threads as well; on the AMD
EPYC the check almost never found the same bits, which is why item 3 was missed there.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

import numpy as np

from everyo import kernel_table

__all__ = [
    "openblas_spinning",
    "openblas_wakes",
    "SMALL_MNK",
    "OPENBLAS_SINGLE",
    "machine_busy",
    "matmul",
    "threads_for",
    "single_thread",
    "wide",
]

# From here a 2-D product may run as two row parts on everyo-kernels' pair (about 0.2 ms of
# single-thread float32 work on the development machine; below it, a hand-off costs more than
# it saves).
SMALL_MNK = 1 << 23
# OpenBLAS's own rule (interface/gemm.c: 65536 * GEMM_MULTITHREAD_THRESHOLD 4): at or below it,
# one thread already, so no call is needed.
OPENBLAS_SINGLE = 65536 * 4

_threads: Any = None  # (get, set) once found; False when there is none
_hold_lock = threading.Lock()
_held = 0  # holds of one thread now in force (all of this process's threads)
_saved = 1  # the count the first of them found, restored when the last ends
_hold_pid = os.getpid()  # the process the holds belong to (a fork child starts afresh)

BUSY_CHECK_S = 0.1
# How long OpenBLAS's workers spin after a product they split (2^28 cycles by default:
# `python benchmarks/harness.py --gap` found a core still taken at 0.05 s, none from 0.2 s).
WIDE_SPIN_S = 0.2
_spin_until = 0.0  # time.monotonic() until which a product on OpenBLAS's threads may still spin
_wakes = 0  # products run on OpenBLAS's threads so far (openblas_wakes)
_CORES = os.cpu_count() or 1
_busy = False
_checked = -1.0
_runnable = 0.0


def _find() -> Any:
    """(get, set) of the thread count of the OpenBLAS in this process, or False."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split(None, 5)[-1].strip() for line in maps if "openblas" in line.lower()}
    except OSError:
        return False
    for path in sorted(p for p in paths if p.startswith("/")):
        try:
            # PyDLL: its calls keep the GIL. A CDLL call lets go of it and takes it back, and
            # where another thread has taken it meanwhile (everyo-kernels' pair worker starting
            # its half), this thread sleeps until it is let go again (~10 us); the count is
            # read and set around every split product.
            lib = ctypes.PyDLL(path)
        except OSError:
            continue
        # NumPy's wheels bundle scipy-openblas, whose symbols carry a prefix and a suffix.
        for prefix, suffix in (("", ""), ("scipy_", "64_"), ("scipy_", ""), ("", "64_")):
            get = getattr(lib, f"{prefix}openblas_get_num_threads{suffix}", None)
            put = getattr(lib, f"{prefix}openblas_set_num_threads{suffix}", None)
            if get is not None and put is not None:
                get.restype, put.argtypes, put.restype = ctypes.c_int, [ctypes.c_int], None
                return get, put
    return False


def _setters() -> Any:
    """OpenBLAS's (get, set) of its thread count, found at the first call; False where there is none."""
    global _threads
    if _threads is None:
        _threads = _find()
    return _threads


def _read_runnable() -> int | None:
    """Threads runnable on the machine right now (Linux), or None."""
    try:
        with open("/proc/loadavg", "rb") as f:
            return int(f.read().split()[3].split(b"/")[0])
    except (OSError, ValueError, IndexError):
        return None


def machine_busy() -> bool:
    """Whether more threads want to run than this machine has cores, now.

    Read from the kernel's count of runnable threads (the fourth field of
    /proc/loadavg: an instant count, not the 1-minute average), at most every
    ``BUSY_CHECK_S`` seconds and smoothed over a few readings. Busy when they
    exceed the cores by more than this process's own two (the caller and one
    BLAS worker); once busy, until they no longer exceed the cores (without
    that margin, going down to one thread would end "busy" at once)."""
    global _busy, _checked, _runnable
    now = time.monotonic()
    if now - _checked < BUSY_CHECK_S:
        return _busy
    _checked = now
    running = _read_runnable()
    if running is None:
        return False
    _runnable = 0.5 * _runnable + 0.5 * running
    _busy = _runnable > _CORES + (0 if _busy else 1)
    return _busy


# --- holds and products on OpenBLAS's threads exclude each other across threads ----------
ONE, WIDE = 1, 2  # the two sides: holds of one thread; products on OpenBLAS's threads
_switch_lock = threading.Lock()
_switch = threading.Condition(_switch_lock)
_side = 0  # the side inside now (0: none)
_inside = 0  # threads inside on that side (a thread's nested entries count once)
_waiting = [0, 0, 0]  # threads waiting to enter, by side
_last = 0  # the side of the last group to leave: when both sides wait, the other goes first
_generation = 0  # counts _after_fork's fresh starts: entries of an older one are not counted
_mine = threading.local()  # this thread's generation and nesting depth


def _enter(side: int) -> None:
    """Enter ``side`` (``ONE`` or ``WIDE``): wait while threads are inside on the other
    side, or while threads wait for the other side and this side had its turn (so that
    neither side can keep the other out for ever: a thread taking holds in a loop lets a
    waiting product in); end with :func:`_leave`. A thread already inside (either side)
    enters again at once: a product nested in a hold of its own thread runs on one
    thread, as it always did."""
    global _side, _inside
    if (_inside or _waiting[ONE] or _waiting[WIDE]) and _hold_pid != os.getpid():
        _after_fork()  # a fork child: the threads inside or waiting were the parent's
    mine = _mine.__dict__
    if mine.get("generation") == _generation and mine["depth"]:
        mine["depth"] += 1
        return
    other = 3 - side
    with _switch_lock:
        # wait: the other side inside, or waiting (while this side is in, or had its turn)
        if (_side != side or _waiting[other]) if _inside else (_waiting[other] and _last == side):
            _waiting[side] += 1
            try:
                while (_side != side or _waiting[other]) if _inside else (_waiting[other] and _last == side):
                    _switch.wait()
            finally:
                _waiting[side] -= 1
        _side = side
        _inside += 1
    mine["generation"], mine["depth"] = _generation, 1


def _leave() -> None:
    """End an :func:`_enter` of this thread; the last thread out lets the other side in."""
    global _side, _inside, _last
    mine = _mine.__dict__
    if mine.get("generation") != _generation or not mine["depth"]:
        return  # entered before a fork: the child started afresh (_after_fork)
    mine["depth"] -= 1
    if mine["depth"]:
        return
    with _switch_lock:
        _inside -= 1
        if not _inside:
            _side, _last = 0, _side
            if _waiting[ONE] or _waiting[WIDE]:
                _switch.notify_all()


def _woke() -> None:
    """Note that a product just ran on OpenBLAS's threads (see :func:`openblas_spinning`)."""
    global _spin_until, _wakes
    _spin_until = time.monotonic() + WIDE_SPIN_S
    _wakes += 1


def openblas_spinning() -> bool:
    """Whether a product through this module ran on OpenBLAS's threads less than
    ``WIDE_SPIN_S`` ago, so that OpenBLAS's worker may still be spinning on a core
    (everyo-kernels' pair then leaves that core to it: a thread of its own beside the
    spinning worker made a CNN step twice as slow, measured)."""
    return time.monotonic() < _spin_until


def openblas_wakes() -> int:
    """How many products through this module have run on OpenBLAS's threads in this
    process (each one may leave its worker spinning: :func:`openblas_spinning`). The
    pair of everyo-kernels compares counts to tell its own check's product from the
    program's own products on those threads."""
    return _wakes


@contextlib.contextmanager
def wide(mnk: int) -> Iterator[None]:
    """Run the block, which makes products of ``mnk`` (``m * n * k``) each on the
    threads OpenBLAS has now, outside any other thread's hold of one thread (which
    would give them one thread and, for some shapes, other bits): it waits for those
    holds to end, and holds wait for it. Nothing is done for products OpenBLAS runs
    on one thread anyway (below ``OPENBLAS_SINGLE``) or where OpenBLAS is not found."""
    if mnk < OPENBLAS_SINGLE or not _setters():
        yield
        return
    _enter(WIDE)
    try:
        yield
    finally:
        _woke()
        _leave()


def _split_product(x: np.ndarray, y: np.ndarray, out: np.ndarray | None) -> tuple[bool, np.ndarray | None]:
    """Offer the large 2-D product ``x @ y`` to everyo-kernels' ``split_matmul`` (two
    halves on its pair of threads, each on one BLAS thread, only where they have the
    bits of the whole product: everyo.kernels.pair). Returns (True, the result) when
    the halves made it; else (False, the array to pass as ``out`` to ``np.matmul``:
    the caller's ``out``, or the one made here for the offer, the same C-contiguous
    array ``np.matmul`` would make; None where nothing was offered)."""
    split = kernel_table.get("split_matmul")
    if split is None:
        return False, out
    if out is None:
        if x.dtype != y.dtype or x.dtype not in kernel_table.FLOAT_DTYPES:
            return False, None
        out = np.empty((x.shape[0], y.shape[1]), x.dtype)
    return bool(split(x, y, out)), out


def _set_one() -> bool:
    """Hold one OpenBLAS thread: True when a hold was taken (end it with
    :func:`_restore`), False where OpenBLAS has one thread already or none was found.

    OpenBLAS's count is one number for the whole process, so the holds of all of
    EveryO's threads are counted together: the first sets 1 and remembers the count it
    found, the last to end restores it. (Without the count, one thread's restore
    gave 2 threads back while another thread's split product or scan still ran on
    what it took for one: bits other than those its check found.) A count of 1 set
    from outside (a ``spawn`` worker's, ``threadpool_limits(1)``) is left alone."""
    global _held, _saved
    if _hold_pid != os.getpid():
        _after_fork()
    setters = _setters()
    if not setters:
        return False
    _enter(ONE)  # after any product of another thread on OpenBLAS's threads has ended
    with _hold_lock:
        if _held:
            _held += 1
            return True
        get, put = setters
        previous = get()
        if previous > 1:
            put(1)
            _held, _saved = 1, previous
            return True
    _leave()
    return False


MAX_CHECKED = 64  # products _alone_same checks per process; later new ones keep BLAS's threads when busy
_alone: dict[tuple, bool] = {}


def _layout(a: np.ndarray) -> str:
    """How NumPy hands a matrix (the last two axes) to BLAS: rows contiguous ("C",
    no transpose) or columns ("F", transposed); other strides as "C"."""
    step = a.itemsize
    if a.strides[-1] == step or a.shape[-1] == 1:
        return "C"
    return "F" if a.strides[-2] == step or a.shape[-2] == 1 else "C"


def _alone_same(dtype: np.dtype, m: int, k: int, n: int, x_layout: str = "C", y_layout: str = "C") -> bool:
    """Whether OpenBLAS gives an (m, k) @ (k, n) product of ``dtype`` with these layouts
    the same bits on one thread as on the threads it has now. Checked once per key with
    random operands (OpenBLAS's blocking depends on the shape and threads, not the
    values: where it differs, random values show it), at most ``MAX_CHECKED`` keys;
    past that, False. True where no BLAS call or no thread change is involved."""
    setters = _setters()
    if dtype.kind not in "fc" or dtype.itemsize < 4 or not setters:
        return True  # not a BLAS product (NumPy's own loop), or no OpenBLAS whose count we change
    threads = _count()
    if threads <= 1:
        return True
    key = (dtype.str, m, k, n, x_layout, y_layout, threads)
    known = _alone.get(key)
    if known is None:
        if len(_alone) >= MAX_CHECKED:
            return False
        rng = np.random.default_rng(0)

        def operand(shape, layout):
            a = rng.standard_normal(shape).astype(dtype)
            if dtype.kind == "c":
                a += 1j * rng.standard_normal(shape)
            return a if layout == "C" else np.asfortranarray(a)

        x, y = operand((m, k), x_layout), operand((k, n), y_layout)
        with wide(m * k * n):
            whole = np.matmul(x, y)
        with single_thread():
            alone = np.matmul(x, y)
        known = _alone[key] = bool(np.array_equal(whole.view(np.uint8), alone.view(np.uint8)))
    return known


def _count() -> int:
    """OpenBLAS's thread count as no hold of EveryO's has set it (a hold keeps the count it
    found in ``_saved``); 0 where OpenBLAS is not found."""
    setters = _setters()
    if not setters:
        return 0
    with _hold_lock:
        return _saved if _held else setters[0]()


def _one_thread(mnk: int, product: Callable[[], tuple] | None = None) -> bool:
    """Apply the thread rule to products of ``mnk`` (``m * n * k``) each: when it asks
    for one BLAS thread, :func:`_set_one`; else False (the products run on OpenBLAS's
    threads). Where OpenBLAS has two threads, every product it would split takes one.
    With more, a small one does, and a large one only on a busy machine and where one
    thread gives it the same bits (:func:`_alone_same`; ``product()`` gives its (dtype,
    m, k, n, x_layout, y_layout); without it, an older everyo-kernels, not checked)."""
    if mnk < OPENBLAS_SINGLE:
        return False
    if mnk < SMALL_MNK or _count() <= 2:
        return _set_one()
    # The check is made at a shape's first large product, busy or not: made only once
    # busy, its product on OpenBLAS's threads leaves their worker spinning (~0.2 s) on a
    # machine whose cores are taken.
    same = True if product is None else _alone_same(*product())
    if machine_busy() and same:
        return _set_one()
    return False


def _restore() -> None:
    """End a hold of :func:`_set_one`; the last one to end puts back the count the
    first found."""
    global _held
    assert _threads  # _set_one found the setters before it took the hold
    with _hold_lock:
        if _held > 0:  # 0: a fork child already gave the count back (_after_fork)
            _held -= 1
            if _held == 0:
                _threads[1](_saved)
    _leave()


def _after_fork() -> None:
    """In a fork child: the parent's threads are not in it, so a hold one of them
    took never ends, and those inside or waiting on a side (:func:`_enter`) never
    leave; give the count back, and start the locks and the sides afresh (the
    parent's locks may have been taken at the fork)."""
    global _hold_lock, _held, _hold_pid, _switch_lock, _switch, _side, _inside, _waiting, _last, _generation
    _hold_lock = threading.Lock()
    if _held and _threads:
        _threads[1](_saved)
    _held, _hold_pid = 0, os.getpid()
    # the threads inside or waiting were the parent's: none of them is in the child
    _switch_lock = threading.Lock()
    _switch, _side, _inside, _waiting, _last = threading.Condition(_switch_lock), 0, 0, [0, 0, 0], 0
    _generation += 1


def matmul(x: np.ndarray, y: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``np.matmul(x, y, out=out)`` under the module's rule: where OpenBLAS has two threads,
    on one where OpenBLAS would split a product (``m * n * k`` from ``OPENBLAS_SINGLE``;
    below it OpenBLAS uses one anyway), so with one thread's bits; with more threads, a
    large product on them unless the machine is busy and one thread gives it the same
    bits (:func:`_one_thread`). With everyo-kernels, on two BLAS threads, a large
    2-D product may be made as two row parts on its pair of threads (``split_matmul``),
    and a large stack of small products into an ``out`` array as two halves of the stack
    (``split_batched``), each part on one BLAS thread and only where the parts give the
    whole one-thread product's bits."""
    if x.ndim >= 2 and y.ndim >= 2:
        mnk = x.shape[-2] * x.shape[-1] * y.shape[-1]
        if mnk >= OPENBLAS_SINGLE:
            if mnk >= SMALL_MNK and x.ndim == 2 and y.ndim == 2:
                made, out = _split_product(x, y, out)
                if made and out is not None:  # made: out holds the product
                    return out
            if _one_thread(mnk, lambda: (np.result_type(x, y), *x.shape[-2:], y.shape[-1], _layout(x), _layout(y))):
                try:
                    return np.matmul(x, y, out=out)
                finally:
                    _restore()
            if _setters():  # more than two BLAS threads: on them, never beside another thread's hold
                _enter(WIDE)
                try:
                    return np.matmul(x, y, out=out)
                finally:
                    _woke()
                    _leave()
        elif x.ndim >= 3 and out is not None and out.size * x.shape[-1] >= SMALL_MNK:
            # a stack of products OpenBLAS makes on one thread each (attention's per-head
            # products): everyo-kernels may make its two halves on its pair of threads
            split = kernel_table.get("split_batched")
            if split is not None and split(x, y, out):
                return out
    return np.matmul(x, y, out=out)


@contextlib.contextmanager
def threads_for(mnk: int, product: tuple | None = None) -> Iterator[None]:
    """Run the block under :func:`matmul`'s rule for products of ``mnk`` (``m * n * k``)
    each: for compiled code (everyo-kernels) that calls NumPy's BLAS itself, many
    times, in one call. ``product``: (dtype, m, k, n) of those products (row-major
    operands), for the check the rule makes where OpenBLAS has more than two threads."""
    held = _one_thread(mnk, None if product is None else lambda: (np.dtype(product[0]), *product[1:4], "C", "C"))
    if not held:
        with wide(mnk):  # on OpenBLAS's threads: never beside another thread's hold
            yield
        return
    try:
        yield
    finally:
        _restore()


@contextlib.contextmanager
def single_thread() -> Iterator[None]:
    """Run the block on one OpenBLAS thread (where OpenBLAS is found and has more),
    restoring the count after: for code that splits a product over threads of
    its own."""
    held = _set_one()
    try:
        yield
    finally:
        if held:
            _restore()
