"""Forward + backward of an LSTM and a 2-layer transformer encoder: EveryO
beside the same computation hand-written in plain NumPy (the floor).

    python benchmarks/bench_sequence.py [--repeats N]

LSTM: batch 32, 50 steps, 128 inputs, 128 hidden, one layer.
Transformer encoder: batch 32, length 64, width 128, 4 heads, feed-forward
512, post-norm (the default), dropout 0 (the floor has none), 2 layers.

Both sides get the same weights, input and output gradient; before timing,
the floor's output and gradients are checked against EveryO's, so the two
really compute the same thing. Timings alternate A B A B (see harness.py);
the ratio is the median of the pairwise ratios.

The comparison with ``torch.nn.LSTM`` and PyTorch's encoder runs each framework
in its own process: ``benchmarks/bench_vs_torch.py --workloads lstm,encoder``.
"""

import argparse
import os
import statistics
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import blas_info, interleaved, machine_info, median_ratio, print_table  # noqa: E402

import everyo as eo  # noqa: E402


# --- the floor: an LSTM in plain NumPy ---------------------------------------------------
def _sigmoid_(a):
    np.multiply(a, 0.5, out=a)
    np.tanh(a, out=a)
    a += 1
    a *= 0.5


def numpy_lstm(x, w_ih, w_hh, b, dout):
    """Forward and backward of one LSTM layer (gates i, f, g, o), zero initial state.
    Returns (output, dx, dw_ih, dw_hh, db)."""
    batch, steps, _ = x.shape
    H = w_hh.shape[0]
    xp = (x.reshape(batch * steps, -1) @ w_ih + b).reshape(batch, steps, 4 * H)
    acts = np.empty((steps, batch, 4 * H), x.dtype)
    cs = np.empty((steps, batch, H), x.dtype)
    tcs, hs = np.empty_like(cs), np.empty_like(cs)
    h = np.zeros((batch, H), x.dtype)
    c = np.zeros((batch, H), x.dtype)
    for t in range(steps):
        a = np.matmul(h, w_hh, out=acts[t])
        a += xp[:, t]
        _sigmoid_(a[:, : 2 * H])
        np.tanh(a[:, 2 * H : 3 * H], out=a[:, 2 * H : 3 * H])
        _sigmoid_(a[:, 3 * H :])
        c = np.multiply(a[:, H : 2 * H], c, out=cs[t])
        c += a[:, :H] * a[:, 2 * H : 3 * H]
        np.tanh(c, out=tcs[t])
        h = np.multiply(a[:, 3 * H :], tcs[t], out=hs[t])
    out = hs.transpose(1, 0, 2)

    d_acts = np.empty_like(acts)
    dh = np.zeros((batch, H), x.dtype)
    dc = np.zeros((batch, H), x.dtype)
    for t in range(steps - 1, -1, -1):
        dh += dout[:, t]
        a, tc, d = acts[t], tcs[t], d_acts[t]
        i, f, g, o = a[:, :H], a[:, H : 2 * H], a[:, 2 * H : 3 * H], a[:, 3 * H :]
        c_prev = cs[t - 1] if t else np.zeros_like(dc)
        dc += dh * o * (1 - tc * tc)
        np.multiply(dh * tc, o * (1 - o), out=d[:, 3 * H :])
        np.multiply(dc * g, i * (1 - i), out=d[:, :H])
        np.multiply(dc * c_prev, f * (1 - f), out=d[:, H : 2 * H])
        np.multiply(dc * i, 1 - g * g, out=d[:, 2 * H : 3 * H])
        dc *= f
        dh = d @ w_hh.T
    h_prev = np.concatenate([np.zeros((1, batch, H), x.dtype), hs[:-1]])
    dw_hh = h_prev.reshape(-1, H).T @ d_acts.reshape(-1, 4 * H)
    dxp = d_acts.transpose(1, 0, 2).reshape(batch * steps, 4 * H)
    x2 = x.reshape(batch * steps, -1)
    return out, (dxp @ w_ih.T).reshape(x.shape), x2.T @ dxp, dw_hh, dxp.sum(0)


# --- the floor: a post-norm transformer encoder in plain NumPy ------------------------------
def _ln(x, g, b, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    xc = x - mu
    rstd = 1.0 / np.sqrt((xc * xc).mean(-1, keepdims=True) + eps)
    xhat = xc * rstd
    return xhat * g + b, (xhat, rstd, g)


def _ln_back(dy, cache):
    xhat, rstd, g = cache
    dxhat = dy * g
    dx = rstd * (dxhat - dxhat.mean(-1, keepdims=True) - xhat * (dxhat * xhat).mean(-1, keepdims=True))
    return dx, (dy * xhat).sum(0), dy.sum(0)


def numpy_encoder_layer(X, p, heads, shape):
    """Forward of one layer on X (N, E); returns the output and a backward closure."""
    batch, length = shape
    E = X.shape[1]
    d = E // heads
    scale = 1.0 / float(np.sqrt(d))  # a Python float: a NumPy float64 would promote to float64
    qkv = X @ p["wqkv"] + p["bqkv"]
    q, k, v = qkv.reshape(batch, length, 3, heads, d).transpose(2, 0, 3, 1, 4)
    s = (q * scale) @ k.transpose(0, 1, 3, 2)
    s -= s.max(-1, keepdims=True)
    pr = np.exp(s)
    pr /= pr.sum(-1, keepdims=True)
    ctx = (pr @ v).transpose(0, 2, 1, 3).reshape(-1, E)
    y1, ln1 = _ln(X + ctx @ p["wo"] + p["bo"], p["g1"], p["be1"])
    f1 = y1 @ p["w1"] + p["b1"]
    f1r = np.maximum(f1, 0)
    y2, ln2 = _ln(y1 + f1r @ p["w2"] + p["b2"], p["g2"], p["be2"])

    def backward(dy2):
        g = {}
        dr2, g["g2"], g["be2"] = _ln_back(dy2, ln2)
        g["w2"], g["b2"] = f1r.T @ dr2, dr2.sum(0)
        df1 = (dr2 @ p["w2"].T) * (f1 > 0)
        g["w1"], g["b1"] = y1.T @ df1, df1.sum(0)
        dr1, g["g1"], g["be1"] = _ln_back(dr2 + df1 @ p["w1"].T, ln1)
        g["wo"], g["bo"] = ctx.T @ dr1, dr1.sum(0)
        dctx = (dr1 @ p["wo"].T).reshape(batch, length, heads, d).transpose(0, 2, 1, 3)
        dp = dctx @ v.transpose(0, 1, 3, 2)
        dv = pr.transpose(0, 1, 3, 2) @ dctx
        ds = pr * (dp - (dp * pr).sum(-1, keepdims=True))
        ds *= scale
        dq, dk = ds @ k, ds.transpose(0, 1, 3, 2) @ q
        dqkv = np.stack([dq, dk, dv]).transpose(1, 3, 0, 2, 4).reshape(-1, 3 * E)
        g["wqkv"], g["bqkv"] = X.T @ dqkv, dqkv.sum(0)
        return dr1 + dqkv @ p["wqkv"].T, g

    return y2, backward


def numpy_encoder(x, layers, heads, dout):
    batch, length, E = x.shape
    X, backs = x.reshape(-1, E), []
    for p in layers:
        X, back = numpy_encoder_layer(X, p, heads, (batch, length))
        backs.append(back)
    dX, grads = dout.reshape(-1, E), []
    for back in reversed(backs):
        dX, g = back(dX)
        grads.insert(0, g)
    return X.reshape(x.shape), dX.reshape(x.shape), grads


def encoder_params(layer):
    sd = layer.state_dict()
    return {
        "wqkv": sd["self_attn.in_proj_weight"],
        "bqkv": sd["self_attn.in_proj_bias"],
        "wo": sd["self_attn.out_proj.weight"],
        "bo": sd["self_attn.out_proj.bias"],
        "w1": sd["linear1.weight"],
        "b1": sd["linear1.bias"],
        "w2": sd["linear2.weight"],
        "b2": sd["linear2.bias"],
        "g1": sd["norm1.weight"],
        "be1": sd["norm1.bias"],
        "g2": sd["norm2.weight"],
        "be2": sd["norm2.bias"],
    }


# --- the benchmark ---------------------------------------------------------------------------
def _check(name, ours, floor, atol):
    # A float64 scalar slipped into the floor would silently promote it to float64.
    assert all(np.asarray(b).dtype == np.float32 for b in floor), f"{name}: the floor left float32"
    worst = max(float(np.abs(np.asarray(a, np.float64) - b).max()) for a, b in zip(ours, floor))
    if worst > atol:
        raise SystemExit(f"{name}: the NumPy floor disagrees with EveryO by {worst:.3g} (> {atol}); not timing it")
    return worst


def lstm_case(rng):
    batch, steps, hidden = 32, 50, 128
    lstm = eo.LSTM(hidden, hidden, seed=0)
    x = rng.standard_normal((batch, steps, hidden)).astype(np.float32)
    dout = rng.standard_normal((batch, steps, hidden)).astype(np.float32)
    w_ih, w_hh = lstm.weight_ih_l0.data, lstm.weight_hh_l0.data
    b = lstm.bias_ih_l0.data + lstm.bias_hh_l0.data

    def everyo_run():
        lstm.zero_grad()
        xt = eo.tensor(x, requires_grad=True)
        out, _ = lstm(xt)
        out.backward(dout)
        return [out.data, xt.grad, lstm.weight_ih_l0.grad, lstm.weight_hh_l0.grad, lstm.bias_ih_l0.grad]

    def floor_run():
        return numpy_lstm(x, w_ih, w_hh, b, dout)

    err = _check("LSTM", everyo_run(), floor_run(), 1e-3)
    return "LSTM 32x50, 128 hidden", everyo_run, floor_run, err


def encoder_case(rng):
    batch, length, width, heads = 32, 64, 128, 4
    enc = eo.TransformerEncoder(2, width, heads, dim_feedforward=4 * width, dropout=0.0, seed=0)
    x = rng.standard_normal((batch, length, width)).astype(np.float32)
    dout = rng.standard_normal((batch, length, width)).astype(np.float32)
    layers = [encoder_params(layer) for layer in enc.layers]

    def everyo_run():
        enc.zero_grad()
        xt = eo.tensor(x, requires_grad=True)
        out = enc(xt)
        out.backward(dout)
        first = enc.layers[0]
        return [out.data, xt.grad, first.self_attn.in_proj_weight.grad, first.linear1.weight.grad]

    def floor_run():
        out, dx, grads = numpy_encoder(x, layers, heads, dout)
        return [out, dx, grads[0]["wqkv"], grads[0]["w1"]]

    err = _check("encoder", everyo_run(), floor_run(), 1e-3)
    return "Transformer encoder 2x(32x64x128, 4 heads)", everyo_run, floor_run, err


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    print(machine_info())
    print(blas_info())
    print()
    rng = np.random.default_rng(0)
    rows = []
    for make in (lstm_case, encoder_case):
        name, ours, floor, err = make(rng)
        times = interleaved({"everyo": ours, "numpy": floor}, repeats=args.repeats, warmup=2)
        rows.append(
            [
                name,
                statistics.median(times["everyo"]) * 1e3,
                statistics.median(times["numpy"]) * 1e3,
                median_ratio(times["everyo"], times["numpy"]),
                f"{err:.1e}",
            ]
        )
    print_table(
        f"Forward + backward, float32 (median of {args.repeats} interleaved runs)",
        ["model", "EveryO ms", "NumPy floor ms", "ratio (median pairwise)", "max |diff|"],
        rows,
    )
    print(
        "EveryO vs PyTorch (each alone in its own process): python benchmarks/bench_vs_torch.py --workloads lstm,encoder"
    )


if __name__ == "__main__":
    main()
