"""Workers whose launcher is SIGKILLed (test_launcher_killed.py).

Each rank trains a few steps with elastic snapshots (so there are segments in
/dev/shm to clean up), creates ``FLAG_DIR/rank{r}`` and blocks forever.

    python orphan_workers.py spawn FLAG_DIR   # the spawn parent is this process
    python orphan_workers.py tcp FLAG_DIR     # a worker of python -m everyo.distributed.run
"""

import os
import sys
import threading

import numpy as np

STEPS = 3


def snapshot_then_wait(group, flag_dir):
    from elastic_workers import build

    import everyo as eo
    from everyo.distributed import DistributedDataParallel, elastic

    model = DistributedDataParallel(build("mlp", group.rank), group)
    optimizer = eo.SGD(model.parameters(), lr=0.05)
    state = elastic.state(model, optimizer)
    x = np.ones((4, 64), np.float32)
    for _ in range(state.step, STEPS):
        optimizer.zero_grad()
        eo.mean(model(eo.tensor(x)) ** 2).backward()
        optimizer.step()
    model(eo.tensor(x))  # the forward pass after the last step takes the last snapshot
    open(os.path.join(flag_dir, f"rank{group.rank}"), "w").close()
    threading.Event().wait()  # until the launcher's death takes this process with it


def main(mode, flag_dir):
    if mode == "spawn":
        from everyo.distributed import spawn

        spawn(snapshot_then_wait, 2, args=(flag_dir,), snapshot_every=1, max_restarts=1)
    else:
        from everyo.distributed_tcp import init_tcp_process_group

        with init_tcp_process_group() as group:
            snapshot_then_wait(group, flag_dir)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main(*sys.argv[1:])
