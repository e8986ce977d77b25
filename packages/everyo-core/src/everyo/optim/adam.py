from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from everyo.optim.hyper import Flag, Pair, Real
from everyo.optim.optimizer import Optimizer

if TYPE_CHECKING:
    from collections.abc import Iterable

    from everyo.tensor import Tensor


class Adam(Optimizer):
    """Adam (Kingma & Ba) with bias correction, PyTorch's update rule::

        g = grad + weight_decay * p                  (Adam: L2 in the gradient)
        p *= 1 - lr * weight_decay                   (AdamW: decoupled instead)
        m = b1 * m + (1 - b1) * g;  v = b2 * v + (1 - b2) * g * g
        v_hat = max(v_hat, v) if amsgrad else v
        p -= lr / (1 - b1**t) * m / (sqrt(v_hat) / sqrt(1 - b2**t) + eps)

    Args:
        params: an iterable of Tensors, or of param-group dicts (see :class:`Optimizer`).
        lr: learning rate, a number >= 0.
        eps: a number >= 0.
        weight_decay: a number >= 0.
        betas: two numbers in [0, 1).
        amsgrad: use the running maximum of ``v`` (Reddi et al.).

    Examples:
        >>> model = eo.nn.Linear(4, 1)
        >>> opt = eo.Adam(model.parameters(), lr=1e-3, amsgrad=True)
    """

    hyperparameters = {
        "lr": Real(),
        "betas": Pair(Real(0.0, 1.0, open_high=True)),
        "eps": Real(),
        "weight_decay": Real(),
        "amsgrad": Flag(),
    }
    _decoupled = False
    # Read (and set) on the optimizer: every param group's value, where they agree.
    lr: float
    betas: tuple[float, float]
    eps: float
    weight_decay: float
    amsgrad: bool

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
    ) -> None:
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad))

    def _check_state(self, index, entry, group):
        if entry:
            keys = ("step", "exp_avg", "exp_avg_sq") + (("max_exp_avg_sq",) if group["amsgrad"] else ())
            self._require(index, entry, keys)

    def _step(self):
        for group, indexed in self._groups():
            lr, (b1, b2), eps, wd, amsgrad = (
                group["lr"],
                group["betas"],
                group["eps"],
                group["weight_decay"],
                group["amsgrad"],
            )
            for i, p in indexed:
                g = p.grad
                if g is None:
                    continue
                if wd and self._decoupled:
                    p.data *= 1 - lr * wd
                elif wd:
                    g = g + wd * p.data
                state = self.state.setdefault(i, {})
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = np.zeros_like(p.data)
                    state["exp_avg_sq"] = np.zeros_like(p.data)
                if amsgrad and "max_exp_avg_sq" not in state:
                    state["max_exp_avg_sq"] = np.zeros_like(p.data)
                state["step"] = t = int(state["step"]) + 1
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m *= b1
                m += (1 - b1) * g
                v *= b2
                gg = np.multiply(g, g, dtype=v.dtype)
                gg *= 1 - b2
                v += gg
                if amsgrad:
                    v = np.maximum(state["max_exp_avg_sq"], v, out=state["max_exp_avg_sq"])
                denom = np.sqrt(v, out=gg)  # reuses the scratch array
                denom /= math.sqrt(1 - b2**t)
                denom += eps
                np.divide(m, denom, out=denom)
                denom *= lr / (1 - b1**t)
                p.data -= denom  # through the Tensor: bumps its version


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov & Hutter): ``p *= 1 - lr * wd`` each step.

    Examples:
        >>> model = eo.nn.Linear(4, 1)
        >>> opt = eo.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    """

    _decoupled = True

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        amsgrad: bool = False,
    ) -> None:
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad)
