"""Data-parallel training that matches one process (the spec's "Data-parallel training" table).

    OMP_NUM_THREADS=1 python examples/distributed_training.py
    python examples/distributed_training.py --backend tcp    # TCP process group on 127.0.0.1
    python examples/distributed_training.py --backend mpi    # mpi4py, ranks started by mpiexec
    python examples/distributed_training.py --ddp            # DistributedDataParallel + DistributedSampler

Trains the spec's workload (a 64-128-128-1 MLP, 4096 samples, 60 SGD steps)
in one process, then with 1, 2 and 4 workers started by
``everyo.distributed.spawn``, each training on its shard and averaging
gradients every step. For each run it prints the rows per worker, the
training time (median over repeats of the slowest rank's loop, process start
excluded), the largest weight difference from single-process training, and
whether every rank ended with bit-identical weights. ``--backend`` picks the
process group (shared memory by default); the training loop is the same for all.
``--ddp`` wraps the model in ``DistributedDataParallel`` (rank 0's weights
broadcast, gradients averaged in buckets while backward runs) and takes each
rank's rows from ``DistributedSampler`` instead of calling
``average_gradients`` after backward on a ``shard_indices`` shard.

Exits non-zero if the drift is not at float32 rounding level (1e-5) or the
ranks disagree; timings are printed, never checked.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

import numpy as np

import everyo as eo
from everyo.distributed import (
    DistributedDataParallel,
    DistributedSampler,
    available_cores,
    average_gradients,
    elastic,
    shard_indices,
    spawn,
)

SAMPLES, FEATURES, STEPS, LR = 4096, 64, 60, 0.05
DRIFT_LIMIT = 1e-5


def build_model():
    """Same seeds on every rank, so every worker starts from the same weights."""
    return eo.Sequential(
        eo.Linear(FEATURES, 128, seed=1),
        eo.ReLU(),
        eo.Linear(128, 128, seed=2),
        eo.ReLU(),
        eo.Linear(128, 1, seed=3),
    )


def make_data(seed=0):
    rng = np.random.default_rng(seed)
    inputs = rng.standard_normal((SAMPLES, FEATURES)).astype(np.float32)
    true_w = rng.standard_normal((FEATURES, 1)).astype(np.float32) / np.sqrt(FEATURES)
    targets = (np.tanh(inputs @ true_w) + 0.1 * rng.standard_normal((SAMPLES, 1))).astype(np.float32)
    return inputs, targets


def train(inputs, targets, steps, group=None, ddp=False):
    """The spec's loop; with ``group`` it trains this rank's rows and averages gradients.

    Every step is one full batch of all the rows, so the ranks' rows together are the
    global batch either way (``shard_indices``' blocks, or the sampler's strided share).
    """
    model = build_model()
    if group is not None and ddp:
        model = DistributedDataParallel(model, group)
    optimizer = eo.SGD(model.parameters(), lr=LR)
    if group is not None:
        if ddp:
            rows = DistributedSampler(len(inputs), group, shuffle=False).indices()
        else:
            rows = shard_indices(len(inputs), group.rank, group.world_size)
        inputs, targets = inputs[rows], targets[rows]
    xs, ys = eo.tensor(inputs), eo.tensor(targets)
    first = 0
    if group is not None and ddp:  # after an elastic restart: resume from the in-memory snapshot
        first = elastic.state(model, optimizer).step
    for _ in range(first, steps):
        optimizer.zero_grad()
        residual = model(xs) - ys
        eo.mean(residual * residual).backward()
        if group is not None and not ddp:
            average_gradients(model.parameters(), group)  # (DDP averaged them during backward)
        optimizer.step()
    return [p.data.copy() for p in model.parameters()]


def worker(group, inputs, targets, steps, repeats, ddp=False):
    """Train ``repeats`` times from scratch; return the weights, the loop times and the rows."""
    seconds = []
    for _ in range(repeats):
        group.barrier()  # start the clock together: the slowest rank sets the pace
        start = time.perf_counter()
        weights = train(inputs, targets, steps, group, ddp)
        group.barrier()
        seconds.append(time.perf_counter() - start)
    rows = len(shard_indices(len(inputs), group.rank, group.world_size))
    return weights, seconds, rows


ELASTIC: dict[str, int] = {}  # --max-restarts, --snapshot-every


def launch_shm(worker_fn, world_size, args):
    return spawn(worker_fn, world_size, args=args, **ELASTIC)


def tcp_worker(shm_group, worker_fn, args):
    """Each spawned process joins a TCP group; rank 0 runs the rendezvous server in a thread.

    On several machines you would start one process per rank yourself and pass the
    server's address; here spawn starts them and its group only carries the port.
    """
    from everyo.distributed_tcp import TCPRendezvousServer, init_tcp_process_group

    rank, world_size = shm_group.rank, shm_group.world_size
    server = TCPRendezvousServer("127.0.0.1", 0, world_size) if rank == 0 else None
    try:
        port = int(shm_group.broadcast(np.array([server.port if server else 0]), root=0)[0])
        with init_tcp_process_group("127.0.0.1", port, rank, world_size) as group:
            return worker_fn(group, *args)
    finally:
        if server is not None:
            server.close()


def launch_tcp(worker_fn, world_size, args):
    return spawn(tcp_worker, world_size, args=(worker_fn, args))


def launch_mpi(worker_fn, world_size, args):
    """``mpiexec -n world_size`` runs this script with --mpi-child; each rank saves its results (.npz, no pickle)."""
    from everyo.distributed import worker_thread_env
    from everyo.distributed_mpi import find_mpiexec

    try:
        import mpi4py  # noqa: F401  (the ranks need it; fail here, before mpiexec starts them)
    except ImportError:
        raise SystemExit("--backend mpi needs mpi4py: pip install everyo-distributed[mpi]") from None
    assert worker_fn is worker, "the MPI launcher re-runs this script's own worker"
    mpiexec = find_mpiexec()
    if mpiexec is None:
        raise SystemExit("mpiexec not found (pip install everyo-distributed[mpi] installs mpich's)")
    _, _, steps, repeats, ddp = args
    threads, _ = worker_thread_env(world_size)
    with tempfile.TemporaryDirectory() as out_dir:
        subprocess.run(
            [
                mpiexec,
                "-n",
                str(world_size),
                sys.executable,
                os.path.abspath(__file__),
                "--mpi-child",
                out_dir,
                "--steps",
                str(steps),
                "--repeats",
                str(repeats),
            ]
            + (["--ddp"] if ddp else []),
            check=True,
            env={**os.environ, **threads},
        )
        results = []
        for rank in range(world_size):
            with np.load(os.path.join(out_dir, f"rank{rank}.npz"), allow_pickle=False) as saved:
                weights = [saved[f"w{i}"] for i in range(int(saved["layers"]))]
                results.append((weights, saved["seconds"].tolist(), int(saved["rows"])))
    return results


def mpi_child(out_dir, steps, repeats, ddp):
    """One MPI rank (under mpiexec): the same worker, on an MPI group, the same data."""
    from everyo.distributed_mpi import init_mpi_process_group

    with init_mpi_process_group() as group:
        inputs, targets = make_data()
        weights, seconds, rows = worker(group, inputs, targets, steps, repeats, ddp)
        np.savez(
            os.path.join(out_dir, f"rank{group.rank}.npz"),
            layers=len(weights),
            seconds=seconds,
            rows=rows,
            **{f"w{i}": w for i, w in enumerate(weights)},
        )


# --backend: each entry starts ``world_size`` workers running ``worker_fn(group, *args)``
# and returns their results by rank.
LAUNCHERS = {"shm": launch_shm, "tcp": launch_tcp, "mpi": launch_mpi}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--backend",
        choices=sorted(LAUNCHERS),
        default="shm",
        help="process group: shm = shared memory on this machine (default), "
        "tcp = TCP on 127.0.0.1, mpi = mpi4py under mpiexec",
    )
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats per run (median shown)")
    parser.add_argument(
        "--ddp", action="store_true", help="DistributedDataParallel + DistributedSampler instead of average_gradients"
    )
    parser.add_argument("--max-restarts", type=int, default=0, help="shm: restart the workers if one dies")
    parser.add_argument("--snapshot-every", type=int, default=0, help="shm + --ddp: resume from a snapshot")
    parser.add_argument("--mpi-child", metavar="DIR", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    ELASTIC.update(max_restarts=args.max_restarts, snapshot_every=args.snapshot_every)
    if args.mpi_child:
        return mpi_child(args.mpi_child, args.steps, args.repeats, args.ddp)
    launch = LAUNCHERS[args.backend]

    if "OMP_NUM_THREADS" not in os.environ:
        print(
            "note: OMP_NUM_THREADS is not set; spawn gives each worker cores // workers BLAS threads,\n"
            "      but the single-process baseline below uses NumPy's default thread count.\n"
        )
    inputs, targets = make_data()
    baseline_times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        reference = train(inputs, targets, args.steps)
        baseline_times.append(time.perf_counter() - start)

    how = "DistributedDataParallel" if args.ddp else "average_gradients"
    print(
        f"{args.steps} steps of a {FEATURES}-128-128-1 MLP over {SAMPLES} samples, backend {args.backend}, {how}, "
        f"{available_cores()} cores, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}"
    )
    print(f"single process (no spawn): {statistics.median(baseline_times):.2f} s\n")
    print(f"{'workers':>8} {'rows/worker':>13} {'seconds':>10} {'max drift':>12} {'ranks agree':>13}")
    print("-" * 62)
    ok, seconds_by_workers, notes = True, {}, []
    for world_size in args.workers:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            started = time.perf_counter()
            results = launch(worker, world_size, (inputs, targets, args.steps, args.repeats, args.ddp))
            wall = time.perf_counter() - started
        notes += [f"{world_size} workers: {w.message}" for w in caught]
        weights = [r[0] for r in results]
        seconds = statistics.median(max(r[1][i] for r in results) for i in range(args.repeats))
        drift = max(float(np.abs(w - ref).max()) for w, ref in zip(weights[0], reference))
        agree = all(all(np.array_equal(a, b) for a, b in zip(weights[0], other)) for other in weights[1:])
        rows = "/".join(sorted({str(r[2]) for r in results}, key=int))
        print(f"{world_size:>8} {rows:>13} {seconds:>10.2f} {drift:>12.2e} {str(agree):>13}")
        seconds_by_workers[world_size] = seconds
        launcher = "mpiexec" if args.backend == "mpi" else "spawn"
        notes.append(
            f"{world_size} workers: {launcher} took {wall:.2f} s in all "
            f"(process start and imports, then {args.repeats} timed runs)"
        )
        ok &= agree and drift < DRIFT_LIMIT
    print()
    if 1 in seconds_by_workers:
        for world_size, seconds in seconds_by_workers.items():
            if world_size > 1:
                print(f"speedup with {world_size} workers: {seconds_by_workers[1] / seconds:.2f}x over 1 worker")
    for note in notes:
        print("note:", note)
    if not ok:
        print(f"FAILED: drift must stay below {DRIFT_LIMIT:g} and every rank must agree", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
