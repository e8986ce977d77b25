"""DistributedDataParallel: 2 workers vs 1 on the same global batches, and how much communication backward hides.

    python benchmarks/bench_ddp.py                   # seed MLP and a 6.8M-parameter MLP, shared memory
    python benchmarks/bench_ddp.py --rounds 5 --steps 20

For each model it times optimizer steps (forward, backward, step) on a global
batch: one process on the whole batch, then two ``spawn``-ed workers wrapped
in ``DistributedDataParallel``, each on half of it, then the same two workers
each training on its half *alone* (no wrapper, no communication): that last
run is the ceiling, what two workers could reach if averaging the gradients
cost nothing. (Each worker still runs the whole optimizer step, and half a
batch is rarely half the work, so the ceiling is below 2x.) The three runs
alternate, round after round (these machines flip between fast and slow
states), and the speedup columns are medians of the per-round ratios. ``bucket time`` is what
the background thread spent per step on buckets (flatten + all-reduce),
``exposed`` how long ``backward()`` waited for them at its end, and
``hidden = 1 - exposed / bucket time`` (clipped at 0: on an overloaded
machine the thread may not even be scheduled before backward ends).
Run it as the spec's training is run, ``OMP_NUM_THREADS=1``: on a busy
machine a multi-threaded BLAS in the single process spin-waits for cores.

Target (issue 15): 2 workers >= 1.85x one process on both models.
"""

import argparse
import os
import platform
import statistics
import sys
import time

import numpy as np

MODELS = {
    # name: (layer widths, global batch)
    "seed MLP (16-32-32-1), 4096 rows": ((16, 32, 32, 1), 4096),
    "6.8M MLP, 256 rows": ((1024, 2048, 2048, 256), 256),
    "6.8M MLP, 2048 rows": ((1024, 2048, 2048, 256), 2048),
}


def build(widths):
    import everyo as eo

    layers = []
    for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
        layers.append(eo.Linear(a, b, seed=i))
        if i < len(widths) - 2:
            layers.append(eo.ReLU())
    return eo.Sequential(*layers)


def run(group, widths, batch, steps, wrap=True):
    """Median seconds per step (after two warm-up steps), plus DDP's communication figures.

    ``wrap=False``: each rank trains on its rows alone (the no-communication ceiling).
    """
    import everyo as eo
    from everyo.distributed import DistributedDataParallel

    world = 1 if group is None else group.world_size
    rank = 0 if group is None else group.rank
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, widths[0])).astype(np.float32)
    y = rng.standard_normal((batch, widths[-1])).astype(np.float32)
    rows = slice(rank * batch // world, (rank + 1) * batch // world)
    xs, ys = eo.tensor(x[rows]), eo.tensor(y[rows])
    model = build(widths)
    wrapped = group is not None and wrap
    if wrapped:
        model = DistributedDataParallel(model, group)
    optimizer = eo.SGD(model.parameters(), lr=1e-3)
    times = []
    for step in range(steps + 2):
        if group is not None:
            group.barrier()
        start = time.perf_counter()
        optimizer.zero_grad()
        residual = model(xs) - ys
        eo.mean(residual * residual).backward()
        optimizer.step()
        if step >= 2:
            times.append(time.perf_counter() - start)
        if step == 1 and wrapped:
            model.comm_seconds = model.wait_seconds = 0.0
    out = {"step": statistics.median(times)}
    if wrapped:
        out["comm"], out["wait"] = model.comm_seconds / steps, model.wait_seconds / steps
    return out


def worker(group, widths, batch, steps, wrap=True):
    return run(group, widths, batch, steps, wrap)


def main():
    parser = argparse.ArgumentParser(description="DistributedDataParallel benchmark")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()

    from threadpoolctl import threadpool_info

    from everyo.distributed import available_cores, spawn

    blas = [
        f"{p.get('internal_api')} {p.get('version')} ({p.get('threading_layer')}, threads={p.get('num_threads')})"
        for p in threadpool_info()
        if p.get("user_api") == "blas"
    ]
    print(
        f"{available_cores()} cores, {platform.machine()}, Python {platform.python_version()}, NumPy {np.__version__}"
    )
    print(
        f"BLAS: {', '.join(blas) or 'unknown'}; OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    if "OMP_NUM_THREADS" not in os.environ:
        print("one process uses every core's BLAS threads; each of the 2 workers gets cores // 2 (spawn's default)")
    print()
    rows = []
    for name, (widths, batch) in MODELS.items():
        singles, pairs, ratios, ceilings = [], [], [], []
        # the 2048-row run takes ~8x longer per step: fewer steps keep the benchmark to about a minute
        steps = args.steps if batch * widths[0] <= 2**18 else max(3, args.steps // 4)
        for r in range(args.rounds):
            single = spawn(worker, 1, args=(widths, batch, steps))[0]
            pair = spawn(worker, 2, args=(widths, batch, steps))
            alone = spawn(worker, 2, args=(widths, batch, steps, False))
            step2 = max(p["step"] for p in pair)
            singles.append(single["step"])
            pairs.append(pair)
            ratios.append(single["step"] / step2)
            ceilings.append(single["step"] / max(p["step"] for p in alone))
            print(f"  {name}: round {r + 1}/{args.rounds} done", file=sys.stderr)
        comm = statistics.median(p[0]["comm"] for p in pairs)
        wait = statistics.median(p[0]["wait"] for p in pairs)
        rows.append(
            (
                name,
                statistics.median(singles),
                statistics.median(max(p[0]["step"], p[1]["step"]) for p in pairs),
                statistics.median(ratios),
                statistics.median(ceilings),
                comm,
                wait,
                max(0.0, 1 - wait / comm) if comm else float("nan"),
            )
        )
    header = (
        "model",
        "1 process",
        "2 workers",
        "speedup",
        "ceiling",
        "bucket time",
        "exposed",
        "hidden",
        "target",
        "met",
    )
    print("  ".join(f"{h:>12}" if i else f"{h:<34}" for i, h in enumerate(header)))
    for name, one, two, speedup, ceiling, comm, wait, hidden in rows:
        cells = (
            f"{one * 1e3:.2f} ms",
            f"{two * 1e3:.2f} ms",
            f"{speedup:.2f}x",
            f"{ceiling:.2f}x",
            f"{comm * 1e3:.2f} ms",
            f"{wait * 1e3:.2f} ms",
            f"{hidden:.0%}",
            ">= 1.85x",
            str(speedup >= 1.85),
        )
        print(f"{name:<34}  " + "  ".join(f"{c:>12}" for c in cells))
    print()
    print(
        "ceiling: one process / the two workers training alone on their halves (no communication at all); "
        "a speedup can only approach it"
    )


if __name__ == "__main__":
    main()
