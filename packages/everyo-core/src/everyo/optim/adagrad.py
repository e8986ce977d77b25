"""Adagrad, written on the public :class:`~everyo.optim.Optimizer` API."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from everyo.optim.hyper import Real
from everyo.optim.optimizer import Optimizer

if TYPE_CHECKING:
    from collections.abc import Iterable

    from everyo._typing import Array
    from everyo.tensor import Tensor


class Adagrad(Optimizer):
    """Adagrad (Duchi et al., 2011), PyTorch's update rule; at step ``t`` (from 1)::

        g = grad + weight_decay * p
        s = s + g * g                          (s starts at initial_accumulator_value)
        p -= lr / (1 + (t - 1) * lr_decay) * g / (sqrt(s) + eps)

    Args:
        params: an iterable of Tensors, or of param-group dicts (see :class:`Optimizer`).
        lr: the learning rate, >= 0.
        lr_decay: the step-size decay, >= 0.
        weight_decay: L2 penalty added to the gradient, >= 0.
        initial_accumulator_value: the starting sum of squares, >= 0.
        eps: added to the denominator, >= 0.

    Examples:
        >>> opt = eo.optim.Adagrad(eo.nn.Linear(4, 1).parameters(), lr=0.1)
    """

    hyperparameters = {
        "lr": Real(),
        "lr_decay": Real(),
        "weight_decay": Real(),
        "initial_accumulator_value": Real(),
        "eps": Real(),
    }
    lr: float
    lr_decay: float
    weight_decay: float
    initial_accumulator_value: float
    eps: float

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-2,
        lr_decay: float = 0.0,
        weight_decay: float = 0.0,
        initial_accumulator_value: float = 0.0,
        eps: float = 1e-10,
    ) -> None:
        defaults = dict(
            lr=lr,
            lr_decay=lr_decay,
            weight_decay=weight_decay,
            initial_accumulator_value=initial_accumulator_value,
            eps=eps,
        )
        super().__init__(params, defaults)

    def _check_state(self, index, entry, group):
        if entry:
            self._require(index, entry, ("step", "sum"))

    def update(self, param: Tensor, grad: Array, state: dict[str, Any], group: dict[str, Any]) -> None:
        """One Adagrad step for ``param`` (see the class docstring)."""
        if not state:
            state.update(step=0, sum=np.full_like(param.data, group["initial_accumulator_value"]))
        state["step"] += 1
        if group["weight_decay"]:
            grad = grad + group["weight_decay"] * param.data
        lr = group["lr"] / (1 + (state["step"] - 1) * group["lr_decay"])
        s = state["sum"]
        s += grad * grad
        param.data -= lr * grad / (np.sqrt(s) + group["eps"])
