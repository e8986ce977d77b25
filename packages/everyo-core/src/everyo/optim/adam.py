from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from everyo import kernel_table
from everyo.optim.hyper import Flag, Pair, Real
from everyo.optim.optimizer import Optimizer

if TYPE_CHECKING:
    from collections.abc import Iterable

    from everyo.tensor import Tensor


# The dtypes everyo-kernels' adam_update is used for, and the fewest values (over a
# param group) for which it is asked for (kernel_table's, as for the ops).
_COMPILED, _KERNEL_MIN_SIZE = kernel_table.FLOAT_DTYPES, kernel_table.MIN_SIZE


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
            indexed = list(indexed)
            # everyo-kernels' fused update (bit-identical), where this group has enough values to
            # be worth loading the kernels for (a tiny model keeps the NumPy passes, as the ops do).
            update = None
            if not amsgrad and sum(p.data.size for _, p in indexed) >= _KERNEL_MIN_SIZE:
                update = kernel_table.get("adam_update")
            for i, p in indexed:
                g = p.grad
                if g is None:
                    continue
                if update is not None and self._fused(update, i, p, g, lr, (b1, b2), eps, wd):
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

    def _fused(self, update, i, p, g, lr, betas, eps, wd):
        """The update of one parameter by everyo-kernels' ``update`` (``adam_update``:
        the same operations in the same order, bit-identical), where it applies:
        float32 or float64, gradient and state of the parameter's dtype, all
        C-contiguous (``amsgrad`` never comes here). Returns whether it ran."""
        data = p.data
        if (
            data.dtype not in _COMPILED
            or g.dtype != data.dtype
            or not (data.flags.c_contiguous and g.flags.c_contiguous)
        ):
            return False
        state = self.state.get(i)
        if state:
            m, v = state["exp_avg"], state["exp_avg_sq"]
            if m.dtype != data.dtype or v.dtype != data.dtype or not (m.flags.c_contiguous and v.flags.c_contiguous):
                return False
        if not state:
            state = self.state.setdefault(i, {})
            state["step"], state["exp_avg"], state["exp_avg_sq"] = 0, np.zeros_like(data), np.zeros_like(data)
        state["step"] = t = int(state["step"]) + 1
        update(data, g, state["exp_avg"], state["exp_avg_sq"], t, lr, betas, eps, wd, self._decoupled)
        p.data = data  # an in-place change: bumps the version, as the reference's ``p.data -= ...``
        return True


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
