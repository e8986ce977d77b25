"""EveryO core against the plain-NumPy floor.

1. The spec's MLP: 64 -> 128 -> 128 -> 1 (ReLU), 4096 rows, full batch,
   SGD lr 0.05, MSE, 60 steps.
2. One training step of a digit CNN (Conv2D 3x3 'same' 1->16, ReLU,
   MaxPool 2, Conv2D 3x3 'same' 16->32, ReLU, MaxPool 2, Flatten, Linear 128->10,
   cross-entropy, SGD) on a batch of 256 8x8 images, beside a plain-NumPy
   im2col implementation of the same computation.

Runs are interleaved (A B A B ...), each after an idle gap (harness.IDLE_GAP), and
the ratio is the median of pairwise ratios, because this 2-core machine flips
between fast and slow states. Both candidates use NumPy's BLAS, so they may share
a process; the comparison with PyTorch runs each framework in its own process:
benchmarks/bench_vs_torch.py.

    python benchmarks/bench_core.py
"""

import statistics
import sys
from pathlib import Path

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import blas_info, interleaved, machine_info, median_ratio, print_table  # noqa: E402

import everyo as eo  # noqa: E402

ROWS, STEPS, LR = 4096, 60, 0.05


def mlp_data():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((ROWS, 64)).astype(np.float32)
    y = rng.standard_normal((ROWS, 1)).astype(np.float32)
    return x, y


def build_mlp():
    return eo.Sequential(
        eo.Linear(64, 128, seed=0), eo.ReLU(), eo.Linear(128, 128, seed=1), eo.ReLU(), eo.Linear(128, 1, seed=2)
    )


def everyo_mlp(x, y):
    model = build_mlp()
    opt = eo.SGD(model.parameters(), lr=LR)
    xs, ys = eo.tensor(x), eo.tensor(y)
    for _ in range(STEPS):
        opt.zero_grad()
        residual = model(xs) - ys
        eo.mean(residual * residual).backward()
        opt.step()
    return model


def numpy_mlp(x, y):
    """The same training written by hand in NumPy: the floor."""
    params = [p.data.copy() for p in build_mlp().parameters()]
    w1, b1, w2, b2, w3, b3 = params
    n = len(x)
    for _ in range(STEPS):
        h1 = x @ w1 + b1
        a1 = np.maximum(h1, 0)
        h2 = a1 @ w2 + b2
        a2 = np.maximum(h2, 0)
        out = a2 @ w3 + b3
        g = (out - y) * (2.0 / n)
        gw3, gb3 = a2.T @ g, g.sum(0)
        g2 = (g @ w3.T) * (h2 > 0)
        gw2, gb2 = a1.T @ g2, g2.sum(0)
        g1 = (g2 @ w2.T) * (h1 > 0)
        gw1, gb1 = x.T @ g1, g1.sum(0)
        for p, gp in zip((w1, b1, w2, b2, w3, b3), (gw1, gb1, gw2, gb2, gw3, gb3)):
            p -= LR * gp
    return params


def build_cnn():
    return eo.Sequential(
        eo.Conv2D(1, 16, 3, padding="same", seed=0),
        eo.ReLU(),
        eo.MaxPool2D(2),
        eo.Conv2D(16, 32, 3, padding="same", seed=1),
        eo.ReLU(),
        eo.MaxPool2D(2),
        eo.Flatten(),
        eo.Linear(2 * 2 * 32, 10, seed=2),
    )


def cnn_data(batch=256):
    rng = np.random.default_rng(1)
    return rng.standard_normal((batch, 8, 8, 1)).astype(np.float32), rng.integers(0, 10, batch)


def everyo_cnn_step(model, opt, x, y):
    opt.zero_grad()
    eo.cross_entropy(model(x), y).backward()
    opt.step()


def _im2col(x, k):
    xp = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    n, h, w, c = x.shape
    return sliding_window_view(xp, (k, k), axis=(1, 2)).reshape(n * h * w, c * k * k)


def _col2im(gcols, shape, k):
    n, h, w, c = shape
    g = gcols.reshape(n, h, w, c, k, k)
    gxp = np.zeros((n, h + 2, w + 2, c), dtype=gcols.dtype)
    for i in range(k):
        for j in range(k):
            gxp[:, i : i + h, j : j + w, :] += g[..., i, j]
    return gxp[:, 1:-1, 1:-1, :]


def _pool(a):
    n, h, w, c = a.shape
    win = a.reshape(n, h // 2, 2, w // 2, 2, c).transpose(0, 1, 3, 5, 2, 4).reshape(n, h // 2, w // 2, c, 4)
    arg = win.argmax(-1)
    return np.take_along_axis(win, arg[..., None], -1)[..., 0], arg


def _unpool(g, arg, shape):
    n, h, w, c = shape
    gw = np.zeros(g.shape + (4,), dtype=g.dtype)
    np.put_along_axis(gw, arg[..., None], g[..., None], -1)
    return gw.reshape(n, h // 2, w // 2, c, 2, 2).transpose(0, 1, 4, 2, 5, 3).reshape(shape)


def numpy_cnn_step(params, x, y):
    """Plain-NumPy im2col CNN training step: the floor."""
    w1, b1, w2, b2, w3, b3 = params
    n = len(x)
    wm1 = w1.transpose(2, 0, 1, 3).reshape(-1, 16)
    wm2 = w2.transpose(2, 0, 1, 3).reshape(-1, 32)
    c1 = _im2col(x, 3)
    h1 = (c1 @ wm1 + b1).reshape(n, 8, 8, 16)
    a1 = np.maximum(h1, 0)
    p1, arg1 = _pool(a1)
    c2 = _im2col(p1, 3)
    h2 = (c2 @ wm2 + b2).reshape(n, 4, 4, 32)
    a2 = np.maximum(h2, 0)
    p2, arg2 = _pool(a2)
    flat = p2.reshape(n, -1)
    z = flat @ w3 + b3
    z = z - z.max(1, keepdims=True)
    prob = np.exp(z)
    prob /= prob.sum(1, keepdims=True)
    prob[np.arange(n), y] -= 1
    gz = prob / n
    gw3, gb3 = flat.T @ gz, gz.sum(0)
    gp2 = (gz @ w3.T).reshape(p2.shape)
    gh2 = _unpool(gp2, arg2, a2.shape) * (h2 > 0)
    g2 = gh2.reshape(-1, 32)
    gw2 = (c2.T @ g2).reshape(16, 3, 3, 32).transpose(1, 2, 0, 3)
    gb2 = g2.sum(0)
    gp1 = _col2im(g2 @ wm2.T, p1.shape, 3)
    gh1 = _unpool(gp1, arg1, a1.shape) * (h1 > 0)
    g1 = gh1.reshape(-1, 16)
    gw1 = (c1.T @ g1).reshape(1, 3, 3, 16).transpose(1, 2, 0, 3)
    gb1 = g1.sum(0)
    for p, g in zip(params, (gw1, gb1, gw2, gb2, gw3, gb3)):
        p -= 0.01 * g


def main():
    print("EveryO core benchmark:", machine_info())
    print("BLAS:", blas_info())
    print()
    x, y = mlp_data()
    # Same arithmetic: both start from the same weights and must end close.
    drift = max(np.abs(p.data - q).max() for p, q in zip(everyo_mlp(x, y).parameters(), numpy_mlp(x, y)))
    t = interleaved({"everyo": lambda: everyo_mlp(x, y), "numpy": lambda: numpy_mlp(x, y)}, repeats=9)
    rows = [
        [
            "MLP 64-128-128-1, 4096 rows, 60 SGD steps",
            statistics.median(t["everyo"]) * 1e3,
            statistics.median(t["numpy"]) * 1e3,
            median_ratio(t["everyo"], t["numpy"]),
            "<= 1.25",
        ]
    ]

    cx, cy = cnn_data()
    model = build_cnn()
    opt = eo.SGD(model.parameters(), lr=0.01)
    params = [p.data.copy() for p in build_cnn().parameters()]
    xt = eo.tensor(cx)
    t = interleaved(
        {"everyo": lambda: everyo_cnn_step(model, opt, xt, cy), "numpy": lambda: numpy_cnn_step(params, cx, cy)},
        repeats=15,
        warmup=2,
    )
    rows.append(
        [
            "digit CNN train step, batch 256, 8x8x1",
            statistics.median(t["everyo"]) * 1e3,
            statistics.median(t["numpy"]) * 1e3,
            median_ratio(t["everyo"], t["numpy"]),
            "<= 1.5",
        ]
    )
    print_table(
        "Training time: EveryO vs hand-written NumPy (median of interleaved runs)",
        ["workload", "everyo ms", "numpy ms", "ratio", "target"],
        rows,
    )
    print(f"MLP weights after 60 steps, max |everyo - numpy| = {drift:.2e} (same arithmetic)")
    print()
    print("EveryO vs PyTorch (each alone in its own process): python benchmarks/bench_vs_torch.py")


if __name__ == "__main__":
    main()
