"""Training that is killed and resumed from the in-memory snapshot (everyo.distributed.elastic).

``train(group, kind, steps, kill_at, every)``: the seed MLP (``mlp``) or the
digit CNN (``cnn``) under DistributedDataParallel, batches from
DistributedSampler chosen by the step number, Dropout (the model's random
stream) and a loss weight drawn from ``numpy.random``'s global state after
the forward pass (so the snapshot's random states matter). On the first
attempt, rank ``world_size - 1`` SIGKILLs itself at the start of step
``kill_at`` (``-1``: never). Returns the final weights, this rank's loss at
every step it ran, and the step it resumed from.

As a script (``python elastic_workers.py KIND STEPS KILL_AT OUT_DIR``) it is
a worker of ``python -m everyo.distributed.run`` and saves the same as
``OUT_DIR/rank{r}.npz``.
"""

import importlib.util
import os
import signal
import sys
from pathlib import Path

import numpy as np

BATCH = 16
DIGITS = Path(__file__).resolve().parents[1] / "core" / "digits.py"


def data(kind):
    if kind == "mlp":
        rng = np.random.default_rng(0)
        x = rng.standard_normal((256, 64)).astype(np.float32)
        return x, np.tanh(x[:, :1] - x[:, 1:2]).astype(np.float32)
    spec = importlib.util.spec_from_file_location("everyo_test_digits", DIGITS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.make_digits(256, seed=0)


def build(kind, rank):
    import everyo as eo

    if kind == "mlp":  # the spec's MLP, narrower, with Dropout
        return eo.Sequential(
            eo.Linear(64, 32, seed=1),
            eo.ReLU(),
            eo.Dropout(0.1, seed=100 + rank),
            eo.Linear(32, 32, seed=2),
            eo.ReLU(),
            eo.Linear(32, 1, seed=3),
        )
    return eo.Sequential(
        eo.Conv2D(1, 8, 3, padding="same", seed=0),
        eo.ReLU(),
        eo.MaxPool2D(2),
        eo.Flatten(),
        eo.Dropout(0.1, seed=100 + rank),
        eo.Linear(4 * 4 * 8, 10, seed=1),
    )


def train(group, kind, steps, kill_at, every=None):
    """``kind``: ``mlp``, ``cnn``, or ``mlp_amp`` (the MLP under autocast with a GradScaler)."""
    import everyo as eo
    from everyo.distributed import DistributedDataParallel, DistributedSampler, elastic

    amp = kind.endswith("_amp")
    kind = kind.removesuffix("_amp")
    np.random.seed(group.rank)  # noqa: NPY002 - the global stream, which the snapshot must restore
    x, y = data(kind)
    model = DistributedDataParallel(build(kind, group.rank), group)
    optimizer = eo.SGD(model.parameters(), lr=0.05, momentum=0.9) if kind == "mlp" else eo.Adam(model.parameters())
    sampler = DistributedSampler(len(x), group, seed=3)
    scaler = None
    if amp:
        from everyo.amp import GradScaler

        scaler = GradScaler(init_scale=2.0**16, growth_interval=3)  # overflows, skips and growth within the run
    state = elastic.state(model, optimizer, sampler=sampler, scaler=scaler)
    per_epoch = len(sampler) // BATCH
    losses = np.full(steps, np.nan, np.float64)
    for step in range(state.step, steps):
        if step == kill_at and state.restarts == 0 and group.rank == group.world_size - 1:
            os.kill(os.getpid(), signal.SIGKILL)
        epoch, b = divmod(step, per_epoch)
        sampler.set_epoch(epoch)
        rows = sampler.indices()[b * BATCH : (b + 1) * BATCH]
        optimizer.zero_grad()
        if amp:
            from everyo.amp import autocast

            with autocast():
                out = model(eo.tensor(x[rows]))
        else:
            out = model(eo.tensor(x[rows]))
        weight = np.float32(np.random.uniform(0.5, 1.5))  # noqa: NPY002 - the global stream, drawn after the snapshot point
        if kind == "mlp":
            loss = eo.mean((out - eo.tensor(y[rows])) ** 2) * weight
        else:
            loss = eo.cross_entropy(out, y[rows]) * weight
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            optimizer.step()
        losses[step] = float(loss.data)
    return {
        "params": [p.data.copy() for p in model.parameters()],
        "losses": losses,
        "resumed": state.step,
        "restarts": state.restarts,
    }


def main(argv):
    from everyo.distributed_tcp import init_tcp_process_group

    if argv[0] == "always_dies":
        with init_tcp_process_group() as group:
            always_dies(group)
        return
    kind, steps, kill_at, out_dir = argv[0], int(argv[1]), int(argv[2]), argv[3]

    with init_tcp_process_group() as group:
        result = train(group, kind, steps, kill_at)
    params = {f"p{i}": p for i, p in enumerate(result.pop("params"))}
    np.savez(os.path.join(out_dir, f"rank{group.rank}.npz"), **params, **result)


def always_dies(group):
    """Rank 1 exits with code 3 after the first collective, on every attempt."""
    group.barrier()
    if group.rank == 1:
        os._exit(3)
    group.barrier()


if __name__ == "__main__":
    main(sys.argv[1:])
