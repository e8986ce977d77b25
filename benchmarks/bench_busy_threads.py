"""A busy machine: a training step with its large products on one OpenBLAS thread or on two (issue 24, item 3).

    python benchmarks/bench_busy_threads.py [--workloads mlp,lstm] [--rounds 3] [--steps 30] [--quiet]
    python benchmarks/bench_busy_threads.py --cuts [--workloads mlp,lstm,encoder,cnn,gpt]

Beside two CPU-bound processes (``harness.cpu_hogs``; ``--quiet``: without them),
each mode runs ``bench_vs_torch.py``'s EveryO step for a workload alone in a fresh
process, modes alternating (A B A B ..., same-framework A/B in separate processes,
see harness.py):

- ``landed``: as a user gets it. Every product has one OpenBLAS thread's bits
  (``everyo._blas``): on a busy machine a large product runs whole on one thread; on a
  quiet one as two row parts on everyo-kernels' pair.
- ``two threads (fifth stop)``: the large products (``_blas.SMALL_MNK`` and up) on
  OpenBLAS's two threads, as up to the fifth stop of issue 24, where a busy machine
  could take one thread only for the rare product whose bits one thread kept (core's
  ``_blas.matmul`` patched; OpenBLAS's own workers, not the fifth stop's callback).

Each process prints its median step (ms). The table gives, per mode, the median and
the range of the per-process medians.

``--cuts`` prints instead, for each large product of the workloads' steps (in one
process each, quiet), whether one BLAS thread gives it the bits of two, and which row
cuts near the middle give the one-thread bits when each part is made on one thread:
the ground for the rule (everyo-kernels' ``pair._parts_agree`` makes the same check).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import alternate_processes, blas_info, cpu_hogs, machine_info, print_table  # noqa: E402

MODES = {"landed": "landed", "two threads (fifth stop)": "two"}


def child(mode, workload, steps):
    import numpy as np

    from everyo import _blas

    if mode == "two":
        one_thread = _blas.matmul

        def two_threads(x, y, out=None):
            large = x.ndim >= 2 and y.ndim >= 2 and x.shape[-2] * x.shape[-1] * y.shape[-1] >= _blas.SMALL_MNK
            return np.matmul(x, y, out=out) if large else one_thread(x, y, out)

        _blas.matmul = two_threads
    import bench_vs_torch

    step = bench_vs_torch.everyo_step(workload, "float32")
    for _ in range(3):
        step()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    print(json.dumps({"ms": statistics.median(times) * 1e3, "busy": _blas.machine_busy()}))


def cut_candidates(m):
    """Row cuts near the middle: multiples of 24 and of 8 around it, and the middle."""
    mid = (m // 2) // 24 * 24
    return sorted(c for c in {mid - 24, mid, mid + 24, mid - 8, mid + 8, m // 2} if 0 < c < m)


def cuts_child(workload):
    import numpy as np

    from everyo import _blas

    shapes = set()
    matmul = _blas.matmul

    def recording(x, y, out=None):
        if x.ndim == 2 and y.ndim == 2 and x.shape[0] * x.shape[1] * y.shape[1] >= _blas.SMALL_MNK:
            shapes.add((x.dtype.str, *x.shape, y.shape[1], _layout(x), _layout(y)))
        return matmul(x, y, out)

    _blas.matmul = recording
    import bench_vs_torch

    step = bench_vs_torch.everyo_step(workload, "float32")
    step()
    step()
    rows = []
    for dtype, m, k, n, x_layout, y_layout in sorted(shapes):
        rng = np.random.default_rng(0)
        x = rng.standard_normal((m, k)).astype(dtype)
        y = rng.standard_normal((k, n)).astype(dtype)
        x = x if x_layout == "C" else np.asfortranarray(x)
        y = y if y_layout == "C" else np.asfortranarray(y)
        two = x @ y
        agree = []
        with _blas.single_thread():
            alone = x @ y
            for c in cut_candidates(m):
                parts = np.empty_like(alone)
                np.matmul(x[:c], y, out=parts[:c])
                np.matmul(x[c:], y, out=parts[c:])
                agree.append([c, bool(np.array_equal(parts.view(np.uint8), alone.view(np.uint8)))])
        same = bool(np.array_equal(two.view(np.uint8), alone.view(np.uint8)))
        rows.append([f"({m}, {k}) @ ({k}, {n}) {x_layout}{y_layout}", same, agree])
    print(json.dumps(rows))


def _layout(a):
    return "C" if a.flags.c_contiguous else "F" if a.flags.f_contiguous else "other"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workloads", default="mlp,lstm")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--quiet", action="store_true", help="without the two CPU-bound processes")
    parser.add_argument("--cuts", action="store_true", help="which row cuts give the one-thread bits")
    parser.add_argument("--cuts-child", help=argparse.SUPPRESS)
    parser.add_argument("--child", nargs=3, metavar=("MODE", "WORKLOAD", "STEPS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.child[1], int(args.child[2]))
        return
    if args.cuts_child:
        cuts_child(args.cuts_child)
        return
    print(machine_info())
    print(f"BLAS: {blas_info()} (default threads)")
    if args.cuts:
        me = str(Path(__file__).resolve())
        rows = []
        for workload in args.workloads.split(","):
            proc = subprocess.run([sys.executable, me, "--cuts-child", workload], capture_output=True, text=True)
            if proc.returncode:
                sys.exit(f"--cuts-child {workload} failed:\n{proc.stderr[-3000:]}")
            out = proc.stdout
            for product, same, agree in json.loads(out.strip().splitlines()[-1]):
                good = [str(c) for c, ok in agree if ok]
                bad = [str(c) for c, ok in agree if not ok]
                rows.append([workload, product, same, " ".join(good) or "none", " ".join(bad) or "none"])
        print_table(
            "Large products: one thread's bits against two, and row cuts whose parts (one thread each) give them",
            ["workload", "product", "1 thread = 2", "cuts with 1-thread bits", "cuts without"],
            rows,
        )
        return
    where = "on a quiet machine" if args.quiet else "beside two CPU-bound processes"
    print(f"{args.rounds} rounds of alternating processes, {args.steps} steps each, {where}\n")
    me = str(Path(__file__).resolve())
    rows = []
    for workload in args.workloads.split(","):
        commands = {
            name: [sys.executable, me, "--child", mode, workload, str(args.steps)] for name, mode in MODES.items()
        }
        if args.quiet:
            results = alternate_processes(commands, rounds=args.rounds)
        else:
            with cpu_hogs(2):
                results = alternate_processes(commands, rounds=args.rounds)
        for name, runs in results.items():
            ms = [r["ms"] for r in runs]
            rows.append(
                [
                    f"{workload} float32",
                    name,
                    statistics.median(ms),
                    f"{min(ms):.3g}-{max(ms):.3g}",
                    sum(r["busy"] for r in runs),
                ]
            )
    print_table(
        f"Median step time (ms) per process, {where}",
        ["workload", "mode", "median ms", "range ms", "processes busy at end"],
        rows,
    )


if __name__ == "__main__":
    main()
