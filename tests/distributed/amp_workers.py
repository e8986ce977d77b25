"""Worker for the GradScaler data-parallel test (a plain module: ``spawn``
pickles workers by name and each child imports this file)."""

import numpy as np

POISONED_STEP = 3  # the step at which rank 1 (or, in one process, the batch) gets an inf gradient


def build_model():
    import everyo as eo

    return eo.Sequential(eo.Linear(16, 12, seed=0), eo.ReLU(), eo.Linear(12, 1, seed=1))


def train(inputs, targets, steps, group=None):
    """Autocast + GradScaler training; with ``group``, on this rank's shard with
    averaged gradients. Returns (step applied?, scale) per step and the weights."""
    import everyo as eo
    from everyo.distributed import average_gradients, shard_indices

    model = build_model()
    optimizer = eo.SGD(model.parameters(), lr=0.05)
    scaler = eo.GradScaler(init_scale=2.0**8, growth_interval=2)
    if group is not None:
        rows = shard_indices(len(inputs), group.rank, group.world_size)
        inputs, targets = inputs[rows], targets[rows]
    xs, ys = eo.tensor(inputs), eo.tensor(targets)
    history = []
    for step in range(steps):
        optimizer.zero_grad()
        with eo.autocast():
            out = model(xs)
        scaler.backward(eo.mse_loss(out, ys))
        if step == POISONED_STEP and (group is None or group.rank == 1):
            model[0].weight.grad[0, 0] = np.inf  # only this rank's gradients overflowed
        if group is not None:
            average_gradients(model.parameters(), group)
        history.append((scaler.step(optimizer), scaler.get_scale()))
        scaler.update()
    return history, [p.data for p in model.parameters()]


def scaler_worker(group, inputs, targets, steps):
    return train(inputs, targets, steps, group)
