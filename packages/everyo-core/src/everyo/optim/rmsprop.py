from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from everyo.optim.hyper import Flag, Real
from everyo.optim.optimizer import Optimizer

if TYPE_CHECKING:
    from collections.abc import Iterable

    from everyo.tensor import Tensor


class RMSprop(Optimizer):
    """RMSprop (Hinton's lecture 6e), PyTorch's update rule::

        g = grad + weight_decay * p
        s = alpha * s + (1 - alpha) * g * g
        a = alpha * a + (1 - alpha) * g;  avg = sqrt(s - a * a) + eps    (centered)
        avg = sqrt(s) + eps                                                (otherwise)
        buf = momentum * buf + g / avg;  p -= lr * buf                     (momentum > 0)
        p -= lr * g / avg                                                  (otherwise)

    Args:
        params: an iterable of Tensors, or of param-group dicts (see :class:`Optimizer`).
        lr: the learning rate, >= 0.
        eps: added to the denominator, >= 0.
        momentum: momentum factor, >= 0.
        weight_decay: L2 penalty added to the gradient, >= 0.
        alpha: smoothing constant in [0, 1].
        centered: normalize by the estimated variance of the gradient instead of its second moment.

    Examples:
        >>> model = eo.nn.Linear(4, 1)
        >>> opt = eo.RMSprop(model.parameters(), lr=1e-3, momentum=0.9, centered=True)
    """

    hyperparameters = {
        "lr": Real(),
        "alpha": Real(0.0, 1.0),
        "eps": Real(),
        "weight_decay": Real(),
        "momentum": Real(),
        "centered": Flag(),
    }
    # Read (and set) on the optimizer: every param group's value, where they agree.
    lr: float
    alpha: float
    eps: float
    weight_decay: float
    momentum: float
    centered: bool

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-2,
        alpha: float = 0.99,
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        momentum: float = 0.0,
        centered: bool = False,
    ) -> None:
        super().__init__(
            params, dict(lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay, momentum=momentum, centered=centered)
        )

    def _check_state(self, index, entry, group):
        if entry:
            keys = (
                ("step", "square_avg")
                + (("momentum_buffer",) if group["momentum"] > 0 else ())
                + (("grad_avg",) if group["centered"] else ())
            )
            self._require(index, entry, keys)

    def _step(self):
        for group, indexed in self._groups():
            lr, alpha, eps, wd = group["lr"], group["alpha"], group["eps"], group["weight_decay"]
            momentum, centered = group["momentum"], group["centered"]
            for i, p in indexed:
                g = p.grad
                if g is None:
                    continue
                if wd:
                    g = g + wd * p.data
                state = self.state.setdefault(i, {})
                if not state:
                    state["step"] = 0
                    state["square_avg"] = np.zeros_like(p.data)
                if momentum > 0 and "momentum_buffer" not in state:
                    state["momentum_buffer"] = np.zeros_like(p.data)
                if centered and "grad_avg" not in state:
                    state["grad_avg"] = np.zeros_like(p.data)
                state["step"] = int(state["step"]) + 1
                s = state["square_avg"]
                s *= alpha
                gg = np.multiply(g, g, dtype=s.dtype)
                gg *= 1 - alpha
                s += gg
                if centered:
                    a = state["grad_avg"]
                    a *= alpha
                    a += (1 - alpha) * g
                    avg = np.multiply(a, a, out=gg)
                    np.subtract(s, avg, out=avg)
                    np.sqrt(avg, out=avg)
                else:
                    avg = np.sqrt(s, out=gg)
                avg += eps
                if momentum > 0:
                    buf = state["momentum_buffer"]
                    buf *= momentum
                    buf += np.divide(g, avg, out=avg)
                    p.data -= lr * buf  # through the Tensor: bumps its version
                else:
                    np.divide(g, avg, out=avg)
                    avg *= lr
                    p.data -= avg
