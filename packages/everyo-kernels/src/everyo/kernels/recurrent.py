"""The LSTM cell's elementwise passes, fused (``everyo.recurrent_ops.lstm_scan``).

After the step's matrix product ``h @ W_hh`` (one BLAS call, still NumPy's),
the reference runs thirteen NumPy passes over (B, 4H) values: add the input
projection, the three sigmoids as ``0.5 + 0.5 tanh(z / 2)``, ``tanh`` of the
cell gate, the cell update and ``o * tanh(c)``; backward fifteen more. Each
pass is cheap, but on 32 x 128 values a NumPy call's own cost is most of it.
Here the passes before and after the forward ``tanh`` are one call each (the
``tanh`` itself stays NumPy's: its AVX-512 loop is faster than anything numba
made of it here), and the backward step is one call. Every kernel is the
reference's arithmetic, operation for operation in the same order and
rounded the same way (no ``fastmath``): the results are **bit-identical**.

They take C-contiguous float32 arrays (training) or float64 ones (the
gradient checker); the scan makes its operands so before calling.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from everyo import _blas
from everyo.kernels import pair
from everyo.kernels._jit import helper, kernel
from everyo.kernels._native import TANH, blas_threads, gemm, gemm_address, ufunc_call

__all__ = ["lstm_gates_in", "lstm_gates_out", "lstm_cell_backward", "lstm_forward_scan", "lstm_backward_scan"]

_f = np.float32  # constants 0.5 and 1 (exact in either type)


@helper
def _gates_in(a4, x, t, b0, b1):
    half = _f(0.5)
    hidden = a4.shape[2]
    for b in range(b0, b1):
        for k in range(4):
            gate, xk = a4[k, b], x[b, t, k]
            if k == 2:
                for j in range(hidden):
                    gate[j] = gate[j] + xk[j]
            else:
                for j in range(hidden):
                    gate[j] = (gate[j] + xk[j]) * half


@helper
def _gates_out(a4, c, c_out, b0, b1):
    half = _f(0.5)
    hidden = c.shape[1]
    for b in range(b0, b1):
        for k in (0, 1, 3):
            gate = a4[k, b]
            for j in range(hidden):
                gate[j] = gate[j] * half + half
        i, f, g = a4[0, b], a4[1, b], a4[2, b]
        cb, cn = c[b], c_out[b]
        for j in range(hidden):
            cn[j] = f[j] * cb[j] + i[j] * g[j]


@helper
def _cell_backward(a4, tc, c_prev, dh, dc, d_step, b0, b1):
    one = _f(1.0)
    hidden = tc.shape[1]
    for b in range(b0, b1):
        for j in range(hidden):
            i = a4[0, b, j]
            f = a4[1, b, j]
            g = a4[2, b, j]
            o = a4[3, b, j]
            t = tc[b, j]
            h_grad = dh[b, j]
            c_grad = dc[b, j] + ((one - t * t) * o) * h_grad
            d_step[0, b, j] = (c_grad * g) * ((one - i) * i)
            d_step[1, b, j] = (c_grad * c_prev[b, j]) * ((one - f) * f)
            d_step[2, b, j] = (c_grad * i) * (one - g * g)
            d_step[3, b, j] = (h_grad * t) * ((one - o) * o)
            dc[b, j] = c_grad * f


@kernel
def lstm_gates_in(a4, x, t):
    """Before the step's ``tanh``: ``a4`` (4, B, H) holds ``h @ W_hh`` per gate;
    adds step ``t`` of the input projection ``x`` (B, T, 4, H) and halves the
    sigmoid gates (i, f, o), in place."""
    _gates_in(a4, x, t, 0, a4.shape[1])


@kernel
def lstm_gates_out(a4, c, c_out):
    """After ``np.tanh(a4)``: finishes the sigmoids (``0.5 + 0.5 tanh``) and
    writes the new cell state ``f * c + i * g`` into ``c_out``."""
    _gates_out(a4, c, c_out, 0, c.shape[0])


@kernel
def lstm_cell_backward(a4, tc, c_prev, dh, dc, d_step):
    """One backward step. ``a4`` (4, B, H): the step's activated gates;
    ``tc`` (B, H): tanh of its cell state; ``c_prev``: the state before it;
    ``dh`` (B, H): the gradient of its hidden state; ``dc`` (B, H): of its cell
    state in, of the previous cell state out; ``d_step`` (4, B, H) out: the
    gradients of the pre-activations (i, f, g, o)."""
    _cell_backward(a4, tc, c_prev, dh, dc, d_step, 0, tc.shape[0])


# --- whole time loops (``lstm_forward_scan``, ``lstm_backward_scan``) ---------------------
# The scan's Python loop costs, per step, a BLAS call through NumPy's matmul, two NumPy
# tanh calls, the kernels above and several views: tens of microseconds of interpreter
# and call overhead per step. These kernels run the whole loop in one call, each step
# doing what the NumPy path does in the same order: the products through the BLAS
# function NumPy's matmul calls, with its arguments, and the tanh through NumPy's own
# loop (``_native``). So the results stay bit-identical.
#
# The batch's rows never meet in an LSTM (each row's states depend only on its own
# inputs), so the loops take a range of rows, ``b0:b1``, and the scans can run the batch
# as a few such ranges on as many threads at once (:func:`_parts`; off: ``THREADS``). NumPy's tanh loop
# gives each element the same bits whatever the length of the call; BLAS's products
# mostly do too, but not always: OpenBLAS 0.3.31 (SkylakeX kernels) gives some rows
# other bits in a (3, 33) @ (33, 33) product than in the (9, 33) @ (33, 33) one they
# belong to (its small-matrix and general kernels sum in other orders for some sizes),
# while every (M, 128) @ (128, 128) product with M >= 2 agrees. So the rows are split
# only where :func:`_rows_agree` found, once per shape, that the parts' products give
# the whole product's bits (a range has two rows or more: one row would be gemv), at the
# first cut of :func:`_candidates` that does.


@kernel
def _lstm_forward(blas, tanh, x, w4, c0, acts, cs, tanh_cs, prev, h_last, reverse, b0, b1):
    steps, _, batch, hidden = acts.shape
    rows = b1 - b0
    lda = prev.shape[1] * hidden  # h is prev[:, t]: rows T * H apart
    ahead = -1 if reverse else 1
    for s in range(steps):
        t = steps - 1 - s if reverse else s
        a4 = acts[t]
        h = prev[b0:b1, t]
        for k in range(4):
            gemm(blas, rows, hidden, hidden, h, lda, w4[k], hidden, a4[k, b0:b1], hidden)
        _gates_in(a4, x, t, b0, b1)
        if rows == batch:
            ufunc_call(tanh, a4, a4, a4.size)
        else:  # the same loop, element for element, over each gate's block of these rows
            for k in range(4):
                ufunc_call(tanh, a4[k, b0:b1], a4[k, b0:b1], rows * hidden)
        if s == 0:
            _gates_out(a4, c0, cs[t], b0, b1)
        else:
            _gates_out(a4, cs[t - ahead], cs[t], b0, b1)
        tc = tanh_cs[t]
        ufunc_call(tanh, cs[t, b0:b1], tc[b0:b1], rows * hidden)
        o = a4[3]
        if s == steps - 1:
            for b in range(b0, b1):
                for j in range(hidden):
                    h_last[b, j] = o[b, j] * tc[b, j]
        else:
            out = prev[:, t + ahead]
            for b in range(b0, b1):
                for j in range(hidden):
                    out[b, j] = o[b, j] * tc[b, j]


@kernel
def _lstm_backward(blas, acts, tanh_cs, cs, c0, w4_t, g, has_g, dh, dc, d_step, back, d_acts, reverse, b0, b1):
    steps, _, batch, hidden = acts.shape
    rows = b1 - b0
    ahead = -1 if reverse else 1
    first = steps - 1 if reverse else 0
    for s in range(steps):
        t = s if reverse else steps - 1 - s
        if has_g:
            for b in range(b0, b1):
                for j in range(hidden):
                    dh[b, j] = dh[b, j] + g[b, t, j]
        if t == first:
            _cell_backward(acts[t], tanh_cs[t], c0, dh, dc, d_step, b0, b1)
        else:
            _cell_backward(acts[t], tanh_cs[t], cs[t - ahead], dh, dc, d_step, b0, b1)
        for b in range(b0, b1):
            for k in range(4):
                row, src = d_acts[b, t, k], d_step[k, b]
                for j in range(hidden):
                    row[j] = src[j]
        for k in range(4):
            gemm(blas, rows, hidden, hidden, d_step[k, b0:b1], hidden, w4_t[k], hidden, back[k, b0:b1], hidden)
        # np.add.reduce(back, 0): the first gate's block, then each next one added in turn
        for b in range(b0, b1):
            for j in range(hidden):
                dh[b, j] = ((back[0, b, j] + back[1, b, j]) + back[2, b, j]) + back[3, b, j]


# The most threads a scan runs its rows on (1: off). Two run on the caller and the pair's
# worker (everyo.kernels.pair), kept awake between the step's jobs; with a thread started
# per scan, two were slower on the development machine (2 cores, a VM): OpenBLAS's worker
# spun on the second core after the step's large products and an idle core took
# milliseconds to join in. The pair also splits those products, so OpenBLAS's workers stay
# asleep: the benchmark's LSTM step 10.5 -> 7.9 ms (README).
THREADS = 2
MIN_ROWS = 8  # rows of each thread's part: fewer make BLAS's per-call cost dominate
MIN_WORK = 1 << 24  # steps * B * H * H below this (~0.5 ms of products): one thread


def _parts(batch: int, hidden: int, steps: int) -> int:
    """How many threads run a scan's rows: one, unless the machine has cores to
    spare. More only where (a) core's thread rule gives the step's products one
    BLAS thread (``B * H * H`` below ``_blas.SMALL_MNK``: larger ones OpenBLAS
    splits itself), (b) BLAS may use more than one thread in this process (a
    ``spawn`` worker's or ``threadpool_limits(1)``'s single thread is kept),
    (c) the machine is not busy (``_blas.machine_busy``: a second thread waiting
    for a core costs more than it saves) and OpenBLAS's worker is not spinning
    after a product (:func:`_openblas_spinning`) and (d) there is work enough
    (``MIN_WORK``, ``MIN_ROWS`` rows a part); and never more than ``THREADS``."""
    if batch * hidden * hidden >= _blas.SMALL_MNK or steps * batch * hidden * hidden < MIN_WORK:
        return 1
    parts = min(THREADS, blas_threads(), batch // MIN_ROWS)
    if parts < 2 or _blas.machine_busy() or _openblas_spinning():
        return 1
    return parts


def _openblas_spinning() -> bool:
    """Whether OpenBLAS's worker may still spin after a call on its threads
    (:func:`everyo.kernels.pair._spinning`: einsum's or QR's; EveryO's products run on one
    OpenBLAS thread or the pair): a
    scan's second part would share its core with it (an AMD EPYC's LSTM step, where
    ``W_hh``'s gradient ran on OpenBLAS's own threads every step: 20.9-24.8 -> 23.8-26.9 ms
    with the scans split beside it)."""
    return pair._spinning()


_agree: dict[tuple[str, int, int, int], list[int] | bool] = {}  # a shape's cuts, or False
CANDIDATES = 6  # cuts of two parts tried per shape (_rows_agree), nearest the middle first


def _cuts(batch: int, parts: int) -> list[int]:
    return [batch * p // parts for p in range(parts + 1)]


def _candidates(batch: int, parts: int) -> list[list[int]]:
    """The cuts :func:`_rows_agree` tries: the even ones; for two parts also cuts at
    multiples of 4 nearest the middle (OpenBLAS's Haswell kernels, on an AMD EPYC, make a
    product's rows 12 at a time from the call's first row, and a row of a shorter last block
    has other bits: a (32, 128) @ (128, 128) product agrees with its parts cut at 12 or 24,
    not at 16)."""
    even = _cuts(batch, parts)
    if parts != 2:
        return [even]
    middle = batch / 2
    near = sorted(
        (c for c in range(4, batch - 1, 4) if c != even[1] and min(c, batch - c) >= 2),
        key=lambda c: (abs(c - middle), c),
    )
    return [even] + [[0, c, batch] for c in near[: CANDIDATES - 1]]


def _rows_agree(dtype: Any, batch: int, hidden: int, parts: int) -> list[int] | bool:
    """The cuts of the batch's rows into ``parts`` (:func:`_candidates`, in order) for which
    BLAS gives each part of a (B, H) @ (H, H) product, computed alone, the bits it has in the
    whole product (random operands, BLAS's thread count as set now), or False where none
    does; asked once per shape and remembered."""
    key = (np.dtype(dtype).name, batch, hidden, parts)
    if key not in _agree:
        rng = np.random.default_rng(0)
        a = rng.standard_normal((batch, hidden)).astype(dtype)
        w = rng.standard_normal((hidden, hidden)).astype(dtype)
        whole = np.matmul(a, w)
        _agree[key] = False
        for cuts in _candidates(batch, parts):
            split = np.concatenate([np.matmul(a[b0:b1], w) for b0, b1 in zip(cuts, cuts[1:])])
            if np.array_equal(whole.view(np.uint8), split.view(np.uint8)):
                _agree[key] = cuts
                break
    return _agree[key]


def _run(loop: Any, args: tuple, dtype: Any, batch: int, hidden: int, steps: int) -> None:
    """``loop(*args, b0, b1)`` over the batch's rows, in :func:`_parts` ranges on
    as many threads (the caller's and new ones; the kernels release the GIL),
    under core's BLAS thread rule for the whole batch's products (as the NumPy
    path runs them)."""
    parts = _parts(batch, hidden, steps)  # before the rule sets one BLAS thread: it reads the count
    with _blas.threads_for(batch * hidden * hidden, (dtype, batch, hidden, hidden)):
        found = _rows_agree(dtype, batch, hidden, parts) if parts > 1 else False
        if not isinstance(found, list):
            loop(*args, 0, batch)
            return
        cuts = found
        if parts == 2:  # the pair's worker, kept awake between the step's jobs
            pair.run(lambda: loop(*args, 0, cuts[1]), lambda: loop(*args, cuts[1], batch))
            return
        helpers = [threading.Thread(target=loop, args=(*args, cuts[p], cuts[p + 1])) for p in range(1, parts)]
        for helper_thread in helpers:
            helper_thread.start()
        try:
            loop(*args, 0, cuts[1])
        finally:
            for helper_thread in helpers:
                helper_thread.join()


def lstm_forward_scan(x, w4, c0, acts, cs, tanh_cs, prev, h_last, reverse):
    """The forward time loop of ``lstm_scan`` (no padding), in one call.

    ``x`` (B, T, 4, H): the input projection; ``w4`` (4, H, H): ``W_hh``'s gate
    blocks; ``c0`` (B, H); out: ``acts`` (T, 4, B, H) the activated gates, ``cs``
    and ``tanh_cs`` (T, B, H) the cell states and their tanh, ``prev`` (B, T, H)
    the state before each step (``prev[:, first]`` holds h0 on entry) and
    ``h_last`` (B, H). All C-contiguous, one dtype (float32 or float64), B, H > 1.
    Applies core's BLAS thread rule itself (:func:`_run`)."""
    dt = acts.dtype
    steps, _, batch, hidden = acts.shape
    args = (gemm_address(dt), TANH[dt.name], x, w4, c0, acts, cs, tanh_cs, prev, h_last, reverse)
    _run(_lstm_forward, args, dt, batch, hidden, steps)


def lstm_backward_scan(acts, tanh_cs, cs, c0, w4_t, g, dh, dc, d_acts, reverse):
    """The backward time loop of ``lstm_scan`` (no padding), in one call: ``g``
    (B, T, H) the outputs' gradient or None; ``dh``, ``dc`` (B, H) the final
    states' gradients in, the initial states' out; ``d_acts`` (B, T, 4, H) out:
    the gates' pre-activation gradients. ``w4_t``: each gate block transposed.
    Applies core's BLAS thread rule itself (:func:`_run`)."""
    dt = acts.dtype
    steps, _, batch, hidden = acts.shape
    d_step, back = np.empty((4, batch, hidden), dt), np.empty((4, batch, hidden), dt)
    has_g = g is not None
    g = g if has_g else np.zeros((1, 1, 1), dt)
    args = (gemm_address(dt), acts, tanh_cs, cs, c0, w4_t, g, has_g, dh, dc, d_step, back, d_acts, reverse)
    _run(_lstm_backward, args, dt, batch, hidden, steps)
