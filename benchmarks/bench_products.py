"""The matrix products of bench_vs_torch's workloads, EveryO's BLAS against PyTorch's (issue 24).

    python benchmarks/bench_products.py [--rounds 3] [--workloads mlp,cnn,gpt] [--torch-python PATH]

Each product of a workload's float32 training step, with the shapes and operand layouts
EveryO's layers use (a transposed operand is a transposed view, as in the weight gradient
``x.T @ g``), timed alone: EveryO through core's own product helper (``functional._mm``:
NumPy's matmul on NumPy's BLAS, under core's thread rule, into a recycled buffer), PyTorch
through ``torch.matmul`` on tensors sharing the same memory layouts. Each side runs alone in its
own process, processes alternating (A B A B, ``--rounds``), at default threads (the headline)
and with one thread each (``OPENBLAS_NUM_THREADS=1`` / ``OMP_NUM_THREADS=1``, labelled): the
figure per product is the ratio of the medians of the per-process medians.

What it shows: how much of a workload's gap to PyTorch is the BLAS itself (OpenBLAS against
the MKL / oneDNN in torch's wheel) and how each side's products scale from one thread to two.
Torch missing: it says so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import alternate_processes, blas_info, machine_info, print_table, ratio_of_medians, torch_or_say  # noqa: E402

# name -> (m, k, n, x transposed, y transposed): out (m, n) = x (m, k) @ y (k, n), where a
# transposed operand is the .T view of a C-contiguous array, as EveryO's backward passes make it.
PRODUCTS = {
    "mlp": {
        "fwd 4096x64 @ 64x128": (4096, 64, 128, False, False),
        "fwd 4096x128 @ 128x128": (4096, 128, 128, False, False),
        "dW 64x4096 @ 4096x128 (x.T @ g)": (64, 4096, 128, True, False),
        "dW 128x4096 @ 4096x128 (x.T @ g)": (128, 4096, 128, True, False),
        "dx 4096x128 @ 128x128 (g @ W.T)": (4096, 128, 128, False, True),
    },
    "cnn": {
        "conv2 fwd 25088x288 @ 288x64": (25088, 288, 64, False, False),
        "conv2 dW 288x25088 @ 25088x64 (cols.T @ g)": (288, 25088, 64, True, False),
        "conv2 dcols 25088x64 @ 64x288 (g @ W.T)": (25088, 64, 288, False, True),
        "conv1 fwd 100352x9 @ 9x32": (100352, 9, 32, False, False),
    },
    "gpt": {
        "qkv 2048x128 @ 128x384": (2048, 128, 384, False, False),
        "ff1 2048x128 @ 128x512": (2048, 128, 512, False, False),
        "ff2 2048x512 @ 512x128": (2048, 512, 128, False, False),
        "ff1 dW 128x2048 @ 2048x512 (x.T @ g)": (128, 2048, 512, True, False),
        "ff2 dx 2048x128 @ 128x512 (g @ W.T)": (2048, 128, 512, False, True),
    },
}
REPEATS = {"mlp": 200, "cnn": 20, "gpt": 100}


def _operands(m, k, n, xt, yt):
    """x (m, k) and y (k, n); a transposed one is the .T view of a C-contiguous array."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((k, m) if xt else (m, k), dtype=np.float32)
    y = rng.standard_normal((n, k) if yt else (k, n), dtype=np.float32)
    return (x.T if xt else x), (y.T if yt else y)


def child(framework, workload):
    """One process, one framework: each product's median time in microseconds, as one JSON line."""
    if framework == "torch":
        import torch

        def product(x, y):  # torch.from_numpy keeps a view's strides: the same layouts
            return lambda: torch.matmul(torch.from_numpy(x), torch.from_numpy(y))
    else:
        from everyo.functional import _mm

        def product(x, y):
            return lambda: _mm(x, y)

    result = {}
    for name, shape in PRODUCTS[workload].items():
        run = product(*_operands(*shape))
        for _ in range(3):
            run()
        times = []
        for _ in range(REPEATS[workload]):
            t0 = time.perf_counter()
            run()
            times.append(time.perf_counter() - t0)
        result[name] = statistics.median(times) * 1e6
    print(json.dumps(result))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workloads", default=",".join(PRODUCTS))
    parser.add_argument("--torch-python", default=sys.executable, help="interpreter with torch (default: this one)")
    parser.add_argument("--child", nargs=2, metavar=("FRAMEWORK", "WORKLOAD"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(*args.child)
    torch_version = torch_or_say(args.torch_python)
    if torch_version is None:
        return 0
    print("EveryO's products vs PyTorch's, each alone in its own process:", machine_info())
    print(f"EveryO: BLAS {blas_info()}; torch {torch_version[0]}, {torch_version[1]} threads ({args.torch_python})")
    print(f"{args.rounds} rounds of alternating processes; figure = ratio of medians of per-process medians")
    me = str(Path(__file__).resolve())
    one = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    rows = []
    for workload in [w for w in args.workloads.split(",") if w]:
        if workload not in PRODUCTS:
            raise SystemExit(f"unknown workload {workload!r}; choose from {', '.join(PRODUCTS)}")
        commands = {
            "everyo": [sys.executable, me, "--child", "everyo", workload],
            "torch": [args.torch_python, me, "--child", "torch", workload],
            "everyo 1 thread": [sys.executable, me, "--child", "everyo", workload],
            "torch 1 thread": [args.torch_python, me, "--child", "torch", workload],
        }
        env = {"everyo 1 thread": one, "torch 1 thread": one}
        res = alternate_processes(commands, rounds=args.rounds, env=env)
        for name, (m, k, n, _, _) in PRODUCTS[workload].items():
            med = {side: statistics.median(r[name] for r in runs) for side, runs in res.items()}
            flops = 2 * m * k * n
            rows.append(
                [
                    f"{workload}: {name}",
                    med["everyo"],
                    med["torch"],
                    ratio_of_medians([r[name] for r in res["everyo"]], [r[name] for r in res["torch"]]),
                    flops / med["everyo"] / 1e3,
                    flops / med["torch"] / 1e3,
                    med["everyo 1 thread"] / med["everyo"],
                    med["torch 1 thread"] / med["torch"],
                ]
            )
    print_table(
        "\nEach product alone (median us at default threads; '1-thread/default': the one-thread processes' median"
        " over the default ones', how much the second thread gives)",
        [
            "product",
            "everyo us",
            "torch us",
            "everyo/torch",
            "everyo GFLOP/s",
            "torch GFLOP/s",
            "everyo 1-thread/default",
            "torch 1-thread/default",
        ],
        rows,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
