"""NAdam, written on the public :class:`~everyo.optim.Optimizer` API."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from everyo.errors import EveryOStateDictError
from everyo.optim.hyper import Flag, Pair, Real
from everyo.optim.optimizer import Optimizer

if TYPE_CHECKING:
    from collections.abc import Iterable

    from everyo._typing import Array
    from everyo.tensor import Tensor


class NAdam(Optimizer):
    """Adam with Nesterov momentum (Dozat, 2016), PyTorch's update rule; at
    step ``t`` (from 1), with ``mu_t = beta1 * (1 - 0.5 * 0.96 ** (t * momentum_decay))``::

        g = grad + weight_decay * p           (or p *= 1 - lr * weight_decay, decoupled)
        m = beta1 * m + (1 - beta1) * g;  v = beta2 * v + (1 - beta2) * g * g
        P_t = mu_1 * ... * mu_t
        d = sqrt(v / (1 - beta2 ** t)) + eps
        p -= lr * (1 - mu_t) / (1 - P_t) * g / d + lr * mu_{t+1} / (1 - P_t * mu_{t+1}) * m / d

    Args:
        params: an iterable of Tensors, or of param-group dicts (see :class:`Optimizer`).
        lr: the learning rate, >= 0.
        eps: added to the denominator, >= 0.
        weight_decay: the weight decay, >= 0.
        momentum_decay: how fast mu_t approaches beta1, >= 0.
        betas: ``(beta1, beta2)``, each in [0, 1).
        decoupled_weight_decay: decay the weights directly (as AdamW) instead
            of adding ``weight_decay * p`` to the gradient.

    Examples:
        >>> opt = eo.optim.NAdam(eo.nn.Linear(4, 1).parameters(), lr=2e-3)
    """

    hyperparameters = {
        "lr": Real(),
        "betas": Pair(Real(0.0, 1.0, open_high=True)),
        "eps": Real(),
        "weight_decay": Real(),
        "momentum_decay": Real(),
        "decoupled_weight_decay": Flag(),
    }
    lr: float
    betas: tuple[float, float]
    eps: float
    weight_decay: float
    momentum_decay: float
    decoupled_weight_decay: bool

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict[str, Any]],
        lr: float = 2e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        momentum_decay: float = 4e-3,
        decoupled_weight_decay: bool = False,
    ) -> None:
        defaults = dict(
            lr=lr,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            momentum_decay=momentum_decay,
            decoupled_weight_decay=decoupled_weight_decay,
        )
        super().__init__(params, defaults)

    def _check_state(self, index, entry, group):
        if entry:
            self._require(index, entry, ("step", "exp_avg", "exp_avg_sq"))
            mu = entry.get("mu_product")
            if isinstance(mu, bool) or not isinstance(mu, (float, int, np.floating, np.ndarray)) or np.ndim(mu):
                raise EveryOStateDictError(
                    f"NAdam state 'mu_product' for parameter {index} must be a number, got {mu!r}"
                )

    def update(self, param: Tensor, grad: Array, state: dict[str, Any], group: dict[str, Any]) -> None:
        """One NAdam step for ``param`` (see the class docstring)."""
        lr, (beta1, beta2), wd = group["lr"], group["betas"], group["weight_decay"]
        if not state:
            state.update(
                step=0, mu_product=1.0, exp_avg=np.zeros_like(param.data), exp_avg_sq=np.zeros_like(param.data)
            )
        state["step"] += 1
        t = state["step"]
        if wd and group["decoupled_weight_decay"]:
            param.data *= 1 - lr * wd
        elif wd:
            grad = grad + wd * param.data
        mu = beta1 * (1.0 - 0.5 * 0.96 ** (t * group["momentum_decay"]))
        mu_next = beta1 * (1.0 - 0.5 * 0.96 ** ((t + 1) * group["momentum_decay"]))
        state["mu_product"] = product = float(state["mu_product"]) * mu
        m, v = state["exp_avg"], state["exp_avg_sq"]
        m *= beta1
        m += (1 - beta1) * grad
        v *= beta2
        v += (1 - beta2) * grad * grad
        denom = np.sqrt(v / (1 - beta2**t)) + group["eps"]
        param.data -= lr * (1 - mu) / (1 - product) * grad / denom + lr * mu_next / (1 - product * mu_next) * m / denom
