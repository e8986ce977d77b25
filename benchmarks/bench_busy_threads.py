"""A busy machine: a training step with its large products on OpenBLAS's two threads or on one (issue 24, item 3).

    python benchmarks/bench_busy_threads.py [--workloads mlp,lstm] [--rounds 3] [--steps 30] [--quiet]

Beside two CPU-bound processes (``harness.cpu_hogs``; ``--quiet``: without them),
each mode runs ``bench_vs_torch.py``'s EveryO step for a workload alone in a fresh
process, modes alternating (A B C A B C ..., same-framework A/B in separate
processes, see harness.py):

- ``landed``: as a user gets it. On a busy machine core moves a large product to one
  BLAS thread only where one thread gives it the same bits as two
  (``_blas._alone_same``); the others stay on OpenBLAS's two threads, and
  everyo-kernels gives OpenBLAS its own threads back while busy (``pair._steer``).
- ``one thread (other bits)``: every large product on one thread while busy
  (``_alone_same`` patched to say True). **Not a mode EveryO offers**: on a CPU where
  one thread and two give a product other bits, a result would then depend on how
  busy the machine was. It measures what thread-count-independent product bits would
  give a busy machine.
- ``jobs kept on the pair``: everyo-kernels' OpenBLAS callback kept while busy
  (``pair._steer`` patched to keep it), the design before 915fe55.

Each process prints its median step (ms), and how many of the step's large products
(distinct shape and layout) have the same bits on one thread as on two. The table
gives, per mode, the median and the range of the per-process medians.

``--cuts`` prints instead, for each large product of the workloads' steps (in one
process each, quiet), whether one BLAS thread gives it the bits of two, and which row
cuts near the middle give the one-thread bits when each part is made on one thread
(the ground for a design whose bits do not depend on the thread count: one thread's
bits everywhere, two row parts on two threads where the machine is quiet).
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

MODES = {"landed": "landed", "one thread (other bits)": "one", "jobs kept on the pair": "keep"}


def child(mode, workload, steps):
    from everyo import _blas

    if mode == "one":
        _blas._alone_same = lambda *a, **k: True  # measurement only: other bits on a busy machine
    elif mode == "keep":
        from everyo.kernels import pair

        steer = pair._steer
        pair._steer = lambda on: steer(True)
    import bench_vs_torch

    step = bench_vs_torch.everyo_step(workload, "float32")
    for _ in range(3):
        step()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    checked = list(_blas._alone.values())
    print(
        json.dumps(
            {
                "ms": statistics.median(times) * 1e3,
                "checked": None if mode == "one" else [sum(checked), len(checked)],
                "busy": _blas.machine_busy(),
            }
        )
    )


def cut_candidates(m):
    """Row cuts near the middle: multiples of 24 and of 8 around it, and the middle."""
    mid = (m // 2) // 24 * 24
    return sorted(c for c in {mid - 24, mid, mid + 24, mid - 8, mid + 8, m // 2} if 0 < c < m)


def cuts_child(workload):
    import numpy as np

    from everyo import _blas

    shapes = {}
    check = _blas._alone_same

    def recording(*key):
        shapes[key] = check(*key)
        return shapes[key]

    _blas._alone_same = recording
    import bench_vs_torch

    step = bench_vs_torch.everyo_step(workload, "float32")
    step()
    step()
    rows = []
    for key, same in shapes.items():
        dtype, m, k, n, x_layout, y_layout = key
        rng = np.random.default_rng(0)
        x = rng.standard_normal((m, k)).astype(dtype)
        y = rng.standard_normal((k, n)).astype(dtype)
        x = x if x_layout == "C" else np.asfortranarray(x)
        y = y if y_layout == "C" else np.asfortranarray(y)
        agree = []
        with _blas.single_thread():
            alone = x @ y
            for c in cut_candidates(m):
                parts = np.empty_like(alone)
                np.matmul(x[:c], y, out=parts[:c])
                np.matmul(x[c:], y, out=parts[c:])
                agree.append([c, bool(np.array_equal(parts.view(np.uint8), alone.view(np.uint8)))])
        rows.append([f"({m}, {k}) @ ({k}, {n}) {x_layout}{y_layout}", bool(same), agree])
    print(json.dumps(rows))


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
                    "not checked" if runs[0]["checked"] is None else "{} of {}".format(*runs[0]["checked"]),
                    sum(r["busy"] for r in runs),
                ]
            )
    print_table(
        f"Median step time (ms) per process, {where}",
        ["workload", "mode", "median ms", "range ms", "1-thread bits = 2-thread", "processes busy at end"],
        rows,
    )


if __name__ == "__main__":
    main()
