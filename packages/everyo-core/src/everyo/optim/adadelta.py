"""Adadelta, written on the public :class:`~everyo.optim.Optimizer` API."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from everyo.optim.hyper import Real
from everyo.optim.optimizer import Optimizer

if TYPE_CHECKING:
    from collections.abc import Iterable

    from everyo._typing import Array
    from everyo.tensor import Tensor


class Adadelta(Optimizer):
    """Adadelta (Zeiler, 2012), PyTorch's update rule::

        g = grad + weight_decay * p
        s = rho * s + (1 - rho) * g * g
        delta = sqrt(u + eps) / sqrt(s + eps) * g
        u = rho * u + (1 - rho) * delta * delta
        p -= lr * delta

    Args:
        params: an iterable of Tensors, or of param-group dicts (see :class:`Optimizer`).
        lr: scale of the update (1.0, as PyTorch).
        rho: decay of the running averages, in [0, 1].
        eps: added inside both square roots, >= 0.
        weight_decay: L2 penalty added to the gradient, >= 0.

    Examples:
        >>> opt = eo.optim.Adadelta(eo.nn.Linear(4, 1).parameters(), lr=1.0)
    """

    hyperparameters = {"lr": Real(), "rho": Real(0.0, 1.0), "eps": Real(), "weight_decay": Real()}
    lr: float
    rho: float
    eps: float
    weight_decay: float

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict[str, Any]],
        lr: float = 1.0,
        rho: float = 0.9,
        eps: float = 1e-6,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__(params, dict(lr=lr, rho=rho, eps=eps, weight_decay=weight_decay))

    def _check_state(self, index, entry, group):
        if entry:
            self._require(index, entry, ("step", "square_avg", "acc_delta"))

    def update(self, param: Tensor, grad: Array, state: dict[str, Any], group: dict[str, Any]) -> None:
        """One Adadelta step for ``param`` (see the class docstring)."""
        rho, eps = group["rho"], group["eps"]
        if group["weight_decay"]:
            grad = grad + group["weight_decay"] * param.data
        if not state:
            state.update(step=0, square_avg=np.zeros_like(param.data), acc_delta=np.zeros_like(param.data))
        state["step"] += 1
        s, u = state["square_avg"], state["acc_delta"]
        s *= rho
        s += (1 - rho) * grad * grad
        delta = np.sqrt(u + eps) / np.sqrt(s + eps) * grad
        u *= rho
        u += (1 - rho) * delta * delta
        param.data -= group["lr"] * delta
