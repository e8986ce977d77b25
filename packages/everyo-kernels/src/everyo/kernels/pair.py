"""A second thread kept awake between the jobs of a step (the LSTM's scans; on two BLAS threads, the whole step).

An LSTM training step is a chain of work too small for OpenBLAS's own
threads: 100 recurrent (32, 128) @ (128, 128 x 4) products and their gate
passes, in two scans, plus a few larger products around them (the input
projection, the weight gradients). Two things kept a second core from
helping (everyo-kernels README, "The whole-loop LSTM kernels"):

- a thread started, or woken from sleep, for each scan: 0.17 ms after 10 ms
  idle on the development VM, up to 5 ms;
- OpenBLAS's own worker, which spins on the second core for ~0.1 s after each
  product it splits (the input projection, the weight gradients), so a thread
  of ours never found that core free.

So the pair is one worker thread that, after each job, stays awake for
``SPIN_S`` (a compiled loop, outside the GIL, calling ``sched_yield`` each
time round so any other runnable thread gets the core first) and then
sleeps on a futex until the next post. The LSTM's scans run their batch as
two row ranges on it and the caller (``everyo.kernels.recurrent``).

Where the pair owns the second core (:func:`owns_second_core`: two BLAS
threads, the machine not busy, no OpenBLAS worker spinning), the kernels'
large passes (:mod:`everyo.kernels.halves`: im2col, pooling, ReLU, softmax,
...) run in two halves on it, and so do the large 2-D products
(:func:`split_matmul`): two row parts, each on one OpenBLAS thread. With more
BLAS threads products are not split: core leaves large ones on OpenBLAS's threads.

Results stay bit-identical to core's NumPy path, which on two BLAS threads gives every
product one OpenBLAS thread's bits (core's ``_blas`` module): a product is split only at a row
cut whose parts, each computed on one thread, were found to give the whole
product's one-thread bits, checked once per (dtype, shape, layouts, BLAS threads)
with random operands (:func:`_parts_agree`). OpenBLAS's kernels make a call's rows a
tile at a time from its first row (24 rows on the Haswell kernels), so the cuts that
agree are the multiples of that tile; the check tries the even cut and then
multiples of 8 nearest the middle.

Nothing of this runs at import: the worker starts at the first job. It is a
daemon thread; a ``fork`` child starts its own (the pid is checked).
"""

from __future__ import annotations

import os
import threading
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from everyo import _blas, kernel_table
from everyo.kernels import _sync
from everyo.kernels._jit import kernel
from everyo.kernels._native import blas_threads

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = [
    "SPIN_S",
    "GRACE_S",
    "MIN_ROWS",
    "owns_second_core",
    "run",
    "split_matmul",
    "split_batched",
]

SPIN_S = 0.005  # how long the worker stays awake after a job
GRACE_S = 4e-6  # how long the worker lets the caller keep the GIL after a post (_poll)
MIN_ROWS = 8  # rows of each part of a split product
# Products (dtype, shape, layout, BLAS threads) checked per process; later new ones are not
# split. Each check costs the product once plus once per cut tried (CUTS_TRIED at most):
# at most 32 of them (a CNN step has eight large ones, a GPT step fifteen and six stacked
# ones; as many more for a last, smaller batch); a loop whose shapes keep changing runs its
# later shapes as core does.
MAX_SHAPES = 32

_IDLE, _POSTED, _DONE = 0, 1, 2
_FREE, _PYTHON = 0, 1  # whether a job of Python's has the worker (ctrl[_OWNER])

# The words of a worker's ``ctrl`` array, each group on its own cache line:
_PY = 0  # a job of Python's (run): _IDLE, _POSTED, _DONE
_OWNER = 8  # _FREE (in its loop) or _PYTHON (running a job of Python's)
_SLEEPING = 9  # 1 while the worker sleeps on the futex word
_FUTEX = 10  # the futex word: a post that finds the worker asleep bumps it and wakes it
_WAKES = 25  # posts that woke the worker from its sleep
_WORDS = 32


@kernel
def _poll(ctrl, yield_fn, syscall_fn, ticks, finished, grace):
    """The worker's loop, outside the GIL: return when a job of Python's is posted
    (``ctrl[_PY] == _POSTED``) and the worker has taken it (``ctrl[_OWNER] = _PYTHON``).
    With ``finished``, first say that the worker's last such job is done (in the same
    call outside the GIL, so the caller, once it sees the news, never waits for the
    worker to let go of the GIL).

    Meanwhile spin (calling ``sched_yield`` each time round, so any other runnable
    thread gets the core first) until ``ticks`` cycles pass with nothing posted, then
    sleep on the futex word until a post wakes it (:func:`_post`).

    Once a job of Python's is posted, spin ``grace`` cycles more before returning
    (``GRACE_S``): the worker then needs the GIL to start the job, and the caller, which
    posted it, holds it until its own half enters NumPy or a kernel. Asking for a held
    GIL puts a thread to sleep until it is let go, and waking it took ~10 us here.
    Measured on the encoder's 74 splits a step, post to the worker's half starting
    (median): 11.0 us without the grace, 6.1 with 4 us, 10.0 with 8 us."""
    _sync.store(ctrl, _OWNER, _FREE)
    if finished:
        _sync.store(ctrl, _PY, _DONE)
    start = _sync.cycles()
    while True:
        if _sync.load(ctrl, _PY) == _POSTED and _sync.swap_if(ctrl, _OWNER, _FREE, _PYTHON):
            break
        _sync.call0(yield_fn)
        if _sync.cycles() - start > ticks:
            # asleep until a post: say so, then look for a post (_post does the opposite)
            _sync.store(ctrl, _SLEEPING, 1)
            seen = _sync.load(ctrl, _FUTEX)
            if _sync.load(ctrl, _PY) != _POSTED:
                _sync.futex(syscall_fn, ctrl, _FUTEX, _sync.FUTEX_WAIT, seen)
            _sync.store(ctrl, _SLEEPING, 0)
            start = _sync.cycles()
    seen = _sync.cycles()
    while _sync.cycles() - seen < grace:
        pass  # the grace: a busy wait, no call (see above)
    return True


@kernel
def _post(ctrl, index, syscall_fn):
    """Post the job at ``ctrl[index]`` (its other words already written), and wake the
    worker if it sleeps: the worker says it sleeps, then looks for a post; this posts,
    then looks whether it sleeps. With both in one order of all such loads and stores
    (sequentially consistent), one of them sees the other's word."""
    _sync.store(ctrl, index, _POSTED)
    if _sync.load(ctrl, _SLEEPING) != 0:
        _sync.add(ctrl, _FUTEX, 1)
        _sync.add(ctrl, _WAKES, 1)
        _sync.futex(syscall_fn, ctrl, _FUTEX, _sync.FUTEX_WAKE, 1)


@kernel
def _wait_done(ctrl, yield_fn):
    """Wait for ``ctrl[_PY] == _DONE`` (the worker's part finished)."""
    while _sync.load(ctrl, _PY) != _DONE:
        _sync.call0(yield_fn)


@kernel
def _read_cycles():
    return _sync.cycles()


class _Worker:
    """The thread and its handshake (its ``ctrl`` words, above)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.ctrl = np.zeros(_WORDS, np.int64)
        self.ctrl[_OWNER] = _PYTHON  # not free until its loop runs (_poll)
        self.yield_fn = _sync.libc_address("sched_yield")
        self.syscall_fn = _sync.libc_address("syscall")
        self.lock = threading.Lock()  # one caller at a time; others run their parts alone
        self.job: Callable[[], Any] | None = None
        self.error: BaseException | None = None
        # cycles per second, for the spin's length: read around a short sleep (after a first
        # call: that one loads the compiled code, and timed it made the spin ~100x too short)
        _read_cycles()
        t0, c0 = time.perf_counter(), _read_cycles()
        time.sleep(0.002)
        rate = (_read_cycles() - c0) / (time.perf_counter() - t0)
        self.ticks = int(max(rate, 1e6) * SPIN_S)
        self.grace = int(max(rate, 1e6) * GRACE_S)
        self.thread = threading.Thread(target=self._serve, name="everyo-kernels-pair", daemon=True)
        self.thread.start()

    @property
    def sleeping(self) -> bool:
        """Whether the thread sleeps until the next post."""
        return bool(self.ctrl[_SLEEPING])

    def _serve(self) -> None:
        ctrl, yield_fn, syscall_fn, ticks, grace = self.ctrl, self.yield_fn, self.syscall_fn, self.ticks, self.grace
        finished = False
        while True:
            _poll(ctrl, yield_fn, syscall_fn, ticks, finished, grace)
            job, self.job = self.job, None
            try:
                if job is not None:
                    job()
            except BaseException as error:  # handed to the caller, which raises it
                self.error = error
            # the job's closure holds its arrays (a product's operands and result): not
            # kept alive while the worker waits for the next job
            job = None
            finished = True

    def run(self, mine: Callable[[], Any], theirs: Callable[[], Any]) -> None:
        if not self.lock.acquire(blocking=False):  # another thread is using the pair
            mine()
            theirs()
            return
        try:
            self.error = None
            self.job = theirs
            _post(self.ctrl, _PY, self.syscall_fn)
            try:
                mine()
            finally:  # the worker's part uses the same arrays: always wait for it
                _wait_done(self.ctrl, self.yield_fn)
                self.ctrl[_PY] = _IDLE
            if self.error is not None:
                error, self.error = self.error, None
                raise error
        finally:
            self.lock.release()


_worker: _Worker | None = None
_start_lock = threading.Lock()


def _get() -> _Worker:
    global _worker
    worker = _worker
    if worker is None or worker.pid != os.getpid():
        with _start_lock:
            if _worker is None or _worker.pid != os.getpid():
                _worker = _Worker()
            worker = _worker
    return worker


def run(mine: Callable[[], Any], theirs: Callable[[], Any]) -> None:
    """Run ``mine()`` on this thread and ``theirs()`` on the pair's worker, at
    once; return when both have finished (an exception in either is raised
    here). Both should spend their time outside the GIL (compiled ``nogil``
    kernels, BLAS). Where no thread can be started (interpreter shutdown), or
    when called from the worker itself, both run here, one after the other."""
    worker = None
    if threading.current_thread() is not getattr(_worker, "thread", None):
        try:
            worker = _get()
        except RuntimeError:  # no new thread now (interpreter shutdown, an atexit handler)
            worker = None
    if worker is None:
        mine()
        theirs()
        return
    worker.run(mine, theirs)


def owns_second_core() -> bool:
    """Whether the pair is this process's way of using a second core now: the BLAS
    has exactly two threads (a 2-core machine, as OpenBLAS sets itself) and the
    machine is not busy (``_blas.machine_busy``). Then large products are split over
    the pair (:func:`split_matmul`) and so are the kernels' large passes
    (:mod:`everyo.kernels.halves`): OpenBLAS's own worker is not woken, so it never
    spins on the core the pair's worker needs. With more BLAS threads the products
    stay on OpenBLAS's threads (two halves would use two of its cores) and the
    passes run whole."""
    return blas_threads() == 2 and not _blas.machine_busy() and not _spinning()


def _spinning() -> bool:
    """Whether OpenBLAS's worker may still spin after a call on its threads (core's
    ``_blas.openblas_spinning``: einsum's contractions and LAPACK's QR still run there);
    False with an older core, which has none."""
    spinning = getattr(_blas, "openblas_spinning", None)
    return False if spinning is None else bool(spinning())


# --- split products ----------------------------------------------------------------------

_agree: dict[tuple, Any] = {}  # a shape's row cut (0: none agrees), or a stack's bool


def _layout(a: np.ndarray) -> str | None:
    if a.flags.c_contiguous:
        return "C"
    if a.flags.f_contiguous:
        return "F"
    return None


def _operand(rng: np.random.Generator, shape: tuple[int, int], dtype: Any, layout: str) -> np.ndarray:
    a = rng.standard_normal(shape).astype(dtype)
    return a if layout == "C" else np.asfortranarray(a)


CUTS_TRIED = 8  # row cuts _parts_agree tries per shape: the even one, then multiples of 8 nearest the middle


def _row_cuts(m: int) -> list[int]:
    """The row cuts :func:`_parts_agree` tries for ``m`` rows: the even one, then multiples
    of 8 nearest the middle (the Haswell kernels' 24-row tile is among the nearest three),
    each part at least ``MIN_ROWS`` rows."""
    middle = m / 2
    near = sorted(
        (c for c in range(8, m - MIN_ROWS + 1, 8) if c != m // 2 and c >= MIN_ROWS), key=lambda c: (abs(c - middle), c)
    )
    return [m // 2, *near[: CUTS_TRIED - 1]]


def _halves(x: np.ndarray, y: np.ndarray, out: np.ndarray, cut: int) -> tuple[tuple, tuple]:
    """The two parts' ``(x, y, out)``, by rows of ``out`` cut at ``cut``."""
    return (x[:cut], y, out[:cut]), (x[cut:], y, out[cut:])


def _parts_agree(key: tuple) -> int:
    """The first row cut (:func:`_row_cuts`) whose two parts, each on one BLAS thread, give the
    bits of the whole product on one BLAS thread (random operands), or 0 where none does;
    once per key, at most ``MAX_SHAPES`` keys."""
    if key not in _agree:
        if len(_agree) >= MAX_SHAPES:
            return 0
        dtype, m, k, n, x_layout, y_layout, _ = key
        rng = np.random.default_rng(0)
        x, y = _operand(rng, (m, k), dtype, x_layout), _operand(rng, (k, n), dtype, y_layout)
        found = 0
        with _blas.single_thread():
            whole = np.matmul(x, y)
            for cut in _row_cuts(m):
                parts = np.empty_like(whole)
                for a, b, c in _halves(x, y, parts, cut):
                    np.matmul(a, b, out=c)
                if np.array_equal(whole.view(np.uint8), parts.view(np.uint8)):
                    found = cut
                    break
        _agree[key] = found
    return _agree[key]


def split_matmul(x: np.ndarray, y: np.ndarray, out: np.ndarray) -> bool:
    """``np.matmul(x, y, out=out)`` as two row parts (:func:`_halves`) on the pair (this
    thread and the worker), each on one BLAS thread, and True; or False (nothing done) where
    that does not apply: BLAS has other than two threads (core then gives a product one
    thread's bits only on two), the machine is busy, an OpenBLAS worker may be spinning
    (after an einsum or QR: ``_blas.openblas_spinning``), the product is small,
    the operands are not float32/float64 2-D arrays of one dtype with contiguous rows or
    columns, ``out`` is not C-contiguous, or no row cut was found whose parts give the
    whole one-thread product's bits (:func:`_parts_agree`, checked at a shape's first
    product). Where False, core makes the product whole on one BLAS thread: the same
    bits."""
    if x.ndim != 2 or y.ndim != 2 or out.ndim != 2:
        return False
    m, k = x.shape
    n = y.shape[1]
    dt = x.dtype
    if m * k * n < _blas.SMALL_MNK or m < 2 * MIN_ROWS or dt != y.dtype or dt != out.dtype:
        return False
    if dt not in kernel_table.FLOAT_DTYPES or not out.flags.c_contiguous:
        return False
    x_layout, y_layout = _layout(x), _layout(y)
    threads = blas_threads()
    # two BLAS threads only: with more, core's large products have OpenBLAS's threads' bits
    if x_layout is None or y_layout is None or threads != 2 or _blas.machine_busy() or _spinning():
        return False
    key = (dt.name, m, k, n, x_layout, y_layout, threads)
    cut = _parts_agree(key)
    if not cut:
        return False
    (x0, y0, out0), (x1, y1, out1) = _halves(x, y, out, cut)
    with _blas.single_thread():
        run(lambda: np.matmul(x0, y0, out=out0), lambda: np.matmul(x1, y1, out=out1))
    return True


def split_batched(x: np.ndarray, y: np.ndarray, out: np.ndarray) -> bool:
    """``np.matmul(x, y, out=out)`` for stacks of matrices (attention's per-head products)
    as two halves of the first stacked axis on the pair, and True; or False (nothing done).

    Only where every product of the stack is one OpenBLAS makes on one thread anyway
    (``m * k * n`` below ``_blas.OPENBLAS_SINGLE``): NumPy then makes the same call on
    the same matrix for each item in either half, so the halves have the whole stack's
    bits. That is checked once per (dtype, shapes, strides), on the call's own operands:
    the first call makes the whole stack into ``out`` and its halves into a scratch array
    and compares them (True: ``out`` holds the whole product). Also only where the pair
    owns the second core (:func:`owns_second_core`), the stacks have the same leading
    shape (no broadcasting) of at least two, float32/float64 of one dtype, ``out`` is
    C-contiguous, and the stack holds ``_blas.SMALL_MNK`` multiply-adds or more."""
    if x.ndim < 3 or y.ndim != x.ndim or out.ndim != x.ndim:
        return False
    lead = x.shape[:-2]
    if y.shape[:-2] != lead or out.shape[:-2] != lead or lead[0] < 2:
        return False
    dt = x.dtype
    if dt != y.dtype or dt != out.dtype or dt not in kernel_table.FLOAT_DTYPES:
        return False
    k = x.shape[-1]
    if x.shape[-2] * k * y.shape[-1] >= _blas.OPENBLAS_SINGLE or out.size * k < _blas.SMALL_MNK:
        return False
    if not out.flags.c_contiguous or not owns_second_core():
        return False
    key = ("stack", dt.name, x.shape, y.shape, x.strides, y.strides)
    known = _agree.get(key)
    if known is False or (known is None and len(_agree) >= MAX_SHAPES):
        return False
    h = lead[0] // 2
    if known is None:
        np.matmul(x, y, out=out)
        parts = np.empty_like(out)
        run(lambda: np.matmul(x[:h], y[:h], out=parts[:h]), lambda: np.matmul(x[h:], y[h:], out=parts[h:]))
        _agree[key] = bool(np.array_equal(out.view(np.uint8), parts.view(np.uint8)))
        return True
    run(lambda: np.matmul(x[:h], y[:h], out=out[:h]), lambda: np.matmul(x[h:], y[h:], out=out[h:]))
    return True
