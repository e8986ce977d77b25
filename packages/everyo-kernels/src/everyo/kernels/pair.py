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
sleeps on an event. The LSTM's scans run their batch as two row ranges on it
and the caller (``everyo.kernels.recurrent``).

Where OpenBLAS has exactly two threads (a 2-core machine) and the machine is
not busy, the pair is the process's one way of using the second core
(:func:`owns_second_core`): the large 2-D products are split in two halves
(rows or columns) over it and the caller, each on one OpenBLAS thread
(:func:`split_matmul`), so OpenBLAS's workers are not woken, and so are the
kernels' large passes (:mod:`everyo.kernels.halves`: im2col, pooling, ReLU,
softmax, ...), which a spinning OpenBLAS worker would otherwise share the
second core with. With more BLAS threads, products are split only while the
worker is awake (right after an LSTM scan).

Results stay bit-identical to core's NumPy path: a product is split only for
a (dtype, shape, layouts, BLAS threads) whose halves, each computed alone on one thread, were
found to have the bits of the whole product computed as core computes it
(on the threads OpenBLAS has now): checked once per shape with random
operands (:func:`_parts_agree`). That check wakes OpenBLAS's workers;
a later split waits until they are asleep again (``SETTLE_S``), once, unless
a product of the program's own woke them since (:func:`_settle`).

Nothing of this runs at import: the worker starts at the first job. It is a
daemon thread; a ``fork`` child starts its own (the pid is checked).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
import time
from typing import TYPE_CHECKING, Any

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from everyo import _blas, kernel_table
from everyo.kernels._jit import kernel
from everyo.kernels._native import blas_threads

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = [
    "SPIN_S",
    "GRACE_S",
    "SETTLE_S",
    "MIN_ROWS",
    "awake",
    "owns_second_core",
    "run",
    "split_matmul",
    "split_batched",
]

SPIN_S = 0.005  # how long the worker stays awake after a job
GRACE_S = 4e-6  # how long the worker lets the caller keep the GIL after a post (_poll)
# How long OpenBLAS's workers spin after a product they split (2^28 cycles by default;
# `python benchmarks/harness.py --gap`: still a core at 0.05 s, nothing from 0.2 s).
SETTLE_S = 0.2
MIN_ROWS = 8  # rows of each part of a split product
# Products (dtype, shape, layout, BLAS threads) checked per process; later new ones are not
# split. Each check costs the product twice (and grants one wait of up to SETTLE_S: _settle):
# at most 32 of them (a CNN step has eight large ones, a GPT step fifteen and six stacked
# ones; as many more for a last, smaller batch); a loop whose shapes keep changing runs its
# later shapes as core does.
MAX_SHAPES = 32

_IDLE, _POSTED, _DONE = 0, 1, 2


@intrinsic
def _call(typingctx, address):
    """``int f(void)`` at ``address`` (here ``sched_yield``)."""
    sig = types.int32(types.int64)

    def codegen(context, builder, signature, args):
        fnty = ir.FunctionType(ir.IntType(32), [])
        return builder.call(builder.inttoptr(args[0], fnty.as_pointer()), [])

    return sig, codegen


@intrinsic
def _cycles(typingctx):
    """The CPU's cycle counter (``llvm.readcyclecounter``: ``rdtsc`` on x86-64)."""
    sig = types.int64()

    def codegen(context, builder, signature, args):
        fnty = ir.FunctionType(ir.IntType(64), [])
        fn = builder.module.declare_intrinsic("llvm.readcyclecounter", fnty=fnty)
        return builder.call(fn, [])

    return sig, codegen


@kernel
def _poll(ctrl, yield_fn, ticks, finished, grace):
    """Wait for ``ctrl[0] == _POSTED`` (True) for ``ticks`` cycles at most (False),
    yielding the core on each round (the opaque call makes LLVM load ``ctrl[0]``
    again each time). With ``finished``, first say that the worker's part is done
    (``ctrl[0] = _DONE``): in the same call outside the GIL, so the caller, once it
    sees the news, never waits for the worker to let go of the GIL.

    Once the job is posted, spin ``grace`` cycles more before returning (``GRACE_S``):
    the worker then needs the GIL to start the job, and the caller, which posted it,
    holds it until its own half enters NumPy or a kernel. Asking for a held GIL puts a
    thread to sleep until it is let go, and waking it took ~10 us here. Measured on the
    encoder's 74 splits a step, post to the worker's half starting (median): 11.0 us
    without the grace, 6.1 with 4 us, 10.0 with 8 us."""
    if finished:
        ctrl[0] = _DONE
    start = _cycles()
    while ctrl[0] != _POSTED:
        _call(yield_fn)
        if _cycles() - start > ticks:
            if ctrl[0] != _POSTED:
                return False
            break
    seen = _cycles()
    while _cycles() - seen < grace:
        pass  # the grace: a busy wait, no call (see above)
    return True


@kernel
def _wait_done(ctrl, yield_fn):
    """Wait for ``ctrl[0] == _DONE`` (the worker's part finished)."""
    while ctrl[0] != _DONE:
        _call(yield_fn)


@kernel
def _read_cycles():
    return _cycles()


def _yield_address() -> int:
    libc = ctypes.CDLL(None)
    return int(ctypes.cast(libc.sched_yield, ctypes.c_void_p).value or 0)


class _Worker:
    """The thread and its handshake (``ctrl[0]``: idle, posted, done)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.ctrl = np.zeros(8, np.int64)  # one cache line; only [0] is used
        self.yield_fn = _yield_address()
        self.wake = threading.Event()
        self.lock = threading.Lock()  # one caller at a time; others run their parts alone
        self.job: Callable[[], Any] | None = None
        self.sleeping = False  # the thread waits on `wake` (set before it reads ctrl[0])
        self.error: BaseException | None = None
        self.last = -1.0  # time.monotonic() when the last job ended
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

    def _serve(self) -> None:
        ctrl, yield_fn, ticks, grace = self.ctrl, self.yield_fn, self.ticks, self.grace
        posted = _poll(ctrl, yield_fn, ticks, False, grace)
        while True:
            if posted:
                job, self.job = self.job, None
                try:
                    if job is not None:
                        job()
                except BaseException as error:  # handed to the caller, which raises it
                    self.error = error
                # the job's closure holds its arrays (a product's operands and result): not
                # kept alive while the worker waits for the next job
                job = None
                posted = _poll(ctrl, yield_fn, ticks, True, grace)
            else:
                # Asleep until a caller posts. The caller posts, then reads `sleeping`; this
                # thread sets it, then reads the post: whichever goes second sees the other's
                # write (the GIL orders them), so a post is never missed, and a caller that
                # finds this thread spinning skips `wake.set()` (~2 us with the GIL held).
                self.sleeping = True
                if ctrl[0] != _POSTED:
                    self.wake.wait()
                    self.wake.clear()
                self.sleeping = False
                posted = _poll(ctrl, yield_fn, ticks, False, grace)

    def run(self, mine: Callable[[], Any], theirs: Callable[[], Any]) -> None:
        if not self.lock.acquire(blocking=False):  # another thread is using the pair
            mine()
            theirs()
            return
        try:
            self.error = None
            self.job = theirs
            self.ctrl[0] = _POSTED
            if self.sleeping:
                self.wake.set()
            try:
                mine()
            finally:  # the worker's part uses the same arrays: always wait for it
                _wait_done(self.ctrl, self.yield_fn)
                self.ctrl[0] = _IDLE
                self.last = time.monotonic()
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


def awake() -> bool:
    """Whether the worker ran a job in this process in the last ``SPIN_S``."""
    worker = _worker
    return worker is not None and worker.pid == os.getpid() and time.monotonic() - worker.last < SPIN_S


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
    """Whether OpenBLAS's worker may still spin after a product on its threads: core's
    ``_blas.openblas_spinning``; with an older core, which has none, after a check's
    product (:func:`_parts_agree`) only."""
    spinning = getattr(_blas, "openblas_spinning", None)
    if spinning is None:
        return time.monotonic() < _settle_until
    return bool(spinning())


def _core_wakes() -> int:
    """Core's count of products on OpenBLAS's threads (``_blas.openblas_wakes``); 0 with an
    older core, which has none (then every wait left is granted, as before it)."""
    wakes = getattr(_blas, "openblas_wakes", None)
    return 0 if wakes is None else int(wakes())


def _settle() -> bool:
    """True when OpenBLAS's worker is not spinning, after waiting for it to stop if a
    wait is left (one per shape :func:`_parts_agree` checked) and the spinning is a
    check's; False when it spins and no wait is left, or when a product of the
    program's own ran on OpenBLAS's threads after the last check (core's
    ``_blas.openblas_wakes`` counted past ``_check_wakes``): such a product (a shape whose
    halves have other bits) runs again every step, and waiting ``SETTLE_S`` for the
    worker it woke would cost each step that long (a CNN step on an AMD EPYC, where 7
    of its 8 shapes run whole: 71 -> 264 ms, measured)."""
    global _waits
    if not _spinning():
        return True
    if _waits <= 0:
        return False
    if _core_wakes() != _check_wakes:
        return False
    _waits -= 1
    deadline = time.monotonic() + SETTLE_S
    while _spinning() and time.monotonic() < deadline:
        time.sleep(SETTLE_S / 20)
    return not _spinning()


# --- split products ----------------------------------------------------------------------

_agree: dict[tuple, bool] = {}
_settle_until = 0.0  # until when the last check's product may leave OpenBLAS's worker spinning
_waits = 0  # waits for that worker to settle still allowed (one per checked shape: _settle)
_check_wakes = 0  # core's count of products on OpenBLAS's threads right after the last check


def _layout(a: np.ndarray) -> str | None:
    if a.flags.c_contiguous:
        return "C"
    if a.flags.f_contiguous:
        return "F"
    return None


def _operand(rng: np.random.Generator, shape: tuple[int, int], dtype: Any, layout: str) -> np.ndarray:
    a = rng.standard_normal(shape).astype(dtype)
    return a if layout == "C" else np.asfortranarray(a)


def _halves(x: np.ndarray, y: np.ndarray, out: np.ndarray) -> tuple[tuple, tuple]:
    """The two parts' ``(x, y, out)``: by rows of ``out`` where ``x`` has more rows
    than ``y`` has columns, else by columns. Each part packs all of one operand
    (a part of the other): by rows, both parts pack all of ``y``; so the split
    duplicates the smaller operand's packing (``W_hh``'s gradient (128, 1600) @
    (1600, 512): 1.34-1.42 ms by rows against 1.7 on one thread)."""
    m, n = out.shape
    if m >= n:
        cut = m // 2
        return (x[:cut], y, out[:cut]), (x[cut:], y, out[cut:])
    cut = n // 2
    return (x, y[:, :cut], out[:, :cut]), (x, y[:, cut:], out[:, cut:])


def _parts_agree(key: tuple) -> bool:
    """Whether the two halves of a product (:func:`_halves`), each on one BLAS thread, give the
    bits of the whole product on BLAS's threads as set now (random operands);
    once per key, at most ``MAX_SHAPES`` keys."""
    global _settle_until, _waits, _check_wakes
    if key not in _agree:
        if len(_agree) >= MAX_SHAPES:
            return False
        dtype, m, k, n, x_layout, y_layout, _ = key
        rng = np.random.default_rng(0)
        x, y = _operand(rng, (m, k), dtype, x_layout), _operand(rng, (k, n), dtype, y_layout)
        # as core's _blas.matmul computes it on an idle machine (outside other threads' holds of
        # one BLAS thread, with a core that has _blas.wide)
        with getattr(_blas, "wide", lambda mnk: contextlib.nullcontext())(m * k * n):
            whole = np.matmul(x, y)
        parts = np.empty_like(whole)
        with _blas.single_thread():
            for a, b, c in _halves(x, y, parts):
                np.matmul(a, b, out=c)
        _agree[key] = bool(np.array_equal(whole.view(np.uint8), parts.view(np.uint8)))
        _settle_until = time.monotonic() + SETTLE_S  # that product woke OpenBLAS's workers
        _waits += 1
        _check_wakes = _core_wakes()
    return _agree[key]


def split_matmul(x: np.ndarray, y: np.ndarray, out: np.ndarray) -> bool:
    """``np.matmul(x, y, out=out)`` as two halves (:func:`_halves`) on the pair (this
    thread and the worker), each on one BLAS thread, and True; or False (nothing done) where
    that does not apply: the pair neither owns the second core (:func:`owns_second_core`)
    nor is awake (an LSTM scan just ran), the machine is busy, BLAS has one thread, the
    product is small, the operands are not float32/float64 2-D arrays of one dtype with
    contiguous rows or columns, ``out`` is not C-contiguous, the parts' bits were found
    to differ, or a product just ran on OpenBLAS's threads (core's
    ``_blas.openblas_spinning``: its worker may still spin on the core the halves need).

    A shape's first product is not split: it is checked (:func:`_parts_agree`, whose
    whole product wakes OpenBLAS's worker) and core makes it as always. A later split
    that finds the worker spinning waits for it to settle (``SETTLE_S`` at most) while
    waits are left, one per checked shape, and no product of the program's own ran on
    OpenBLAS's threads since the last check: a training loop's first step checks all its
    shapes, and its second step waits once instead of once per shape. A loop with a
    product on OpenBLAS's threads in every step (a shape whose halves have other bits)
    never waits: products beside a spinning worker are left to core."""
    if x.ndim != 2 or y.ndim != 2 or out.ndim != 2:
        return False
    m, k = x.shape
    n = y.shape[1]
    dt = x.dtype
    if m * k * n < _blas.SMALL_MNK or max(m, n) < 2 * MIN_ROWS or dt != y.dtype or dt != out.dtype:
        return False
    if dt not in kernel_table.FLOAT_DTYPES or not out.flags.c_contiguous:
        return False
    x_layout, y_layout = _layout(x), _layout(y)
    threads = blas_threads()
    if x_layout is None or y_layout is None or threads < 2 or _blas.machine_busy():
        return False
    if not (threads == 2 or awake()):
        return False
    key = (dt.name, m, k, n, x_layout, y_layout, threads)
    new = key not in _agree
    if not _parts_agree(key) or new or not _settle():
        return False
    (x0, y0, out0), (x1, y1, out1) = _halves(x, y, out)
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
