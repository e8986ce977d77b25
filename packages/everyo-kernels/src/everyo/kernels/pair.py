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

Where OpenBLAS has exactly two threads (a 2-core machine), OpenBLAS's own
parallel jobs run on the pair too (:func:`install_jobs`, at the first large
product): OpenBLAS hands each call's two jobs to a compiled callback, which
runs the first on the calling thread and the second on the worker. The
partition and the kernels are OpenBLAS's, so every product has the bits of
OpenBLAS's two threads, and no worker of OpenBLAS's spins on the second core
after a product (0.2 s each time), so the pair can use that core right away.

Where the pair owns the second core (:func:`owns_second_core`: two BLAS
threads, the machine not busy, no OpenBLAS worker spinning), the kernels'
large passes (:mod:`everyo.kernels.halves`: im2col, pooling, ReLU, softmax,
...) run in two halves on it. Where the callback cannot be installed (an
OpenBLAS older than 0.3.27, another OS or CPU), the large 2-D products are
split in two halves (rows or columns) over the pair instead, each on one
OpenBLAS thread (:func:`split_matmul`), so OpenBLAS's workers are not woken.
With more BLAS threads, products are split only while the worker is awake
(right after an LSTM scan).

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

import atexit
import contextlib
import ctypes
import os
import platform
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

import numba
import numpy as np
from numba import types

from everyo import _blas, kernel_table
from everyo.kernels import _native, _sync
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
    "install_jobs",
    "jobs_on_pair",
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
_FREE, _PYTHON, _BLAS = 0, 1, 2  # who has the worker (ctrl[_OWNER])

# The words of a worker's ``ctrl`` array, each group on its own cache line:
_PY = 0  # a job of Python's (run): _IDLE, _POSTED, _DONE
_OWNER = 8  # _FREE, _PYTHON (running a job of Python's) or _BLAS (taken by an OpenBLAS call)
_SLEEPING = 9  # 1 while the worker sleeps on the futex word
_FUTEX = 10  # the futex word: a post that finds the worker asleep bumps it and wakes it
_JOB = 16  # an OpenBLAS job: _IDLE, _POSTED, _DONE; then its dojob, job data and dojob_data
_JOBS = 24  # OpenBLAS jobs the worker ran
_WAKES = 25  # posts that woke the worker from its sleep
_SPARE = 26  # OpenBLAS calls whose jobs ran on threads started for them (_jobs)
_WORDS = 32

# The process's current worker, for OpenBLAS's callback (which has no Python to ask):
# [0] the address of its ctrl array, [1] the pid of its process (a fork child has none
# until _get starts one). Allocated once, at import; its address is compiled into the callback.
# [2:] the addresses the callback calls (_install).
_CURRENT = np.zeros(16, np.int64)
_GETPID, _YIELD, _SYSCALL, _CREATE, _JOIN, _ABORT, _SPARE_ROUTINE = range(2, 9)
_CALLING = 9  # the pid of the process one of whose threads is in an OpenBLAS call (_jobs), or 0


@kernel
def _poll(ctrl, yield_fn, syscall_fn, ticks, finished, grace):
    """The worker's loop, outside the GIL: return when a job of Python's is posted
    (``ctrl[_PY] == _POSTED``) and the worker has taken it (``ctrl[_OWNER] = _PYTHON``).
    With ``finished``, first say that the worker's last such job is done (in the same
    call outside the GIL, so the caller, once it sees the news, never waits for the
    worker to let go of the GIL).

    Meanwhile, run each OpenBLAS job posted at ``ctrl[_JOB]`` (:func:`_jobs`), here in
    compiled code. Spin (calling ``sched_yield`` each time round, so any other runnable
    thread gets the core first) until ``ticks`` cycles pass with nothing posted, then
    sleep on the futex word until a post wakes it (:func:`_post`).

    Once a job of Python's is posted, spin ``grace`` cycles more before returning
    (``GRACE_S``): the worker then needs the GIL to start the job, and the caller, which
    posted it, holds it until its own half enters NumPy or a kernel. Asking for a held
    GIL puts a thread to sleep until it is let go, and waking it took ~10 us here.
    Measured on the encoder's 74 splits a step, post to the worker's half starting
    (median): 11.0 us without the grace, 6.1 with 4 us, 10.0 with 8 us."""
    _sync.store(ctrl, _OWNER, _FREE)  # in this loop, the worker may take an OpenBLAS job
    if finished:
        _sync.store(ctrl, _PY, _DONE)
    start = _sync.cycles()
    while True:
        if _sync.load(ctrl, _JOB) == _POSTED:
            _sync.dojob(_sync.load(ctrl, _JOB + 1), 1, _sync.load(ctrl, _JOB + 2), _sync.load(ctrl, _JOB + 3))
            _sync.add(ctrl, _JOBS, 1)
            _sync.store(ctrl, _JOB, _DONE)
            start = _sync.cycles()
            continue
        if _sync.load(ctrl, _PY) == _POSTED and _sync.swap_if(ctrl, _OWNER, _FREE, _PYTHON):
            break
        _sync.call0(yield_fn)
        if _sync.cycles() - start > ticks:
            # asleep until a post: say so, then look for a post (_post does the opposite)
            _sync.store(ctrl, _SLEEPING, 1)
            seen = _sync.load(ctrl, _FUTEX)
            if _sync.load(ctrl, _JOB) != _POSTED and _sync.load(ctrl, _PY) != _POSTED:
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
        self.ctrl[_OWNER] = _PYTHON  # not free for OpenBLAS's jobs until its loop runs (_poll)
        self.yield_fn = _sync.libc_address("sched_yield")
        self.syscall_fn = _sync.libc_address("syscall")
        self.lock = threading.Lock()  # one caller at a time; others run their parts alone
        self.job: Callable[[], Any] | None = None
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
                _CURRENT[0], _CURRENT[1] = _worker.ctrl.ctypes.data, _worker.pid
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


# --- OpenBLAS's jobs on the pair ---------------------------------------------------------

_CALLBACK_SIGNATURE = types.void(types.int32, types.voidptr, types.int32, types.uintp, types.voidptr, types.int32)


def _spare_routine(argument):  # compiled at the first install_jobs (a cfunc compiles when made)
    """A thread started for one OpenBLAS job (:func:`_jobs`): its words are the job's
    dojob, thread number, job data and dojob_data."""
    words = numba.carray(_sync.words_at(_sync.address_of(argument)), 4, np.int64)
    _sync.dojob(words[0], words[1], words[2], words[3])
    return argument


@kernel
def _jobs(current, dojob, numjobs, elsize, jobdata, data):
    """Run OpenBLAS's ``numjobs`` jobs of one call at once (they wait for each other, so
    they must run at the same time): the first here, the second on the pair's worker
    where this is the worker's process and the worker is free (in its loop, not running
    a job of Python's); else each other job on a thread started for it. No Python and no
    GIL: the caller of the product may hold the GIL or not.

    One call at a time in the process: OpenBLAS gives job ``i`` the work buffer of its
    thread ``i`` (``blas_thread_buffer[i]``, driver/others/blas_server.c), one per thread
    number, so two calls' jobs at once would share buffers (measured: two Python threads
    making products at once got wrong products). A hold left by a thread of the parent
    of a ``fork`` child (its pid, not this process's) is taken over."""
    me = np.int64(_sync.call0(current[_GETPID]))
    while True:
        holder = _sync.load(current, _CALLING)
        if holder != me and _sync.swap_if(current, _CALLING, holder, me):
            break
        _sync.call0(current[_YIELD])
    if numjobs == 2 and current[0] != 0 and current[1] == me:
        ctrl = numba.carray(_sync.words_at(current[0]), _WORDS, np.int64)
        if _sync.swap_if(ctrl, _OWNER, _FREE, _BLAS):
            _sync.store(ctrl, _JOB + 1, dojob)
            _sync.store(ctrl, _JOB + 2, jobdata + elsize)
            _sync.store(ctrl, _JOB + 3, data)
            _post(ctrl, _JOB, current[_SYSCALL])
            _sync.dojob(dojob, 0, jobdata, data)
            while _sync.load(ctrl, _JOB) != _DONE:
                _sync.call0(current[_YIELD])
            _sync.store(ctrl, _JOB, _IDLE)
            _sync.store(ctrl, _OWNER, _FREE)
            _sync.store(current, _CALLING, 0)
            return
        _sync.add(ctrl, _SPARE, 1)
    words = np.empty((max(numjobs, 1), 4), np.int64)
    handles = np.zeros(max(numjobs, 1), np.int64)
    for i in range(1, numjobs):
        words[i, 0], words[i, 1], words[i, 2], words[i, 3] = dojob, i, jobdata + i * elsize, data
        argument = np.int64(words.ctypes.data) + i * 32
        if _sync.start_thread(current[_CREATE], handles, i, current[_SPARE_ROUTINE], argument) != 0:
            # no thread: the jobs cannot run at once, and one alone would wait for the
            # others forever; end the process rather than hang or return a wrong product
            _sync.call0(current[_ABORT])
    _sync.dojob(dojob, 0, jobdata, data)
    for i in range(1, numjobs):
        _sync.join_thread(current[_JOIN], handles[i])
    _sync.store(current, _CALLING, 0)


_callback: Any = None  # the compiled callback, once installed (kept for the process's life)
_install_lock = threading.Lock()


_SET_CURRENT = -1  # a ``sync`` OpenBLAS never passes: the call gives the callback _CURRENT's address


def _callback_body(sync, dojob, numjobs, elsize, jobdata, data):
    """OpenBLAS's threads callback (``openblas_threads_callback``; compiled by
    :func:`install_jobs`). OpenBLAS calls it with ``sync`` 1; called once with
    ``_SET_CURRENT`` first, it keeps ``jobdata`` as the address of ``_CURRENT`` in a
    variable of its own machine code, so the compiled code holds no address of this
    process and stays cacheable on disk."""
    slot = numba.carray(_sync.own_word(), 1, np.int64)
    if sync == _SET_CURRENT:
        slot[0] = _sync.address_of(jobdata)
        return
    words = numba.carray(_sync.words_at(slot[0]), 16, np.int64)
    _jobs(
        words, _sync.address_of(dojob), np.int64(numjobs), np.int64(elsize), _sync.address_of(jobdata), np.int64(data)
    )


_set = False  # whether OpenBLAS's callback is ours now (it is taken back while the machine is busy)


def _steer(on: bool) -> None:
    """Set OpenBLAS's callback to ours (``on``) or give OpenBLAS its own threads back, where
    that changes anything. NumPy's OpenBLAS 0.3.31 reads the callback once per call (one
    load in ``exec_blas``, checked in its machine code), and the compiled callback is kept for
    the process's life, so a call racing with the change runs on either, with the same bits."""
    global _set
    setter = _native.jobs_setter()
    if setter is None or _callback is None or on == _set:
        return
    setter(ctypes.c_void_p(_callback[0].address) if on else None)
    _set = on


def _uninstall() -> None:
    """Give OpenBLAS its own threads back (at exit: the callback must not outlive the process's Python)."""
    _steer(False)


def jobs_on_pair() -> bool:
    """Whether OpenBLAS's parallel jobs run on the pair now (:func:`install_jobs`)."""
    return _callback is not None and _set


def install_jobs() -> bool:
    """Hand OpenBLAS's parallel jobs to the pair, once per process, and True; False where
    that does not apply (then products on OpenBLAS's threads run on its own workers).

    OpenBLAS (0.3.27 and later) lets a program run its threads' jobs itself
    (``openblas_set_threads_callback_function``). EveryO's callback runs a call's first
    job on the calling thread and the second on the pair's worker, in compiled code: the
    same partition and the same kernels as OpenBLAS's own two threads, so the same bits
    for every shape, and no OpenBLAS worker left spinning after the product on the core
    the pair's other work needs (on the AMD EPYC, where two halves of a product have other
    bits than the whole, that spinning worker was where the second core's time went).

    Only where OpenBLAS has exactly two threads, on x86-64 Linux (the worker sleeps on a
    futex) and NumPy's OpenBLAS has the function. The setting is OpenBLAS's, for the whole
    process: the program's own NumPy products on two threads also run their second job on
    the pair (with OpenBLAS's bits); a call with more than two jobs, one made while the
    worker is busy or from the worker itself, and one in a ``fork`` child before its worker
    starts run their jobs on threads started for them. ``EVERYO_KERNELS=0`` leaves OpenBLAS
    alone. At exit, OpenBLAS gets its own threads back.

    While the machine is busy (``_blas.machine_busy``), OpenBLAS gets its own threads back
    (:func:`_steer`; each call checks): two jobs that wait for each other in spin loops run
    slowly where other processes take the cores, and on the AMD EPYC with four CPU-bound
    processes beside it they ran slower still on the pair's threads than on OpenBLAS's own
    (the MLP step, six processes each: median 332 against 90 ms, both spread 39-372 ms).
    Returns True while the callback is ours."""
    global _callback
    if _callback is not None:
        if _CURRENT[1] != os.getpid():  # a fork child: start its worker (until then, spare threads)
            with contextlib.suppress(RuntimeError):  # no new thread now (interpreter shutdown)
                _get()
        _steer(not _blas.machine_busy())
        return _set
    if not sys.platform.startswith("linux") or platform.machine() not in ("x86_64", "AMD64"):
        return False
    setter = _native.jobs_setter()
    if setter is None or blas_threads() != 2:
        return False
    with _install_lock:
        if _callback is None:
            try:
                _get()
            except RuntimeError:  # no new thread now (interpreter shutdown, an atexit handler)
                return False
            _CURRENT[_GETPID] = _sync.libc_address("getpid")
            _CURRENT[_YIELD] = _sync.libc_address("sched_yield")
            _CURRENT[_SYSCALL] = _sync.libc_address("syscall")
            _CURRENT[_CREATE] = _sync.libc_address("pthread_create")
            _CURRENT[_JOIN] = _sync.libc_address("pthread_join")
            _CURRENT[_ABORT] = _sync.libc_address("abort")
            spare = numba.cfunc(types.voidptr(types.voidptr), cache=True)(_spare_routine)
            _CURRENT[_SPARE_ROUTINE] = spare.address
            callback = numba.cfunc(_CALLBACK_SIGNATURE, cache=True)(_callback_body)
            callback.ctypes(_SET_CURRENT, None, 0, 0, _CURRENT.ctypes.data, 0)
            _callback = callback, spare
            atexit.register(_uninstall)
    _steer(not _blas.machine_busy())
    return _set


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
    if jobs_on_pair():  # OpenBLAS's jobs run on the pair: no worker of its own spins
        return False
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
    that does not apply: OpenBLAS's jobs run on the pair (:func:`install_jobs`, tried
    here: then core makes the product whole, on OpenBLAS's partition), the pair neither owns the second core (:func:`owns_second_core`)
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
    if install_jobs():
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
