"""Code written as a user would, type-checked in strict mode (tools/typecheck.py).

Not collected by pytest (no test_ prefix); `hatch run types:check` runs mypy
--strict over it, so a public name used here without annotations, or with
annotations that do not fit this use, fails CI.
"""

from __future__ import annotations

import numpy as np

import everyo as eo


class Net(eo.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = eo.Linear(4, 8, seed=0)
        self.fc2 = eo.Linear(8, 3, seed=1)

    def forward(self, x: eo.Tensor) -> eo.Tensor:
        return self.fc2(eo.relu(self.fc1(x)))


def train_step() -> float:
    model = Net()
    opt = eo.SGD(model.parameters(), lr=0.1)
    x = eo.tensor(np.ones((2, 4), dtype=np.float32))
    y = np.array([0, 2])
    loss = eo.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss.item()


def tensor_arithmetic() -> eo.Tensor:
    a = eo.randn(3, 4, seed=0, requires_grad=True)
    b = eo.ones(3, 4)
    c = (a + b) * 2.0 - a / 3.0
    d = c @ b.T
    e = d.sum(axis=1, keepdims=True).mean()
    assert a.dtype == np.float32 and a.shape == (3, 4)
    return e
