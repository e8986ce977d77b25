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
"""
import numpy as np

from everyo.dispatch import primitive
from everyo.sequence_ops import multi_output

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


@primitive("rnn_scan", kind="fused", inputs=("xp", "h0", "w_hh"))
def rnn_scan(xp, h0, w_hh, nonlinearity="tanh", reverse=False):
    """Elman RNN over time: ``h_t = act(xp_t + h_{t-1} @ W_hh)``.

    Returns ``[outputs (B, T, H), h_last (B, H)]`` (``h_last`` is the state after
    the last step processed: ``t = 0`` when ``reverse``).
    """
    x, w = xp.data, w_hh.data
    dt = _dtype(x, h0.data, w)
    batch, steps, hidden = x.shape
    hs = np.empty((steps, batch, hidden), dtype=dt)
    h = h0.data.astype(dt, copy=False)
    relu = nonlinearity == "relu"
    for t in _order(steps, reverse):
        a = np.matmul(h, w, out=hs[t])
        a += x[:, t]
        if relu:
            np.maximum(a, 0, out=a)
        else:
            np.tanh(a, out=a)
        h = a

    def backward(grads):
        g_seq, g_last = grads
        d_pre = np.empty_like(hs)
        dh = np.zeros((batch, hidden), dtype=dt) if g_last is None else np.array(g_last, dtype=dt)
        for t in _order(steps, not reverse):
            if g_seq is not None:
                dh += g_seq[:, t]
            d = d_pre[t]
            if relu:
                np.multiply(dh, hs[t] > 0, out=d)
            else:
                np.multiply(dh, 1 - hs[t] * hs[t], out=d)
            dh = d @ w.T
        prev = _previous(hs, h0.data.astype(dt, copy=False), reverse)
        dw = prev.reshape(-1, hidden).T @ d_pre.reshape(-1, hidden)
        return d_pre.transpose(1, 0, 2), dh, dw

    return multi_output([_batch_first(hs), h.copy()], (xp, h0, w_hh), backward)


@primitive("lstm_scan", kind="fused", inputs=("xp", "h0", "c0", "w_hh"))
def lstm_scan(xp, h0, c0, w_hh, reverse=False):
    """LSTM over time, gates in the order input, forget, cell, output (i, f, g, o):

        i, f, g, o = split(xp_t + h_{t-1} @ W_hh, 4)
        i, f, o = sigmoid(i), sigmoid(f), sigmoid(o);  g = tanh(g)
        c_t = f * c_{t-1} + i * g;   h_t = o * tanh(c_t)

    ``xp`` is (B, T, 4H), ``W_hh`` (H, 4H). Returns ``[outputs (B, T, H),
    h_last (B, H), c_last (B, H)]``.
    """
    x, w = xp.data, w_hh.data
    dt = _dtype(x, h0.data, c0.data, w)
    batch, steps, four_h = x.shape
    hidden = four_h // 4
    acts = np.empty((steps, batch, four_h), dtype=dt)  # activated gates, kept for backward
    cs = np.empty((steps, batch, hidden), dtype=dt)
    tanh_cs = np.empty_like(cs)
    hs = np.empty_like(cs)
    h, c = h0.data.astype(dt, copy=False), c0.data.astype(dt, copy=False)
    H = hidden
    for t in _order(steps, reverse):
        a = np.matmul(h, w, out=acts[t])
        a += x[:, t]
        _sigmoid_(a[:, :2 * H])
        np.tanh(a[:, 2 * H:3 * H], out=a[:, 2 * H:3 * H])
        _sigmoid_(a[:, 3 * H:])
        c = np.multiply(a[:, H:2 * H], c, out=cs[t])
        c += a[:, :H] * a[:, 2 * H:3 * H]
        tc = np.tanh(c, out=tanh_cs[t])
        h = np.multiply(a[:, 3 * H:], tc, out=hs[t])

    def backward(grads):
        g_seq, g_h, g_c = grads
        d_acts = np.empty_like(acts)
        dh = np.zeros((batch, H), dtype=dt) if g_h is None else np.array(g_h, dtype=dt)
        dc = np.zeros((batch, H), dtype=dt) if g_c is None else np.array(g_c, dtype=dt)
        c_prev_all = _previous(cs, c0.data.astype(dt, copy=False), reverse)
        for t in _order(steps, not reverse):
            if g_seq is not None:
                dh += g_seq[:, t]
            a, tc, d = acts[t], tanh_cs[t], d_acts[t]
            i, f, g, o = a[:, :H], a[:, H:2 * H], a[:, 2 * H:3 * H], a[:, 3 * H:]
            dc += dh * o * (1 - tc * tc)
            np.multiply(dh * tc, o * (1 - o), out=d[:, 3 * H:])
            np.multiply(dc * g, i * (1 - i), out=d[:, :H])
            np.multiply(dc * c_prev_all[t], f * (1 - f), out=d[:, H:2 * H])
            np.multiply(dc * i, 1 - g * g, out=d[:, 2 * H:3 * H])
            dc *= f
            dh = d @ w.T
        prev = _previous(hs, h0.data.astype(dt, copy=False), reverse)
        dw = prev.reshape(-1, H).T @ d_acts.reshape(-1, four_h)
        return d_acts.transpose(1, 0, 2), dh, dc, dw

    return multi_output([_batch_first(hs), h.copy(), c.copy()], (xp, h0, c0, w_hh), backward)


@primitive("gru_scan", kind="fused", inputs=("xp", "h0", "w_hh", "b_hh"))
def gru_scan(xp, h0, w_hh, b_hh, reverse=False):
    """GRU over time (PyTorch's convention: the reset gate multiplies the
    *projected* state, after ``W_hn`` and ``b_hn``), gates in the order
    reset, update, new (r, z, n):

        xr, xz, xn = split(xp_t, 3)              # xp = x @ W_ih + b_ih
        hr, hz, hn = split(h_{t-1} @ W_hh + b_hh, 3)
        r = sigmoid(xr + hr);  z = sigmoid(xz + hz)
        n = tanh(xn + r * hn)
        h_t = (1 - z) * n + z * h_{t-1}

    ``xp`` is (B, T, 3H), ``W_hh`` (H, 3H), ``b_hh`` (3H,). Returns
    ``[outputs (B, T, H), h_last (B, H)]``.
    """
    x, w, b = xp.data, w_hh.data, b_hh.data
    dt = _dtype(x, h0.data, w, b)
    batch, steps, three_h = x.shape
    H = three_h // 3
    rz = np.empty((steps, batch, 2 * H), dtype=dt)
    ns = np.empty((steps, batch, H), dtype=dt)
    hns = np.empty_like(ns)  # h_{t-1} @ W_hn + b_hn, which r multiplies
    hs = np.empty_like(ns)
    h = h0.data.astype(dt, copy=False)
    for t in _order(steps, reverse):
        hp = h @ w
        hp += b
        xt = x[:, t]
        gates = np.add(xt[:, :2 * H], hp[:, :2 * H], out=rz[t])
        _sigmoid_(gates)
        hns[t] = hp[:, 2 * H:]
        n = np.multiply(gates[:, :H], hns[t], out=ns[t])
        n += xt[:, 2 * H:]
        np.tanh(n, out=n)
        # h = n + z * (h - n) is (1 - z) * n + z * h with one fewer pass
        new = np.subtract(h, n, out=hs[t])
        new *= gates[:, H:]
        new += n
        h = new

    def backward(grads):
        g_seq, g_last = grads
        d_x = np.empty((steps, batch, three_h), dtype=dt)
        d_hp = np.empty_like(d_x)
        dh = np.zeros((batch, H), dtype=dt) if g_last is None else np.array(g_last, dtype=dt)
        h_prev_all = _previous(hs, h0.data.astype(dt, copy=False), reverse)
        for t in _order(steps, not reverse):
            if g_seq is not None:
                dh += g_seq[:, t]
            r, z, n, h_prev = rz[t, :, :H], rz[t, :, H:], ns[t], h_prev_all[t]
            dx, dhp = d_x[t], d_hp[t]
            dn_pre = np.multiply(dh * (1 - z), 1 - n * n, out=dx[:, 2 * H:])
            np.multiply(dn_pre * hns[t], r * (1 - r), out=dx[:, :H])
            np.multiply(dh * (h_prev - n), z * (1 - z), out=dx[:, H:2 * H])
            dhp[:, :2 * H] = dx[:, :2 * H]
            np.multiply(dn_pre, r, out=dhp[:, 2 * H:])
            dh = dh * z
            dh += dhp @ w.T
        flat = d_hp.reshape(-1, three_h)
        dw = h_prev_all.reshape(-1, H).T @ flat
        return d_x.transpose(1, 0, 2), dh, dw, flat.sum(axis=0)

    return multi_output([_batch_first(hs), h.copy()], (xp, h0, w_hh, b_hh), backward)
