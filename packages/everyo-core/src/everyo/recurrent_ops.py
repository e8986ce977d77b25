"""Fused recurrences: one autograd node runs a whole sequence of RNN, LSTM or
GRU steps for one layer and one direction.

Why fused: built from core's small ops, one LSTM step is ~20 nodes, and
picking time step ``t`` out of a (batch, time, features) tensor by indexing
costs a zero-filled full-size gradient per step (quadratic in the length).
Here the forward keeps what the backward needs in time-major arrays and the
backward is one explicit loop (backpropagation through time, iterative, so a
1,000-step sequence cannot hit any recursion limit). ``W_hh`` gets its
gradient from a single matrix product over all steps at the end.

The input projection ``x @ W_ih + b`` is *not* in here: the layers compute it
for all time steps at once with core's ``linear`` (one large BLAS call), and
pass it in as ``xp`` of shape (batch, time, gates * hidden).

Sigmoid is computed as ``0.5 * (1 + tanh(x / 2))``: the same function, but it
never overflows in ``exp`` for large negative inputs.

Where the LSTM's time goes (32 x 50 steps, 128 hidden, one thread): the 100
per-step products with ``W_hh``, then NumPy's per-call cost on the small
elementwise steps. The LSTM multiplies by ``W_hh`` one gate block at a time, as
one batched ``matmul`` over a (4, H, H) copy of it: each (B, H) @ (H, H) product
is small enough for OpenBLAS's small-matrix kernels (no packing; ~1.3x faster
than one (B, H) @ (H, 4H) product on x86-64), and each gate lands in its own
contiguous (B, H) block, where the elementwise passes run (row-strided slices
of a (B, 4H) row cost NumPy several times more). The step allocates nothing
and uses one tanh for all four gates. With everyo-kernels, an unpadded LSTM's
whole time loop (forward and backward) is one compiled call that makes the
same products and tanh calls as this code, through NumPy's own BLAS function
and ufunc loop: the same bits without the interpreter between the steps.

Padded batches (``lengths``): at step ``t`` the rows with ``lengths <= t`` are
*ended*: their state is carried over unchanged and their output is zero. The
same rule serves both directions: going forward, an ended row keeps its last
real state; going backward (``reverse``), a row's padding comes first and its
state stays the initial one until its own last step, where it starts. In the
backward pass an ended row's step contributes nothing (its pre-activation
gradients are zeroed) and its state gradients pass through unchanged. Steps
where every row is live pay nothing for this.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from everyo import _blas, _buffers, kernel_table
from everyo.dispatch import primitive
from everyo.functional import _sum_leading
from everyo.sequence_ops import multi_output

if TYPE_CHECKING:
    from everyo._typing import TensorLike
    from everyo.tensor import Tensor

__all__ = ["rnn_scan", "lstm_scan", "gru_scan"]


_COMPILED_TYPES = (np.float32, np.float64)  # what everyo-kernels' LSTM kernels take
# Every per-sequence array (saved states and gates, gradients, outputs) comes from the
# recycled pool: a buffer is reused only once nothing (graph, Tensor, view) refers to it.
_empty = _buffers.empty


def _compiled_gates(dt):
    """everyo-kernels' ``(lstm_gates_in, lstm_gates_out)`` for ``dt``, or None."""
    if dt not in _COMPILED_TYPES:
        return None
    gates_in, gates_out = kernel_table.get("lstm_gates_in"), kernel_table.get("lstm_gates_out")
    return None if gates_in is None or gates_out is None else (gates_in, gates_out)


def _compiled_scan(name, compiled, ended, batch, steps, hidden):
    """everyo-kernels' whole-loop LSTM kernel ``name``, or None: it runs only where the
    per-step kernels do (``compiled``), without padding, and where each step's
    (B, H) @ (H, H) product is one that NumPy's matmul hands to BLAS's gemm (not
    gemv: B, H > 1)."""
    if compiled is None or ended is not None or batch < 2 or hidden < 2 or steps < 1:
        return None
    return kernel_table.get(name)


def _contiguous(a, dt):
    """``np.ascontiguousarray(a, dtype=dt)``: ``a`` itself where it is one already, else
    the same copy (the same casts) into a recycled buffer."""
    return a if a.flags.c_contiguous and a.dtype == dt else _buffers.copy_of(a, dt)


def _weight_grad(prev, d, dt):
    """``prev.T @ d`` (the recurrent weight's gradient) into a recycled buffer: the same BLAS call."""
    return _blas.matmul(prev.T, d, _empty((prev.shape[1], d.shape[1]), dt))


def _sigmoid_(a):
    np.multiply(a, 0.5, out=a)
    np.tanh(a, out=a)
    a += 1
    a *= 0.5
    return a


def _gate_blocks(w, gates, dt):
    """``W_hh`` (H, gates * H) as (gates, H, H), contiguous: one block per gate, so
    ``h @ blocks`` (one batched product) writes every gate as its own contiguous
    (B, H) array."""
    hidden = w.shape[0]
    return _contiguous(w.reshape(hidden, gates, hidden).transpose(1, 0, 2), dt)


def _order(steps, reverse):
    return range(steps - 1, -1, -1) if reverse else range(steps)


def _previous(seq, first, reverse):
    """The state *before* each step, time-major: seq shifted by one, ``first`` at the start."""
    out = _empty(seq.shape, seq.dtype)
    if reverse:
        out[:-1], out[-1] = seq[1:], first
    else:
        out[0], out[1:] = first, seq[:-1]
    return out


def _batch_first(seq):
    return _buffers.copy_of(seq.transpose(1, 0, 2))


def _dtype(*arrays):
    return np.result_type(*arrays)


def _ended_rows(lengths, batch, steps):
    """Per time step, the indices of the rows whose sequence has ended (None where
    every row is live); None without ``lengths``."""
    if lengths is None:
        return None
    lengths = np.asarray(lengths)
    if lengths.shape != (batch,) or lengths.dtype.kind not in "iu":
        raise ValueError(f"lengths must be an integer array of shape ({batch},), got {lengths.dtype} {lengths.shape}")
    if lengths.min() >= steps:
        return None  # nothing is padded
    return [None if lengths.min() > t else np.flatnonzero(lengths <= t) for t in range(steps)]


def _outputs(hs, lengths, ended):
    """The (B, T, H) outputs: the states, zero past each row's length."""
    out = _batch_first(hs)  # always a copy: hs is still needed
    _zero_padding(out, lengths, ended)
    return out


def _zero_padding(out, lengths, ended):
    """Zero the (B, T, H) outputs past each row's length, in place."""
    if ended is not None:
        out[np.arange(out.shape[1])[None, :] >= np.asarray(lengths)[:, None]] = 0


@primitive("rnn_scan", kind="fused", inputs=("xp", "h0", "w_hh"))
def rnn_scan(
    xp: Tensor,
    h0: Tensor,
    w_hh: Tensor,
    nonlinearity: str = "tanh",
    reverse: bool = False,
    lengths: TensorLike | None = None,
) -> list[Tensor]:
    """Elman RNN over time: ``h_t = act(xp_t + h_{t-1} @ W_hh)``.

    Returns ``[outputs (B, T, H), h_last (B, H)]`` (``h_last`` is the state after
    the last step processed: ``t = 0`` when ``reverse``). ``lengths`` (B,) marks
    padding (see the module docstring).
    """
    x, w = xp.data, w_hh.data
    dt = _dtype(x, h0.data, w)
    batch, steps, hidden = x.shape
    hs = _empty((steps, batch, hidden), dt)
    h = h0.data.astype(dt, copy=False)
    relu = nonlinearity == "relu"
    ended = _ended_rows(lengths, batch, steps)
    for t in _order(steps, reverse):
        a = _blas.matmul(h, w, hs[t])
        a += x[:, t]
        if relu:
            np.maximum(a, 0, out=a)
        else:
            np.tanh(a, out=a)
        if ended is not None and ended[t] is not None:
            a[ended[t]] = h[ended[t]]
        h = a

    def backward(grads):
        g_seq, g_last = grads
        d_pre = _empty(hs.shape, dt)
        dh = np.zeros((batch, hidden), dtype=dt) if g_last is None else np.array(g_last, dtype=dt)
        w_t = _contiguous(w.T, w.dtype)  # OpenBLAS is slower with a transposed operand
        for t in _order(steps, not reverse):
            rows = None if ended is None else ended[t]
            if rows is not None:
                dh_kept = dh[rows]
            if g_seq is not None:
                dh += g_seq[:, t]
            d = d_pre[t]
            if relu:
                np.multiply(dh, hs[t] > 0, out=d)
            else:
                np.multiply(dh, 1 - hs[t] * hs[t], out=d)
            if rows is not None:
                d[rows] = 0
            dh = _blas.matmul(d, w_t)
            if rows is not None:
                dh[rows] = dh_kept
        prev = _previous(hs, h0.data.astype(dt, copy=False), reverse)
        dw = _weight_grad(prev.reshape(-1, hidden), d_pre.reshape(-1, hidden), dt)
        return d_pre.transpose(1, 0, 2), dh, dw

    return multi_output([_outputs(hs, lengths, ended), h.copy()], (xp, h0, w_hh), backward)


def _lstm_cell_backward(a4, tc, c_prev, dh, dc, d_step, deriv, tmp):
    """One LSTM step backward, in NumPy passes (everyo-kernels' ``lstm_cell_backward``
    is the same arithmetic, compiled): ``dc`` (the cell state's gradient) in and out,
    ``d_step`` (4, B, H) out; ``deriv`` (4, B, H) and ``tmp`` (B, H) are scratch."""
    mul, sub = np.multiply, np.subtract
    i, f, g, o = a4
    d_i, d_f, d_g, d_o = d_step
    deriv_g = deriv[2]
    # dc += dh * o * (1 - tanh(c)^2)
    mul(tc, tc, tmp)
    sub(1, tmp, tmp)
    tmp *= o
    tmp *= dh
    dc += tmp
    # the activations' derivatives: s (1 - s) for i, f, o and 1 - g^2 for g
    sub(1, a4, deriv)
    deriv *= a4
    mul(g, g, deriv_g)
    sub(1, deriv_g, deriv_g)
    mul(dh, tc, d_o)
    mul(dc, g, d_i)
    mul(dc, c_prev, d_f)
    mul(dc, i, d_g)
    d_step *= deriv
    dc *= f


@primitive("lstm_scan", kind="fused", inputs=("xp", "h0", "c0", "w_hh"))
def lstm_scan(
    xp: Tensor, h0: Tensor, c0: Tensor, w_hh: Tensor, reverse: bool = False, lengths: TensorLike | None = None
) -> list[Tensor]:
    """LSTM over time, gates in the order input, forget, cell, output (i, f, g, o):

        i, f, g, o = split(xp_t + h_{t-1} @ W_hh, 4)
        i, f, o = sigmoid(i), sigmoid(f), sigmoid(o);  g = tanh(g)
        c_t = f * c_{t-1} + i * g;   h_t = o * tanh(c_t)

    ``xp`` is (B, T, 4H), ``W_hh`` (H, 4H). Returns ``[outputs (B, T, H),
    h_last (B, H), c_last (B, H)]``. ``lengths`` (B,) marks padding.
    """
    mul, tanh, matmul = np.multiply, np.tanh, _blas.matmul  # small products: one BLAS thread
    x, w = xp.data, w_hh.data
    dt = _dtype(x, h0.data, c0.data, w)
    batch, steps, four_h = x.shape
    H = four_h // 4
    w4 = _gate_blocks(w, 4, dt)  # (4, H, H): h @ w4 is one batched product writing each gate's own block
    x4 = x.reshape(batch, steps, 4, H)
    # Activated gates, kept for backward, gate-major within a step: every gate is one
    # contiguous (B, H) block (NumPy runs several times slower on row-strided slices).
    acts = _empty((steps, 4, batch, H), dt)
    cs = _empty((steps, batch, H), dt)
    tanh_cs = _empty((steps, batch, H), dt)
    # The state before each step, batch-major: each step writes its h there directly,
    # so W_hh's gradient is one product with no copy, and the outputs one block copy.
    prev = _empty((batch, steps, H), dt)
    first, last, ahead = (steps - 1, 0, -1) if reverse else (0, steps - 1, 1)
    h = prev[:, first]
    h[...] = h0.data
    h_last = np.empty((batch, H), dtype=dt)
    c = c0.data.astype(dt, copy=False)
    i_g = np.empty((batch, H), dtype=dt)
    half = dt.type(0.5)
    ended = _ended_rows(lengths, batch, steps)
    # Compiled passes (everyo-kernels, same arithmetic) replace the elementwise passes around the tanh.
    compiled = _compiled_gates(dt)
    if compiled is not None:
        gates_in, gates_out = compiled
        x4 = np.ascontiguousarray(x4, dtype=dt)
        c = np.ascontiguousarray(c, dtype=dt)
    # The whole loop in one compiled call (same products and tanh as below, so the same
    # bits), where NumPy's matmul would make a (B, H) @ (H, H) BLAS product (B, H > 1).
    scan = _compiled_scan("lstm_forward_scan", compiled, ended, batch, steps, H)
    if scan is not None:  # it applies _blas's thread rule to its products itself
        scan(x4, w4, c, acts, cs, tanh_cs, prev, h_last, reverse)
        c = cs[last]
    for t in _order(steps, reverse) if scan is None else ():
        rows = None if ended is None else ended[t]
        if rows is not None:
            h_kept, c_kept = h[rows], c[rows]
        a4 = acts[t]
        matmul(h, w4, a4)
        if compiled is not None:
            gates_in(a4, x4, t)
            tanh(a4, a4)
            gates_out(a4, c, cs[t])
            c = cs[t]
            tc = tanh(c, tanh_cs[t])
            h = mul(a4[3], tc, h_last if t == last else prev[:, t + ahead])
            if rows is not None:
                h[rows], c[rows] = h_kept, c_kept
            continue
        a4 += x4[:, t].transpose(1, 0, 2)
        i, f, g, o = a4
        # sigmoid(z) = 0.5 + 0.5 * tanh(z / 2): one tanh for all four gates
        sig_if = a4[:2]
        sig_if *= half
        o *= half
        tanh(a4, a4)
        sig_if *= half
        sig_if += half
        o *= half
        o += half
        c = mul(f, c, cs[t])
        c += mul(i, g, i_g)
        tc = tanh(c, tanh_cs[t])
        h = mul(o, tc, h_last if t == last else prev[:, t + ahead])
        if rows is not None:
            h[rows], c[rows] = h_kept, c_kept
    out = _empty((batch, steps, H), dt)
    if reverse:
        out[:, 1:], out[:, 0] = prev[:, :-1], h_last
    else:
        out[:, :-1], out[:, -1] = prev[:, 1:], h_last
    _zero_padding(out, lengths, ended)

    def backward(grads):
        g_seq, g_h, g_c = grads
        # Batch-major, so the input projection's backward reshapes it without a copy.
        d_acts = _empty((batch, steps, 4, H), dt)
        dh = np.zeros((batch, H), dtype=dt) if g_h is None else np.array(g_h, dtype=dt)
        dc = np.zeros((batch, H), dtype=dt) if g_c is None else np.array(g_c, dtype=dt)
        w4_t = _contiguous(w4.transpose(0, 2, 1), w4.dtype)  # each gate's block transposed
        c_first = c0.data.astype(dt, copy=False)
        tmp = np.empty((batch, H), dtype=dt)
        deriv = np.empty((4, batch, H), dtype=dt)
        d_step = np.empty((4, batch, H), dtype=dt)  # this step's gate gradients, gate-major (contiguous)
        back = np.empty((4, batch, H), dtype=dt)  # d_step[k] @ w4[k].T, summed over k into dh
        cell = kernel_table.get("lstm_cell_backward") if dt in _COMPILED_TYPES else None
        if cell is not None:
            c_first = np.ascontiguousarray(c_first, dtype=dt)
        scan = _compiled_scan("lstm_backward_scan", cell, ended, batch, steps, H)
        if scan is not None and (g_seq is None or g_seq.dtype == dt):
            g = None if g_seq is None else np.ascontiguousarray(g_seq)
            scan(acts, tanh_cs, cs, c_first, w4_t, g, dh, dc, d_acts, reverse)
            steps_left = ()
        else:
            steps_left = _order(steps, not reverse)
        for t in steps_left:
            rows = None if ended is None else ended[t]
            if rows is not None:
                dh_kept, dc_kept = dh[rows], dc[rows]
            if g_seq is not None:
                dh += g_seq[:, t]
            a4, tc = acts[t], tanh_cs[t]
            c_prev = c_first if t == first else cs[t - ahead]
            if cell is not None:
                cell(a4, tc, c_prev, dh, dc, d_step)
            else:
                _lstm_cell_backward(a4, tc, c_prev, dh, dc, d_step, deriv, tmp)
            if rows is not None:
                d_step[:, rows] = 0
                dc[rows] = dc_kept
            np.copyto(d_acts[:, t], d_step.transpose(1, 0, 2))
            matmul(d_step, w4_t, back)
            np.add.reduce(back, 0, None, dh)
            if rows is not None:
                dh[rows] = dh_kept
        d_flat = d_acts.reshape(batch, steps, four_h)
        dw = _weight_grad(prev.reshape(-1, H), d_flat.reshape(-1, four_h), dt)
        return d_flat, dh, dc, dw

    return multi_output([out, h_last.copy(), c.copy()], (xp, h0, c0, w_hh), backward)


@primitive("gru_scan", kind="fused", inputs=("xp", "h0", "w_hh", "b_hh"))
def gru_scan(
    xp: Tensor, h0: Tensor, w_hh: Tensor, b_hh: Tensor, reverse: bool = False, lengths: TensorLike | None = None
) -> list[Tensor]:
    """GRU over time (PyTorch's convention: the reset gate multiplies the
    *projected* state, after ``W_hn`` and ``b_hn``), gates in the order
    reset, update, new (r, z, n):

        xr, xz, xn = split(xp_t, 3)              # xp = x @ W_ih + b_ih
        hr, hz, hn = split(h_{t-1} @ W_hh + b_hh, 3)
        r = sigmoid(xr + hr);  z = sigmoid(xz + hz)
        n = tanh(xn + r * hn)
        h_t = (1 - z) * n + z * h_{t-1}

    ``xp`` is (B, T, 3H), ``W_hh`` (H, 3H), ``b_hh`` (3H,). Returns
    ``[outputs (B, T, H), h_last (B, H)]``. ``lengths`` (B,) marks padding.
    """
    x, w, b = xp.data, w_hh.data, b_hh.data
    dt = _dtype(x, h0.data, w, b)
    batch, steps, three_h = x.shape
    H = three_h // 3
    rz = _empty((steps, 2, batch, H), dt)  # r and z, gate-major: contiguous (B, H) blocks
    ns = _empty((steps, batch, H), dt)
    hns = _empty(ns.shape, dt)  # h_{t-1} @ W_hn + b_hn, which r multiplies
    hs = _empty(ns.shape, dt)
    h = h0.data.astype(dt, copy=False)
    x3 = x.reshape(batch, steps, 3, H)
    w3 = _gate_blocks(w, 3, dt)  # (3, H, H): h @ w3 writes each gate's own contiguous block
    bias = np.ascontiguousarray(np.broadcast_to(b.reshape(3, 1, H), (3, batch, H)), dtype=dt)  # added whole
    hp = np.empty((3, batch, H), dtype=dt)  # h_{t-1} @ W_hh + b_hh, gate-major
    ended = _ended_rows(lengths, batch, steps)
    for t in _order(steps, reverse):
        _blas.matmul(h, w3, hp)
        hp += bias
        xt = x3[:, t].transpose(1, 0, 2)  # (gate, B, H) view
        gates = np.add(xt[:2], hp[:2], out=rz[t])
        _sigmoid_(gates)
        np.copyto(hns[t], hp[2])
        n = np.multiply(gates[0], hns[t], out=ns[t])
        n += xt[2]
        np.tanh(n, out=n)
        # h = n + z * (h - n) is (1 - z) * n + z * h with one fewer pass
        new = np.subtract(h, n, out=hs[t])
        new *= gates[1]
        new += n
        if ended is not None and ended[t] is not None:
            new[ended[t]] = h[ended[t]]
        h = new

    def backward(grads):
        g_seq, g_last = grads
        # Batch-major, so the input projection's backward reshapes them without a copy.
        d_x = _empty((batch, steps, 3, H), dt)
        d_hp = _empty(d_x.shape, dt)
        dh = np.zeros((batch, H), dtype=dt) if g_last is None else np.array(g_last, dtype=dt)
        h_first = h0.data.astype(dt, copy=False)
        w3_t = _contiguous(w3.transpose(0, 2, 1), w3.dtype)  # each gate's block transposed
        d_step = np.empty((3, batch, H), dtype=dt)  # this step's gate gradients, gate-major
        d_hp_step = np.empty((3, batch, H), dtype=dt)  # and those of h_{t-1} @ W_hh + b_hh
        back = np.empty((3, batch, H), dtype=dt)  # d_hp_step[k] @ w3[k].T, summed over k
        tmp = np.empty((batch, H), dtype=dt)
        carried = np.empty((batch, H), dtype=dt)
        step_back = 1 if reverse else -1  # where the previous state lives
        for t in _order(steps, not reverse):
            rows = None if ended is None else ended[t]
            if rows is not None:
                dh_kept = dh[rows]
            if g_seq is not None:
                dh += g_seq[:, t]
            r, z, n = rz[t, 0], rz[t, 1], ns[t]
            h_prev = h_first if t == (steps - 1 if reverse else 0) else hs[t + step_back]
            d_r, d_z, d_n = d_step
            # d_n = dh * (1 - z) * (1 - n^2)
            np.subtract(1, z, out=tmp)
            tmp *= dh
            np.multiply(n, n, out=d_n)
            np.subtract(1, d_n, out=d_n)
            d_n *= tmp
            # d_r = d_n * hn * r (1 - r)
            np.subtract(1, r, out=tmp)
            tmp *= r
            np.multiply(d_n, hns[t], out=d_r)
            d_r *= tmp
            # d_z = dh * (h_prev - n) * z (1 - z)
            np.subtract(1, z, out=tmp)
            tmp *= z
            np.subtract(h_prev, n, out=d_z)
            d_z *= dh
            d_z *= tmp
            if rows is not None:
                d_step[:, rows] = 0
            dx, dhp = d_x[:, t], d_hp[:, t]
            np.copyto(dx, d_step.transpose(1, 0, 2))
            np.copyto(d_hp_step[:2], d_step[:2])
            np.multiply(d_n, r, out=d_hp_step[2])
            np.copyto(dhp, d_hp_step.transpose(1, 0, 2))
            _blas.matmul(d_hp_step, w3_t, back)
            np.add.reduce(back, 0, None, carried)
            dh *= z
            dh += carried
            if rows is not None:
                dh[rows] = dh_kept
        prev = _empty((batch, steps, H), dt)  # the state before each step, batch-major
        if reverse:
            prev[:, -1] = h_first
            prev[:, :-1] = hs[1:].transpose(1, 0, 2)
        else:
            prev[:, 0] = h_first
            prev[:, 1:] = hs[:-1].transpose(1, 0, 2)
        flat = d_hp.reshape(-1, three_h)
        dw = _weight_grad(prev.reshape(-1, H), flat, dt)
        # b_hh's gradient: flat.sum(axis=0), in one pass where everyo-kernels applies (the same bits)
        return d_x.reshape(batch, steps, three_h), dh, dw, _sum_leading(flat)

    return multi_output([_outputs(hs, lengths, ended), h.copy()], (xp, h0, w_hh, b_hh), backward)
