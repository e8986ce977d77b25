"""Training functions for the DistributedDataParallel tests: every backend runs these, one process too.

They live in a plain module because ``spawn`` pickles workers by name and MPI
ranks import them; every function takes the group (``None``: one process).
"""

import numpy as np

STEPS = 6
PER_RANK_BATCH = 16


def data(kind, n=96):
    rng = np.random.default_rng(7)
    if kind == "mlp":
        x = rng.standard_normal((n, 16)).astype(np.float32)
        return x, np.sin(x[:, :1] * 2).astype(np.float32)
    x = rng.standard_normal((n, 6, 8)).astype(np.float32)  # (batch, sequence, d_model)
    return x, np.tanh(x.sum(axis=2, keepdims=True)).astype(np.float32)


def build(kind, seed):
    """The same architecture on every rank; ``seed`` differs per rank so DDP's broadcast is what aligns them."""
    import everyo as eo

    if kind == "mlp":
        return eo.Sequential(
            eo.Linear(16, 32, seed=seed),
            eo.ReLU(),
            eo.Linear(32, 32, seed=seed + 1),
            eo.ReLU(),
            eo.Linear(32, 1, seed=seed + 2),
        )

    class Tiny(eo.Module):
        def __init__(self):
            super().__init__()
            self.encoder = eo.TransformerEncoder(1, 8, 2, dim_feedforward=16, dropout=0.0, seed=seed)
            self.head = eo.Linear(8, 1, seed=seed + 5)

        def forward(self, x):
            return self.head(self.encoder(x))

    return Tiny()


def loss_of(model, x, y):
    import everyo as eo

    residual = model(eo.tensor(x)) - eo.tensor(y)
    return eo.mean(residual * residual)


def train(group, kind, bucket_cap_mb=25, accumulate=False, amp=False, world=2):
    """STEPS optimizer steps on the DistributedSampler's batches; returns the parameters (and some facts).

    ``accumulate``: every step is two micro-batches, the first under ``no_sync``.
    ``group`` None: one process, iterating ``global_order()`` of a ``world``-rank sampler with the
    global batch size ``world * PER_RANK_BATCH``.
    """
    import everyo as eo
    from everyo.distributed import DistributedDataParallel, DistributedSampler

    x, y = data(kind)
    world = world if group is None else group.world_size
    rank = 0 if group is None else group.rank
    model = build(kind, seed=10 * rank)
    if group is not None:
        model = DistributedDataParallel(model, group, bucket_cap_mb=bucket_cap_mb)
    optimizer = eo.SGD(model.parameters(), lr=0.05)
    scaler = None
    if amp:
        from everyo.amp import GradScaler, autocast

        scaler = GradScaler(init_scale=2.0**10)
    sampler = DistributedSampler(len(x), group if group is not None else _Rank0(world), seed=3)
    applied = []
    step = 0
    for epoch in range(100):
        sampler.set_epoch(epoch)
        rows = sampler.indices() if group is not None else sampler.global_order()
        batch = PER_RANK_BATCH * (world if group is None else 1)
        micro = 2 if accumulate else 1
        for start in range(0, len(rows) - batch * micro + 1, batch * micro):
            optimizer.zero_grad()
            for m in range(micro):
                picked = rows[start + m * batch : start + (m + 1) * batch]
                if amp:
                    with autocast():
                        loss = loss_of(model, x[picked], y[picked])
                    if group is not None and m == micro - 1 and step == 2 and rank == 1:
                        loss = loss * float("inf")  # one rank's gradients infinite: every rank must skip
                    backward = lambda loss=loss: scaler.scale(loss).backward()  # noqa: E731
                else:
                    loss = loss_of(model, x[picked], y[picked])
                    backward = loss.backward
                if group is not None and m < micro - 1:
                    with model.no_sync():
                        backward()
                else:
                    backward()
            if amp:
                applied.append(bool(scaler.step(optimizer)))
                scaler.update()
            else:
                optimizer.step()
            step += 1
            if step == STEPS:
                params = [p.data for p in model.parameters()]
                return {"params": params, "applied": applied}
    raise AssertionError("not enough data for STEPS steps")


def train_amp(group):
    return train(group, "mlp", amp=True)


class _Rank0:
    def __init__(self, world_size):
        self.rank, self.world_size = 0, world_size


def overlap(group):
    """Whether a bucket's all-reduce runs while backward still has work left.

    A hook on the first layer's output (reached before the first layer's
    weight gradient, after the later layers') waits, up to 20 s, until an
    all-reduce has started: with overlap that is at once; without, never.
    """
    import threading
    import time

    import everyo as eo
    from everyo.distributed import DistributedDataParallel

    model = build("mlp", seed=0)
    ddp = DistributedDataParallel(model, group, bucket_cap_mb=0.001)  # ~1 KiB: several buckets
    started, calls = threading.Event(), []
    real = group.all_reduce_mean

    def recording(array):
        calls.append(array.size)
        started.set()
        return real(array)

    group.all_reduce_mean = recording
    waited = []

    def wait_for_communication(grad):
        t0 = time.perf_counter()
        waited.append(started.wait(20.0))
        waited.append(time.perf_counter() - t0)

    x, y = data("mlp")
    out = eo.tensor(x[:32])
    for i, layer in enumerate(model.children()):
        out = layer(out)
        if i == 0:
            out.register_hook(wait_for_communication)
    residual = out - eo.tensor(y[:32])
    eo.mean(residual * residual).backward()
    group.all_reduce_mean = real
    grads = [p.grad.copy() for p in model.parameters()]
    return {
        "buckets": len(ddp._buckets),
        "calls": len(calls),
        "started_during_backward": waited[0],
        "waited": waited[1],
        "grads": grads,
    }


def unused(group):
    """Parameter ``extra`` is used on rank 0 only; ``never`` on no rank."""
    import everyo as eo
    from everyo.distributed import DistributedDataParallel

    class Branchy(eo.Module):
        def __init__(self):
            super().__init__()
            self.body = eo.Linear(4, 1, seed=0)
            self.extra = eo.Linear(4, 1, seed=1)
            self.never = eo.Linear(4, 1, seed=2)

        def forward(self, x, use_extra):
            out = self.body(x)
            return out + self.extra(x) if use_extra else out

    model = DistributedDataParallel(Branchy(), group, bucket_cap_mb=0.0001)
    x = eo.tensor(np.full((2, 4), group.rank + 1.0, np.float32))
    eo.mean(model(x, use_extra=group.rank == 0)).backward()
    inner = model.module
    return {name: (None if p.grad is None else p.grad.copy()) for name, p in inner.named_parameters()}


def mismatched(group):
    import everyo as eo
    from everyo.distributed import DistributedDataParallel

    width = 32 if group.rank != 1 else 31
    model = eo.Sequential(eo.Linear(16, width, seed=0), eo.ReLU(), eo.Linear(width, 1, seed=1))
    try:
        DistributedDataParallel(model, group)
    except Exception as exc:  # noqa: BLE001 - reported to the test
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def battery(group):
    """Everything the backends must agree on, as plain arrays (for np.savez under MPI)."""
    out = {}
    for kind in ("mlp", "transformer"):
        for i, p in enumerate(train(group, kind, bucket_cap_mb=0.002)["params"]):
            out[f"{kind}|{i}"] = p
    for i, p in enumerate(train(group, "mlp", accumulate=True)["params"]):
        out[f"accumulate|{i}"] = p
    return out
