from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from everyo.optim.hyper import Flag, Real
from everyo.optim.optimizer import Optimizer

if TYPE_CHECKING:
    from collections.abc import Iterable

    from everyo.tensor import Tensor


class SGD(Optimizer):
    """Stochastic gradient descent with optional momentum, Nesterov and L2 weight
    decay (PyTorch's update rule)::

        g = grad + weight_decay * p
        buf = g  (first step)  or  momentum * buf + (1 - dampening) * g
        g = g + momentum * buf  (nesterov)  or  buf
        p -= lr * g

    Args:
        params: an iterable of Tensors, or of param-group dicts (see :class:`Optimizer`).
        lr: learning rate, a number >= 0.
        momentum: a number >= 0.
        dampening: a number in [0, 1].
        weight_decay: a number >= 0.
        nesterov: Nesterov momentum (needs momentum > 0 and dampening == 0).

    Examples:
        >>> model = eo.nn.Linear(4, 1)
        >>> opt = eo.SGD(model.parameters(), lr=0.05, momentum=0.9)
    """

    hyperparameters = {
        "lr": Real(),
        "momentum": Real(),
        "dampening": Real(0.0, 1.0),
        "nesterov": Flag(),
        "weight_decay": Real(),
    }
    # Read (and set) on the optimizer: every param group's value, where they agree.
    lr: float
    momentum: float
    dampening: float
    nesterov: bool
    weight_decay: float

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict[str, Any]],
        lr: float = 0.01,
        momentum: float = 0.0,
        dampening: float = 0.0,
        nesterov: bool = False,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__(
            params, dict(lr=lr, momentum=momentum, dampening=dampening, nesterov=nesterov, weight_decay=weight_decay)
        )

    def _check_group(self, group, where):
        if group["nesterov"] and (group["momentum"] <= 0 or group["dampening"] != 0):
            raise ValueError(
                f"SGD: nesterov=True in {where} needs momentum > 0 and dampening == 0, got "
                f"momentum={group['momentum']!r}, dampening={group['dampening']!r}"
            )

    def _check_state(self, index, entry, group):
        if entry:
            self._require(index, entry, ("momentum_buffer",))

    def _step(self):
        for group, indexed in self._groups():
            lr, momentum, wd = group["lr"], group["momentum"], group["weight_decay"]
            dampening, nesterov = group["dampening"], group["nesterov"]
            for i, p in indexed:
                g = p.grad
                if g is None:
                    continue
                if wd:
                    g = g + wd * p.data
                if momentum:
                    state = self.state.setdefault(i, {})
                    buf = state.get("momentum_buffer")
                    if buf is None:
                        buf = state["momentum_buffer"] = np.array(g, dtype=p.data.dtype, copy=True)
                    else:
                        buf *= momentum
                        buf += (1 - dampening) * g if dampening else g
                    g = g + momentum * buf if nesterov else buf
                p.data -= lr * g  # through the Tensor: bumps its version
