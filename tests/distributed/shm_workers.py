"""Worker functions for the shared-memory tests.

They live in a plain module (not a test file) because ``spawn`` pickles the
worker by name and each new process imports it; keeping them here means the
children import only this small file and NumPy.
"""

import os
import signal
import threading
import time

import numpy as np

DTYPES = ("float16", "float32", "float64", "int32", "int64", "uint8")
SIZES = (0, 1, 7, 1000, 100_003)  # 100_003 float64 > 64 KiB per slot: forces the buffer to grow


def rank_data(rank, dtype, size):
    """Deterministic per-rank input, different on every rank (the parent recomputes it)."""
    rng = np.random.default_rng([rank, size, DTYPES.index(dtype)])
    if np.dtype(dtype).kind == "f":
        return (rng.standard_normal(size) * 10).astype(dtype)
    return rng.integers(0, 100, size).astype(dtype)


def rank_order_reference(dtype, size, mean, world):
    """What every backend must return for ``rank_data``: float64 accumulation in
    rank order, rounded once (integers: exact 64-bit sums), written plainly."""
    inputs = [rank_data(r, dtype, size) for r in range(world)]
    if np.dtype(dtype).kind == "f":
        acc = inputs[0].astype(np.float64)
        for x in inputs[1:]:
            acc = acc + x.astype(np.float64)
        return (acc / world if mean else acc).astype(dtype)
    return np.sum(np.stack(inputs).astype(np.int64), axis=0).astype(dtype)


def collectives_battery(group):
    """Every collective on every dtype and size; returns everything for the parent to check."""
    out = {"rank": group.rank, "world_size": group.world_size, "sum": {}, "mean": {}, "bcast": {}}
    for dtype in DTYPES:
        for size in SIZES:
            x = rank_data(group.rank, dtype, size)
            out["sum"][dtype, size] = group.all_reduce_sum(x)
            if np.dtype(dtype).kind == "f":
                out["mean"][dtype, size] = group.all_reduce_mean(x)
            root = size % group.world_size
            out["bcast"][dtype, size] = group.broadcast(x, root=root)
    # Shape is kept; a shrinking size after growth reuses the big buffer.
    m = np.arange(12, dtype=np.float32).reshape(3, 4) * (group.rank + 1)
    # Cancellation: a float32 (or float16) running sum of 1 + 2**k - 2**k gives 0; float64 gives 1.
    out["cancel32"] = group.all_reduce_sum(np.array([1.0, 2.0**30, -(2.0**30)][group.rank], np.float32))
    out["cancel16"] = group.all_reduce_sum(np.array([1.0, 2048.0, -2048.0][group.rank], np.float16))
    # Other inputs: a big-endian array, an everyo Tensor, a Python list, a 0-d array.
    import everyo as eo

    out["big_endian"] = group.all_reduce_sum(np.arange(4, dtype=">f4") * (group.rank + 1))
    out["tensor"] = group.all_reduce_mean(eo.tensor(np.full(3, group.rank, np.float32)))
    out["list"] = group.all_reduce_sum([1.0, 2.0])
    out["scalar"] = group.broadcast(np.array(group.rank + 0.5), root=2)
    out["matrix_sum"] = group.all_reduce_sum(m)
    out["bool_bcast"] = group.broadcast(np.array([True, False]) ^ (group.rank == 1), root=1)
    # Bad calls raise locally (same on every rank), before any communication.
    errors = {}
    for name, call in {
        "int_mean": lambda: group.all_reduce_mean(np.arange(3)),
        "bool_sum": lambda: group.all_reduce_sum(np.ones(2, bool)),
        "bad_root": lambda: group.broadcast(np.ones(2), root=group.world_size),
    }.items():
        try:
            call()
        except Exception as exc:
            errors[name] = f"{type(exc).__name__}: {exc}"
    out["errors"] = errors
    # The group still works after the refused calls.
    out["after"] = group.all_reduce_sum(np.array([group.rank], np.int64))
    # Barrier: nobody leaves before the slowest rank (rank r arrives r * 50 ms late).
    time.sleep(0.05 * group.rank)
    arrived = time.time()
    group.barrier()
    out["barrier"] = (arrived, time.time())
    return out


def thread_env(group):
    from threadpoolctl import threadpool_info

    blas = [p["num_threads"] for p in threadpool_info() if p.get("user_api") == "blas"]
    names = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
    return {name: os.environ.get(name) for name in names}, blas


def mismatched_op(group):
    x = np.ones(4, np.float32)
    if group.rank == 1:
        group.barrier()
    else:
        group.all_reduce_mean(x)


def mismatched_size(group):
    group.all_reduce_sum(np.ones(100, np.float32))  # agreed: the buffer now has 64 KiB slots
    # Rank 0's array fits the buffer, rank 1's would need it to grow: still caught, no hang.
    group.all_reduce_sum(np.ones(5 if group.rank == 0 else 100_000, np.float32))


def returns_early(group):
    group.barrier()
    if group.rank == 0:
        return "done early"
    group.all_reduce_mean(np.ones(3))


def raises_on_rank_1(group):
    if group.rank == 1:
        time.sleep(0.1)
        raise ValueError("boom from the worker")
    group.all_reduce_mean(np.ones(3))  # blocks until released


def exits_on_rank_1(group):
    if group.rank == 1:
        time.sleep(0.1)
        os._exit(3)
    group.barrier()


def killed_on_rank_1(group):
    if group.rank == 1:
        time.sleep(0.1)
        os.kill(os.getpid(), signal.SIGKILL)
    group.all_reduce_sum(np.ones(10))


def hangs_on_rank_1(group, flag=None):
    """Rank 1 never reaches the barrier. With ``flag``: once rank 0 waits in it, rank 1 creates
    the file ``flag`` (a handshake the test's clock waits for) and then blocks forever."""
    if group.rank == 1:
        if flag is not None:
            while not group._control.is_waiting(0):
                time.sleep(0.001)
            open(flag, "w").close()
        threading.Event().wait()  # forever: spawn stops this rank
    group.barrier()


def unpicklable_result(group):
    return lambda: None


def average_gradients_none(group):
    """Parameter 0: grad on every rank; 1: only on rank 1; 2: on no rank."""
    from types import SimpleNamespace

    from everyo.distributed import average_gradients

    params = [SimpleNamespace(data=np.zeros((2, 3), np.float32), grad=None) for _ in range(3)]
    params[0].grad = np.full((2, 3), group.rank + 1.0, np.float32)
    if group.rank == 1:
        params[1].grad = np.full((2, 3), 4.0, np.float32)
    average_gradients(params, group)
    return [p.grad for p in params]


def build_spec_model():
    import everyo as eo

    return eo.Sequential(
        eo.Linear(16, 32, seed=0), eo.ReLU(), eo.Linear(32, 32, seed=1), eo.ReLU(), eo.Linear(32, 1, seed=2)
    )


def one_process(inputs, targets, steps):
    """The baseline every distributed path is compared with: the same training in one process."""
    import everyo as eo

    model = build_spec_model()
    optimizer = eo.SGD(model.parameters(), lr=0.05)
    xs, ys = eo.tensor(inputs), eo.tensor(targets)
    for _ in range(steps):
        optimizer.zero_grad()
        residual = model(xs) - ys
        eo.mean(residual * residual).backward()
        optimizer.step()
    return [p.data for p in model.parameters()]


def spec_worker(group, inputs, targets, steps):
    """The spec's worker example, as written there (smaller model and data for speed)."""
    import everyo as eo
    from everyo.distributed import average_gradients, shard_indices

    model = build_spec_model()  # same seeds on every rank
    optimizer = eo.SGD(model.parameters(), lr=0.05)
    rows = shard_indices(len(inputs), group.rank, group.world_size)
    xs, ys = eo.tensor(inputs[rows]), eo.tensor(targets[rows])

    for _ in range(steps):
        optimizer.zero_grad()
        residual = model(xs) - ys
        eo.mean(residual * residual).backward()
        average_gradients(model.parameters(), group)
        optimizer.step()

    return [p.data for p in model.parameters()]


def loops_forever(group, pid_dir):
    """Writes its pid, then keeps calling collectives until it is stopped from outside."""
    x = np.ones(10)
    group.all_reduce_sum(x)  # the pid file appears once every rank is inside the loop (the test waits for it)
    path = os.path.join(pid_dir, f"rank{group.rank}.pid")
    with open(path + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(path + ".tmp", path)
    while True:
        group.all_reduce_sum(x)
        time.sleep(0.005)


# -- all_gather, reduce_scatter, broadcast from every root, bfloat16: the same battery on every backend --


def gather_dtypes():
    try:
        import ml_dtypes  # noqa: F401
    except ImportError:
        return DTYPES + ("bool",)
    return DTYPES + ("bool", "bfloat16")


GATHER_SIZES = (0, 1, 7, 100_003)
SCATTER_ROWS = (0, 1, 2, 5, 40_001)  # fewer rows than ranks too; 40_001 x 3 float64 > 64 KiB


def as_dtype(name):
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def rank_array(rank, dtype, shape):
    """Deterministic per-rank input of any dtype the collectives take (bfloat16 included)."""
    size = int(np.prod(shape))
    rng = np.random.default_rng([rank, size, len(dtype)])
    if dtype == "bool":
        return (rng.integers(0, 2, size) == 1).reshape(shape)
    if dtype in ("bfloat16", "float16", "float32", "float64"):
        return (rng.standard_normal(size) * 10).astype(as_dtype(dtype)).reshape(shape)
    return rng.integers(0, 100, size).astype(dtype).reshape(shape)


def bits(array):
    """An array's exact bits as a plain NumPy array (saves bfloat16 through np.savez too)."""
    array = np.ascontiguousarray(array)
    return array.view(np.uint8).reshape(array.shape + (array.dtype.itemsize,))


def more_collectives_battery(group):
    """all_gather, reduce_scatter_sum/mean, broadcast from every root, bfloat16 all-reduce, then a mismatch.

    Returns ``{name: bits}`` (see :func:`bits`) plus ``"mismatch"``: the error the last, mismatched call raised.
    """
    out = {}
    for dtype in gather_dtypes():
        for size in GATHER_SIZES:
            out[f"gather|{dtype}|{size}"] = bits(group.all_gather(rank_array(group.rank, dtype, (size,))))
        if dtype == "bool":
            continue
        for rows in SCATTER_ROWS:
            x = rank_array(group.rank, dtype, (rows, 3))
            out[f"rs_sum|{dtype}|{rows}"] = bits(group.reduce_scatter_sum(x))
            if as_dtype(dtype).kind in "fV":
                out[f"rs_mean|{dtype}|{rows}"] = bits(group.reduce_scatter_mean(x))
        for root in range(group.world_size):
            out[f"bcast|{dtype}|{root}"] = bits(group.broadcast(rank_array(group.rank, dtype, (100_003,)), root=root))
    if "bfloat16" in gather_dtypes():
        for size in (7, 100_003):
            x = rank_array(group.rank, "bfloat16", (size,))
            out[f"ar_sum|bfloat16|{size}"] = bits(group.all_reduce_sum(x))
            out[f"ar_mean|bfloat16|{size}"] = bits(group.all_reduce_mean(x))
    try:
        group.all_gather(np.ones(5 + group.rank, np.float32))  # sizes 5, 6, 7: every rank must raise
    except Exception as exc:  # noqa: BLE001 - recorded for the test
        out["mismatch"] = f"{type(exc).__name__}: {exc}"
    else:
        out["mismatch"] = "no error"
    return out


def everyone_works_then_meets(group, seconds=1.5, meet_dir=None):
    """In step, every rank computes for a while outside the collectives (nobody waits), then a barrier.

    With ``meet_dir``, the ranks first meet through files there, outside the collectives, so that a
    slow start-up of one rank (a loaded machine) is not a rank waiting in a collective.
    """
    if meet_dir is not None:
        open(os.path.join(meet_dir, f"ready{group.rank}"), "w").close()
        while not all(os.path.exists(os.path.join(meet_dir, f"ready{r}")) for r in range(group.world_size)):
            time.sleep(0.001)
    group.barrier()
    time.sleep(seconds)
    group.barrier()
    return group.rank


def large_pair_reductions(group):
    """Two ranks' float all-reduces above the split threshold (each rank reduces all of it directly)."""
    out = {}
    for dtype in ("float16", "float32", "float64"):
        x = rank_data(group.rank, dtype, 100_003)
        out[dtype] = (group.all_reduce_sum(x), group.all_reduce_mean(x))
    return out


SHAPE_OPS = ("all_gather", "reduce_scatter_sum", "all_reduce_sum", "broadcast")


def shape_mismatch(group, op):
    """``op`` on 12 float32 elements shaped (2, 6) on rank 0 and (3, 4) elsewhere; returns the error raised."""
    from everyo.errors import EveryODistributedError

    x = np.arange(12, dtype=np.float32).reshape((2, 6) if group.rank == 0 else (3, 4))
    try:
        getattr(group, op)(x)
    except EveryODistributedError as exc:
        return f"{type(exc).__name__}: {exc}"
    return "no error"
