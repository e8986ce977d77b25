"""One training loop in which rank 1 fails, the same way on every backend (spawn, the TCP launcher, mpiexec).

``train(group, fault, place)`` trains a small MLP with DistributedDataParallel
and DistributedSampler; at step 2 rank 1 fails while rank 0 is (or will soon
be) waiting for it in a collective. ``fault``: ``raise`` (ValueError),
``exit`` (``os._exit(3)``), ``signal`` (SIGKILL to itself), ``hang`` (blocks
forever). ``place``:

* ``collective`` -- a plain ``all_reduce_mean`` loop (no DDP);
* ``ddp_bucket`` -- inside backward, in the gradient hook of the model's first
  parameter (the last bucket to complete), after the other buckets were sent;
* ``no_sync`` -- inside a ``no_sync()`` backward (no communication of its own);
* ``sampler`` -- while iterating the DistributedSampler, before the step's forward.

Run as a script (``python fault_workers.py FAULT PLACE``), it is a worker of
``python -m everyo.distributed.run`` or of ``mpiexec`` (``--mpi``).
"""

import os
import signal
import sys
import threading

import numpy as np

FAULTS = ("raise", "exit", "signal", "hang")
PLACES = ("collective", "ddp_bucket", "no_sync", "sampler")
FAULT_STEP = 2


def fail(fault):
    if fault == "raise":
        raise ValueError("boom on rank 1")
    if fault == "exit":
        os._exit(3)
    if fault == "signal":
        os.kill(os.getpid(), signal.SIGKILL)
    if fault == "hang":
        threading.Event().wait()  # forever: nothing sets it
    raise AssertionError(f"unknown fault {fault!r}")


def _faulty_rows(rows, fault, active):
    for i, row in enumerate(rows):
        if active and i == 3:
            fail(fault)
        yield row


def train(group, fault, place):
    import everyo as eo
    from everyo.distributed import DistributedDataParallel, DistributedSampler

    faulty = group.rank == 1
    if place == "collective":
        for step in range(FAULT_STEP + 3):
            if faulty and step == FAULT_STEP:
                fail(fault)
            group.all_reduce_mean(np.full(8, step, np.float32))
        return "finished"
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 8)).astype(np.float32)
    y = x[:, :1] * 2
    model = eo.Sequential(eo.Linear(8, 16, seed=1), eo.ReLU(), eo.Linear(16, 16, seed=2), eo.Linear(16, 1, seed=3))
    ddp = DistributedDataParallel(model, group, bucket_cap_mb=16 * 16 * 4 / 2**20)  # several buckets
    optimizer = eo.SGD(ddp.parameters(), lr=0.01)
    sampler = DistributedSampler(len(x), group, seed=1)
    first = model.parameters()[0]  # registered first: its gradient is the last one backward produces
    state = {"step": 0}

    def hook(_param):
        if faulty and state["step"] == FAULT_STEP and place == "ddp_bucket":
            fail(fault)

    first.register_post_accumulate_grad_hook(hook)
    for step in range(FAULT_STEP + 3):
        state["step"] = step
        active = faulty and step == FAULT_STEP and place == "sampler"
        rows = np.array(list(_faulty_rows(iter(sampler), fault, active)))[:8]
        optimizer.zero_grad()
        loss = eo.mean((ddp(eo.tensor(x[rows])) - eo.tensor(y[rows])) ** 2)
        if place == "no_sync":
            with ddp.no_sync():
                loss.backward()
                if faulty and step == FAULT_STEP:
                    fail(fault)
            loss = eo.mean((ddp(eo.tensor(x[rows])) - eo.tensor(y[rows])) ** 2)
        loss.backward()
        optimizer.step()
    return "finished"


def main(argv):
    fault, place = argv[:2]
    if "--mpi" in argv:
        from everyo.distributed_mpi import init_mpi_process_group

        group = init_mpi_process_group()
    else:
        from everyo.distributed_tcp import init_tcp_process_group

        group = init_tcp_process_group()
        if fault == "hang":
            group.timeout = 1.0  # rank 0 gives up on the stuck rank after 1 s without progress
    with group:
        train(group, fault, place)


if __name__ == "__main__":
    main(sys.argv[1:])
