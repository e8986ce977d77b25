"""Code written as a strictly typed user would write it, type-checked with
``mypy --strict`` (tools/typecheck.py, and in CI against the installed wheels).

Not collected by pytest (no ``test_`` prefix) and never run: mypy reads it.
A public name used here without annotations, or with annotations that do not
fit this use, fails CI. It covers the core API and the three add-ons.
"""

from __future__ import annotations

import numpy as np

import everyo as eo
from everyo.optim.lr_scheduler import CosineAnnealingLR, LinearLR, SequentialLR


class Net(eo.Module):
    """A user's model: custom forward, own activation, a residual."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = eo.Linear(4, 8, seed=0)
        self.fc2 = eo.Linear(8, 8, seed=1)
        self.head = eo.Linear(8, 3, seed=2)
        self.norm = eo.LayerNorm(8)

    def forward(self, x: eo.Tensor) -> eo.Tensor:
        h: eo.Tensor = self.fc1(x)
        h = h * eo.sigmoid(h)  # the user's own SiLU
        residual: eo.Tensor = self.fc2(self.norm(h))
        out: eo.Tensor = self.head(h + residual)
        return out


def train_step() -> float:
    model = Net()
    decay = [p for name, p in model.named_parameters() if not name.endswith("bias")]
    no_decay = [p for name, p in model.named_parameters() if name.endswith("bias")]
    opt = eo.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}], lr=1e-3)
    warmup = LinearLR(opt, start_factor=0.1, total_iters=5)
    cosine = CosineAnnealingLR(opt, T_max=95)
    schedule = SequentialLR(opt, [warmup, cosine], milestones=[5])
    x = eo.tensor(np.ones((2, 4), dtype=np.float32))
    y = np.array([0, 2])
    loss = eo.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    eo.clip_grad_norm(model.parameters(), 1.0)
    opt.step()
    schedule.step()
    value: float = loss.item()
    return value


def tensor_arithmetic() -> eo.Tensor:
    a = eo.randn(3, 4, seed=0, requires_grad=True)
    b = eo.ones(3, 4)
    c = (a + b) * 2.0 - a / 3.0 + 1.0 - (2.0 * a) ** 2
    d = c @ b.T
    e = d.sum(axis=1, keepdims=True).mean() + eo.exp(a).max()
    values, indices = eo.topk(a, 2, axis=-1)
    mask = a > 0.0
    f = eo.masked_fill(a, mask, 0.0).reshape(4, 3).transpose(1, 0)
    # PyTorch's spellings (everyo.composites, dim=)
    first, rest = a.split([1, 3], dim=1)
    h = a.permute(1, 0).contiguous().view(2, -1).view_as(a).softmax(dim=-1).sum(dim=1, keepdim=True)
    assert h.shape == (3, 1) and first.shape == (3, 1) and rest.numel() == 9 and len(a.chunk(2)) == 2
    assert a.dtype == np.float32 and a.shape == (3, 4) and indices.dtype == np.int64
    (grad_a,) = eo.grad(e + values.sum() + f.sum(), [a])
    assert grad_a is not None and grad_a.shape == (3, 4)
    with eo.no_grad():
        g = a * 2.0
    assert not g.requires_grad
    return e


def sequences_and_data() -> list[float]:
    arrays = [np.ones((n, 6), dtype=np.float32) for n in (3, 5, 2)]
    batch, lengths = eo.pad_sequences(arrays)
    gru = eo.GRU(6, 8, bidirectional=True, seed=0)
    out, state = gru(eo.tensor(batch), lengths=lengths)
    dataset = eo.TensorDataset(np.zeros((10, 6), dtype=np.float32), np.arange(10))
    loader = eo.DataLoader(dataset, batch_size=4, shuffle=True, seed=0)
    sizes = [float(len(xb)) for xb, _ in loader]
    return [float(out.shape[0]), *sizes]


def checkpoint(path: str) -> None:
    model = Net()
    opt = eo.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True)
    eo.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": 3}, path)
    state = eo.load(path)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])


def mixed_precision() -> float:
    from everyo.amp import GradScaler, autocast

    model = Net()
    opt = eo.SGD(model.parameters(), lr=0.1)
    scaler = GradScaler(min_scale=1.0)
    x = eo.ones(2, 4)
    with autocast(dtype="float16"):
        loss = eo.mse_loss(model(x), eo.zeros(2, 3))
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    stepped: bool = scaler.step(opt)
    scaler.update()
    assert stepped in (True, False)
    return scaler.get_scale()


def export(path: str) -> None:
    from everyo.onnx import export_onnx, run_onnx

    model = Net()
    export_onnx(model, path, input_shape=(None, 4), verify=True)
    (out,) = run_onnx(path, np.ones((2, 4), dtype=np.float32))
    assert np.asarray(out).shape == (2, 3)


def data_parallel_worker(group: eo.distributed.ProcessGroup) -> list[float]:
    from everyo.distributed import DistributedDataParallel, DistributedSampler

    model = DistributedDataParallel(Net(), group)
    opt = eo.SGD(model.parameters(), lr=0.1)
    sampler = DistributedSampler(16, group, shuffle=True, seed=0)
    sampler.set_epoch(1)
    data = np.ones((16, 4), dtype=np.float32)
    losses = []
    for index in list(sampler)[:2]:
        loss = eo.mse_loss(model(eo.tensor(data[index : index + 1])), eo.zeros(1, 3))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def run_data_parallel() -> None:
    from everyo.distributed import spawn

    results = spawn(data_parallel_worker, 2)
    assert len(results) == 2
