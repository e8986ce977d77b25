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
per-step products with ``W_hh`` (OpenBLAS; PyTorch's MKL does them ~1.5x
faster), then NumPy's per-call cost on the small elementwise steps. So the
LSTM step allocates nothing, runs every elementwise pass on contiguous (B, H)
gate blocks (row-strided slices of a (B, 4H) row cost NumPy ~5x more), uses
one tanh for all four gates, and multiplies by a contiguous ``W_hh^T`` in
backward (OpenBLAS is ~1.5x slower with a transposed operand at this size).

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

from everyo.dispatch import primitive
from everyo.sequence_ops import multi_output

if TYPE_CHECKING:
    from everyo._typing import TensorLike
    from everyo.tensor import Tensor

__all__ = ["rnn_scan", "lstm_scan", "gru_scan"]


def _sigmoid_(a):
    np.multiply(a, 0.5, out=a)
    np.tanh(a, out=a)
    a += 1
    a *= 0.5
    return a


def _order(steps, reverse):
    return range(steps - 1, -1, -1) if reverse else range(steps)


def _previous(seq, first, reverse):
    """The state *before* each step, time-major: seq shifted by one, ``first`` at the start."""
    if reverse:
        return np.concatenate([seq[1:], first[None]], axis=0)
    return np.concatenate([first[None], seq[:-1]], axis=0)


def _batch_first(seq):
    return np.ascontiguousarray(seq.transpose(1, 0, 2))


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
    if ended is None:
        return _batch_first(hs)
    out = np.array(hs.transpose(1, 0, 2), order="C")  # always a copy: hs is still needed
    out[np.arange(hs.shape[0])[None, :] >= np.asarray(lengths)[:, None]] = 0
    return out


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
    hs = np.empty((steps, batch, hidden), dtype=dt)
    h = h0.data.astype(dt, copy=False)
    relu = nonlinearity == "relu"
    ended = _ended_rows(lengths, batch, steps)
    for t in _order(steps, reverse):
        a = np.matmul(h, w, out=hs[t])
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
        d_pre = np.empty_like(hs)
        dh = np.zeros((batch, hidden), dtype=dt) if g_last is None else np.array(g_last, dtype=dt)
        w_t = np.ascontiguousarray(w.T)  # OpenBLAS is slower with a transposed operand
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
            dh = d @ w_t
            if rows is not None:
                dh[rows] = dh_kept
        prev = _previous(hs, h0.data.astype(dt, copy=False), reverse)
        dw = prev.reshape(-1, hidden).T @ d_pre.reshape(-1, hidden)
        return d_pre.transpose(1, 0, 2), dh, dw

    return multi_output([_outputs(hs, lengths, ended), h.copy()], (xp, h0, w_hh), backward)


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
    x, w = xp.data, w_hh.data
    dt = _dtype(x, h0.data, c0.data, w)
    batch, steps, four_h = x.shape
    H = four_h // 4
    # Activated gates, kept for backward, gate-major within a step: every gate is one
    # contiguous (B, H) block (NumPy runs ~5x slower on the row-strided slices of a (B, 4H) row).
    acts = np.empty((steps, 4, batch, H), dtype=dt)
    cs = np.empty((steps, batch, H), dtype=dt)
    tanh_cs = np.empty_like(cs)
    hs = np.empty_like(cs)
    h, c = h0.data.astype(dt, copy=False), c0.data.astype(dt, copy=False)
    # One tanh over all four gates: sigmoid(z) = 0.5 + 0.5 * tanh(z / 2), and the
    # halving is folded into W_hh's and xp's i, f, o columns (exact: a power of 2).
    scale = np.array([0.5, 0.5, 1.0, 0.5], dtype=dt)[:, None, None]  # (gate, 1, 1)
    w_scaled = w * scale.reshape(4, 1, 1).repeat(H, axis=1).reshape(four_h)
    x4 = x.reshape(batch, steps, 4, H)
    product = np.empty((batch, 4, H), dtype=dt)
    i_g = np.empty((batch, H), dtype=dt)
    ended = _ended_rows(lengths, batch, steps)
    for t in _order(steps, reverse):
        rows = None if ended is None else ended[t]
        if rows is not None:
            h_kept, c_kept = h[rows], c[rows]
        a4 = acts[t]
        np.matmul(h, w_scaled, out=product.reshape(batch, four_h))
        np.multiply(x4[:, t].transpose(1, 0, 2), scale, out=a4)
        a4 += product.transpose(1, 0, 2)
        np.tanh(a4, out=a4)
        for sig in (a4[:2], a4[3]):  # i and f, then o
            sig *= 0.5
            sig += 0.5
        c = np.multiply(a4[1], c, out=cs[t])
        c += np.multiply(a4[0], a4[2], out=i_g)
        tc = np.tanh(c, out=tanh_cs[t])
        h = np.multiply(a4[3], tc, out=hs[t])
        if rows is not None:
            h[rows], c[rows] = h_kept, c_kept

    def backward(grads):
        g_seq, g_h, g_c = grads
        # Batch-major, so the input projection's backward reshapes it without a copy.
        d_acts = np.empty((batch, steps, 4, H), dtype=dt)
        dh = np.zeros((batch, H), dtype=dt) if g_h is None else np.array(g_h, dtype=dt)
        dc = np.zeros((batch, H), dtype=dt) if g_c is None else np.array(g_c, dtype=dt)
        # OpenBLAS multiplies by a transposed operand ~1.5x slower at these sizes.
        w_t = np.ascontiguousarray(w.T)
        c_first = c0.data.astype(dt, copy=False)
        tmp = np.empty((batch, H), dtype=dt)
        deriv = np.empty((4, batch, H), dtype=dt)
        d_step = np.empty((4, batch, H), dtype=dt)  # this step's gate gradients, gate-major (contiguous)
        step_back = 1 if reverse else -1  # where the previous state lives
        for t in _order(steps, not reverse):
            rows = None if ended is None else ended[t]
            if rows is not None:
                dh_kept, dc_kept = dh[rows], dc[rows]
            if g_seq is not None:
                dh += g_seq[:, t]
            a4, tc, d4 = acts[t], tanh_cs[t], d_acts[:, t]
            i, f, g, o = a4
            first = t == (steps - 1 if reverse else 0)
            c_prev = c_first if first else cs[t + step_back]
            # dc += dh * o * (1 - tanh(c)^2)
            np.multiply(tc, tc, out=tmp)
            np.subtract(1, tmp, out=tmp)
            tmp *= o
            tmp *= dh
            dc += tmp
            # the activations' derivatives: s (1 - s) for i, f, o and 1 - g^2 for g
            np.subtract(1, a4, out=deriv)
            deriv *= a4
            np.multiply(g, g, out=deriv[2])
            np.subtract(1, deriv[2], out=deriv[2])
            np.multiply(dh, tc, out=d_step[3])
            d_step[3] *= deriv[3]
            for gate, factor in ((0, g), (1, c_prev), (2, i)):  # plain 2-D products: a broadcast costs ~4x
                np.multiply(dc, factor, out=d_step[gate])
                d_step[gate] *= deriv[gate]
            dc *= f
            if rows is not None:
                d_step[:, rows] = 0
                dc[rows] = dc_kept
            np.copyto(d4, d_step.transpose(1, 0, 2))
            np.matmul(d4.reshape(batch, four_h), w_t, out=dh)
            if rows is not None:
                dh[rows] = dh_kept
        prev = np.empty((batch, steps, H), dtype=dt)  # the state before each step, batch-major
        h_first = h0.data.astype(dt, copy=False)
        if reverse:
            prev[:, -1] = h_first
            prev[:, :-1] = hs[1:].transpose(1, 0, 2)
        else:
            prev[:, 0] = h_first
            prev[:, 1:] = hs[:-1].transpose(1, 0, 2)
        d_flat = d_acts.reshape(batch, steps, four_h)
        dw = prev.reshape(-1, H).T @ d_flat.reshape(-1, four_h)
        return d_flat, dh, dc, dw

    return multi_output([_outputs(hs, lengths, ended), h.copy(), c.copy()], (xp, h0, c0, w_hh), backward)


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
    rz = np.empty((steps, 2, batch, H), dtype=dt)  # r and z, gate-major: contiguous (B, H) blocks
    ns = np.empty((steps, batch, H), dtype=dt)
    hns = np.empty_like(ns)  # h_{t-1} @ W_hn + b_hn, which r multiplies
    hs = np.empty_like(ns)
    h = h0.data.astype(dt, copy=False)
    x3 = x.reshape(batch, steps, 3, H)
    bias = b.reshape(3, H)
    product = np.empty((batch, 3, H), dtype=dt)
    ended = _ended_rows(lengths, batch, steps)
    for t in _order(steps, reverse):
        np.matmul(h, w, out=product.reshape(batch, three_h))
        product += bias
        hp, xt = product.transpose(1, 0, 2), x3[:, t].transpose(1, 0, 2)  # (gate, B, H) views
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
        d_x = np.empty((batch, steps, 3, H), dtype=dt)
        d_hp = np.empty_like(d_x)
        dh = np.zeros((batch, H), dtype=dt) if g_last is None else np.array(g_last, dtype=dt)
        h_first = h0.data.astype(dt, copy=False)
        w_t = np.ascontiguousarray(w.T)  # OpenBLAS is slower with a transposed operand
        d_step = np.empty((3, batch, H), dtype=dt)  # this step's gate gradients, gate-major
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
            np.copyto(dhp[:, :2], d_step[:2].transpose(1, 0, 2))
            np.multiply(d_n, r, out=dhp[:, 2])
            np.matmul(dhp.reshape(batch, three_h), w_t, out=carried)
            dh *= z
            dh += carried
            if rows is not None:
                dh[rows] = dh_kept
        prev = np.empty((batch, steps, H), dtype=dt)  # the state before each step, batch-major
        if reverse:
            prev[:, -1] = h_first
            prev[:, :-1] = hs[1:].transpose(1, 0, 2)
        else:
            prev[:, 0] = h_first
            prev[:, 1:] = hs[:-1].transpose(1, 0, 2)
        flat = d_hp.reshape(-1, three_h)
        dw = prev.reshape(-1, H).T @ flat
        return d_x.reshape(batch, steps, three_h), dh, dw, flat.sum(axis=0)

    return multi_output([_outputs(hs, lengths, ended), h.copy()], (xp, h0, w_hh, b_hh), backward)
