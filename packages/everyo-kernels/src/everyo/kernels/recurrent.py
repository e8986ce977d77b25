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

import numpy as np

from everyo.kernels._jit import kernel
from everyo.kernels._native import TANH, gemm, gemm_address, ufunc_call

__all__ = ["lstm_gates_in", "lstm_gates_out", "lstm_cell_backward", "lstm_forward_scan", "lstm_backward_scan"]

_f = np.float32  # constants 0.5 and 1 (exact in either type)


@kernel
def lstm_gates_in(a4, x, t):
    """Before the step's ``tanh``: ``a4`` (4, B, H) holds ``h @ W_hh`` per gate;
    adds step ``t`` of the input projection ``x`` (B, T, 4, H) and halves the
    sigmoid gates (i, f, o), in place."""
    half = _f(0.5)
    batch, hidden = a4.shape[1], a4.shape[2]
    for b in range(batch):
        for k in range(4):
            gate, xk = a4[k, b], x[b, t, k]
            if k == 2:
                for j in range(hidden):
                    gate[j] = gate[j] + xk[j]
            else:
                for j in range(hidden):
                    gate[j] = (gate[j] + xk[j]) * half


@kernel
def lstm_gates_out(a4, c, c_out):
    """After ``np.tanh(a4)``: finishes the sigmoids (``0.5 + 0.5 tanh``) and
    writes the new cell state ``f * c + i * g`` into ``c_out``."""
    half = _f(0.5)
    batch, hidden = c.shape
    for b in range(batch):
        for k in (0, 1, 3):
            gate = a4[k, b]
            for j in range(hidden):
                gate[j] = gate[j] * half + half
        i, f, g = a4[0, b], a4[1, b], a4[2, b]
        cb, cn = c[b], c_out[b]
        for j in range(hidden):
            cn[j] = f[j] * cb[j] + i[j] * g[j]


@kernel
def lstm_cell_backward(a4, tc, c_prev, dh, dc, d_step):
    """One backward step. ``a4`` (4, B, H): the step's activated gates;
    ``tc`` (B, H): tanh of its cell state; ``c_prev``: the state before it;
    ``dh`` (B, H): the gradient of its hidden state; ``dc`` (B, H): of its cell
    state in, of the previous cell state out; ``d_step`` (4, B, H) out: the
    gradients of the pre-activations (i, f, g, o)."""
    one = _f(1.0)
    batch, hidden = tc.shape
    for b in range(batch):
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


# --- whole time loops (``lstm_forward_scan``, ``lstm_backward_scan``) ---------------------
# The scan's Python loop costs, per step, a BLAS call through NumPy's matmul, two NumPy
# tanh calls, the kernels above and several views: tens of microseconds of interpreter
# and call overhead per step. These kernels run the whole loop in one call, each step
# doing what the NumPy path does in the same order: the products through the BLAS
# function NumPy's matmul calls, with its arguments, and the tanh through NumPy's own
# loop (``_native``). So the results stay bit-identical.


@kernel
def _lstm_forward(blas, tanh, x, w4, c0, acts, cs, tanh_cs, prev, h_last, reverse):
    steps, _, batch, hidden = acts.shape
    lda = prev.shape[1] * hidden  # h is prev[:, t]: rows T * H apart
    ahead = -1 if reverse else 1
    for s in range(steps):
        t = steps - 1 - s if reverse else s
        a4 = acts[t]
        h = prev[:, t]
        for k in range(4):
            gemm(blas, batch, hidden, hidden, h, lda, w4[k], hidden, a4[k], hidden)
        lstm_gates_in(a4, x, t)
        ufunc_call(tanh, a4, a4, a4.size)
        if s == 0:
            lstm_gates_out(a4, c0, cs[t])
        else:
            lstm_gates_out(a4, cs[t - ahead], cs[t])
        tc = tanh_cs[t]
        ufunc_call(tanh, cs[t], tc, tc.size)
        o = a4[3]
        if s == steps - 1:
            for b in range(batch):
                for j in range(hidden):
                    h_last[b, j] = o[b, j] * tc[b, j]
        else:
            out = prev[:, t + ahead]
            for b in range(batch):
                for j in range(hidden):
                    out[b, j] = o[b, j] * tc[b, j]


@kernel
def _lstm_backward(blas, acts, tanh_cs, cs, c0, w4_t, g, has_g, dh, dc, d_step, back, d_acts, reverse):
    steps, _, batch, hidden = acts.shape
    ahead = -1 if reverse else 1
    first = steps - 1 if reverse else 0
    for s in range(steps):
        t = s if reverse else steps - 1 - s
        if has_g:
            for b in range(batch):
                for j in range(hidden):
                    dh[b, j] = dh[b, j] + g[b, t, j]
        if t == first:
            lstm_cell_backward(acts[t], tanh_cs[t], c0, dh, dc, d_step)
        else:
            lstm_cell_backward(acts[t], tanh_cs[t], cs[t - ahead], dh, dc, d_step)
        for b in range(batch):
            for k in range(4):
                row, src = d_acts[b, t, k], d_step[k, b]
                for j in range(hidden):
                    row[j] = src[j]
        for k in range(4):
            gemm(blas, batch, hidden, hidden, d_step[k], hidden, w4_t[k], hidden, back[k], hidden)
        # np.add.reduce(back, 0): the first gate's block, then each next one added in turn
        for b in range(batch):
            for j in range(hidden):
                dh[b, j] = ((back[0, b, j] + back[1, b, j]) + back[2, b, j]) + back[3, b, j]


def lstm_forward_scan(x, w4, c0, acts, cs, tanh_cs, prev, h_last, reverse):
    """The forward time loop of ``lstm_scan`` (no padding), in one call.

    ``x`` (B, T, 4, H): the input projection; ``w4`` (4, H, H): ``W_hh``'s gate
    blocks; ``c0`` (B, H); out: ``acts`` (T, 4, B, H) the activated gates, ``cs``
    and ``tanh_cs`` (T, B, H) the cell states and their tanh, ``prev`` (B, T, H)
    the state before each step (``prev[:, first]`` holds h0 on entry) and
    ``h_last`` (B, H). All C-contiguous, one dtype (float32 or float64), B, H > 1."""
    dt = acts.dtype
    _lstm_forward(gemm_address(dt), TANH[dt.name], x, w4, c0, acts, cs, tanh_cs, prev, h_last, reverse)


def lstm_backward_scan(acts, tanh_cs, cs, c0, w4_t, g, dh, dc, d_acts, reverse):
    """The backward time loop of ``lstm_scan`` (no padding), in one call: ``g``
    (B, T, H) the outputs' gradient or None; ``dh``, ``dc`` (B, H) the final
    states' gradients in, the initial states' out; ``d_acts`` (B, T, 4, H) out:
    the gates' pre-activation gradients. ``w4_t``: each gate block transposed."""
    dt = acts.dtype
    batch, hidden = dh.shape
    d_step, back = np.empty((4, batch, hidden), dt), np.empty((4, batch, hidden), dt)
    has_g = g is not None
    g = g if has_g else np.zeros((1, 1, 1), dt)
    _lstm_backward(gemm_address(dt), acts, tanh_cs, cs, c0, w4_t, g, has_g, dh, dc, d_step, back, d_acts, reverse)
