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

    python benchmarks/bench_ddp.py --recovery        # elastic restart: recovery time (issue 27)

measures, for 2 and 3 workers, on shared memory (``spawn(max_restarts=1,
snapshot_every=4)``) and TCP (``python -m everyo.distributed.run``), the time
from a worker's SIGKILL (at step 12 of the seed MLP's training) to the end of
the first step after the job resumed from its in-memory snapshot: stopping the
survivors, starting every worker again (interpreter, imports, rendezvous,
``DistributedDataParallel``), loading the snapshot and one step. Targets:
<= 2 s with 2 workers, <= 3 s with 3.
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


KILL_AT, RECOVERY_STEPS, EVERY = 12, 16, 4


def recovery_worker(group, out_dir):
    """The seed MLP under DDP + elastic; the last rank dies at KILL_AT on the first attempt (timestamps in out_dir)."""
    import signal

    import everyo as eo
    from everyo.distributed import DistributedDataParallel, elastic

    widths, batch = (16, 32, 32, 1), 4096
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch // group.world_size, widths[0])).astype(np.float32)
    y = np.sin(x[:, :1])
    model = DistributedDataParallel(build(widths), group)
    optimizer = eo.SGD(model.parameters(), lr=0.01)
    state = elastic.state(model, optimizer)
    for step in range(state.step, RECOVERY_STEPS):
        if step == KILL_AT and state.restarts == 0 and group.rank == group.world_size - 1:
            with open(os.path.join(out_dir, "death"), "w") as f:
                f.write(repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        optimizer.zero_grad()
        eo.mean((model(eo.tensor(x)) - eo.tensor(y)) ** 2).backward()
        optimizer.step()
        if state.restarts and step == state.step and group.rank == 0:
            with open(os.path.join(out_dir, "resume"), "w") as f:
                f.write(repr(time.time()))


def recovery(rounds):
    import subprocess
    import tempfile

    from everyo.distributed import spawn

    print("elastic restart: death (SIGKILL at step 12) to the end of the first step after resuming, seconds")
    print(f"{'backend':<14}{'workers':>8}{'median':>10}{'max':>10}{'target':>10}{'met':>6}")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    for backend in ("shared memory", "TCP"):
        for world in (2, 3):
            times = []
            for _ in range(rounds):
                with tempfile.TemporaryDirectory() as out:
                    if backend == "TCP":
                        command = [sys.executable, "-m", "everyo.distributed.run", "--nproc", str(world)]
                        command += ["--max-restarts", "1", "--snapshot-every", str(EVERY), __file__]
                        subprocess.run(command + ["--recovery-worker", out], env=env, check=True, capture_output=True)
                    else:
                        spawn(recovery_worker, world, args=(out,), max_restarts=1, snapshot_every=EVERY)
                    with open(os.path.join(out, "death")) as f, open(os.path.join(out, "resume")) as g:
                        times.append(float(g.read()) - float(f.read()))
            target = 2.0 if world == 2 else 3.0
            worst = max(times)
            limit = f"<= {target:.0f}"
            print(
                f"{backend:<14}{world:>8}{statistics.median(times):>10.2f}{worst:>10.2f}"
                f"{limit:>10}{str(worst <= target):>6}"
            )
    print(f"load average {os.getloadavg()[0]:.2f} after the runs")


def main():
    parser = argparse.ArgumentParser(description="DistributedDataParallel benchmark")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--recovery", action="store_true", help="elastic restart's recovery time instead")
    parser.add_argument("--recovery-worker", metavar="DIR", help=argparse.SUPPRESS)  # a TCP launcher's worker
    args = parser.parse_args()
    if args.recovery_worker:
        from everyo.distributed_tcp import init_tcp_process_group

        with init_tcp_process_group() as group:
            recovery_worker(group, args.recovery_worker)
        return
    if args.recovery:
        print(f"load average {os.getloadavg()[0]:.2f}")
        recovery(args.rounds)
        return

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
