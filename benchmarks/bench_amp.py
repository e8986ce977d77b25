"""Mixed precision on this CPU: time of one training step and memory held by
saved activations, autocast (+ GradScaler) against float32.

    python benchmarks/bench_amp.py            (or: hatch run bench:run benchmarks/bench_amp.py)

Models: the spec's MLP (64-128-128-1, 4096 rows, MSE) and a digit CNN
(Conv2D(1,16,3,'same')-ReLU-MaxPool2D-Conv2D(16,32,3,'same')-ReLU-MaxPool2D-
Flatten-Linear(128,10) on 8x8x1 images, batch 512, cross-entropy). Steps run
interleaved (float32, autocast, float32, ...) and the ratio is the median of
the pairwise ratios, because these 2-core machines flip between a fast and a
slow state every few seconds. Times are taken twice: with BLAS as configured
(2 threads here) and limited to 1 thread (threadpoolctl). The float32 step is
almost all BLAS, which uses both cores; autocast's extra work is float16
conversion in NumPy, which uses one, so the ratio is worse with 2 threads.
Memory is what tracemalloc sees NumPy allocate and keep alive between the
start of the forward pass and the loss, i.e. the graph's saved activations,
before backward frees them.
"""
import os
import statistics
import sys
import tracemalloc

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import blas_info, interleaved, machine_info, median_ratio, print_table  # noqa: E402

import everyo as eo  # noqa: E402

CAVEAT = (
    "On a CPU, mixed precision saves memory, not time. NumPy has no native float16 arithmetic:\n"
    "EveryO upcasts to float32 to compute and casts back, so the float16 path is usually slower\n"
    "here. The speedup mixed precision is known for comes from GPU tensor cores; EveryO implements\n"
    "the numerics so the behaviour is right, it does not pretend to make your CPU faster."
)


def mlp_case():
    rng = np.random.default_rng(0)
    x = eo.tensor(rng.standard_normal((4096, 64)).astype(np.float32))
    y = eo.tensor(rng.standard_normal((4096, 1)).astype(np.float32))
    model = eo.Sequential(eo.Linear(64, 128, seed=0), eo.ReLU(), eo.Linear(128, 128, seed=1), eo.ReLU(),
                          eo.Linear(128, 1, seed=2))
    return model, x, y, eo.mse_loss


def cnn_case():
    rng = np.random.default_rng(1)
    x = eo.tensor(rng.standard_normal((512, 8, 8, 1)).astype(np.float32))
    y = rng.integers(0, 10, size=512)
    model = eo.Sequential(
        eo.Conv2D(1, 16, 3, padding="same", seed=0), eo.ReLU(), eo.MaxPool2D(2),
        eo.Conv2D(16, 32, 3, padding="same", seed=1), eo.ReLU(), eo.MaxPool2D(2),
        eo.Flatten(), eo.Linear(32 * 2 * 2, 10, seed=2),
    )
    return model, x, y, eo.cross_entropy


def float32_step(model, optimizer, x, y, loss_fn):
    optimizer.zero_grad()
    loss_fn(model(x), y).backward()
    optimizer.step()


def autocast_step(model, optimizer, x, y, loss_fn, scaler):
    optimizer.zero_grad()
    with eo.autocast():
        out = model(x)
    scaler.backward(loss_fn(out, y))
    scaler.step(optimizer)
    scaler.update()


def saved_activation_bytes(model, x, y, loss_fn, mixed):
    """Bytes NumPy holds after forward + loss (graph alive), and the peak on the way."""
    tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    if mixed:
        with eo.autocast():
            out = model(x)
    else:
        out = model(x)
    loss = loss_fn(out, y)
    held, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del loss, out
    return held - base, peak - base


def blas_threads(n):
    """Context limiting BLAS to ``n`` threads (None: leave as configured)."""
    import contextlib

    if n is None:
        return contextlib.nullcontext()
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return None
    return threadpool_limits(n, user_api="blas")


def time_case(make, repeats):
    model, x, y, loss_fn = make()
    # Separate identical copies, so each step trains its own comparable weights.
    model32, modelmp = make()[0], make()[0]
    opt32 = eo.SGD(model32.parameters(), lr=1e-3)
    optmp = eo.SGD(modelmp.parameters(), lr=1e-3)
    scaler = eo.GradScaler()
    times = interleaved({
        "float32": lambda: float32_step(model32, opt32, x, y, loss_fn),
        "autocast": lambda: autocast_step(modelmp, optmp, x, y, loss_fn, scaler),
    }, repeats=repeats, warmup=2)
    return (statistics.median(times["float32"]), statistics.median(times["autocast"]),
            median_ratio(times["autocast"], times["float32"]))


def memory_rows(name, make):
    model, x, y, loss_fn = make()
    mem32, peak32 = saved_activation_bytes(model, x, y, loss_fn, mixed=False)
    memmp, peakmp = saved_activation_bytes(model, x, y, loss_fn, mixed=True)
    return [
        [name, "saved activations (MiB)", mem32 / 2**20, memmp / 2**20, memmp / mem32, "<= 0.6"],
        [name, "forward peak (MiB)", peak32 / 2**20, peakmp / 2**20, peakmp / peak32, "-"],
    ]


CASES = [("MLP 64-128-128-1 x4096", mlp_case), ("digit CNN 8x8 x512", cnn_case)]


def main(repeats=15):
    print(machine_info())
    print("BLAS:", blas_info())
    print()
    rows = []
    for threads in (None, 1):
        limit = blas_threads(threads)
        if limit is None:
            print("(threadpoolctl not installed: BLAS-thread-limited rows skipped)")
            continue
        label = "step time (ms), BLAS default threads" if threads is None else f"step time (ms), BLAS {threads} thread"
        with limit:
            for name, make in CASES:
                t32, tmp, ratio = time_case(make, repeats)
                rows.append([name, label, t32 * 1e3, tmp * 1e3, ratio, "<= 2"])
    for name, make in CASES:
        rows += memory_rows(name, make)
    print_table("Mixed precision vs float32: one SGD training step (autocast step includes GradScaler)\n"
                "times: medians of interleaved runs; ratio: median of pairwise ratios autocast/float32",
                ["model", "measure", "float32", "autocast", "ratio", "target"], rows)
    print("Saved activations: bytes NumPy still holds after forward + loss, graph alive (tracemalloc).\n"
          "Under autocast, conv2d keeps its float16 padded input and rebuilds the im2col columns in\n"
          "backward; in float32 it keeps the column matrix itself.\n")
    print(CAVEAT)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 15)
