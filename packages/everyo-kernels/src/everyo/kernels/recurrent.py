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

__all__ = ["lstm_gates_in", "lstm_gates_out", "lstm_cell_backward"]

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
