"""``kl_div``: the Kullback-Leibler divergence, PyTorch's argument order and
conventions (the input is log-probabilities, the target probabilities)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from everyo.dispatch import FLOAT32, primitive
from everyo.functional import _t
from everyo.losses._common import check_reduction, float32_at_least, reduce, same_shape, spread
from everyo.tensor import Tensor

if TYPE_CHECKING:
    from everyo._typing import TensorLike

__all__ = ["kl_div"]


@primitive("kl_div", FLOAT32, kind="loss", inputs=("log_probs", "target"))
def kl_div(log_probs: TensorLike, target: TensorLike, reduction: str = "mean", *, log_target: bool = False) -> Tensor:
    """``target * (log(target) - log_probs)`` pointwise, 0 where ``target`` is 0
    (PyTorch's ``kl_div``: ``log_probs`` is log q, ``target`` is p).

    Args:
        log_probs: log-probabilities, e.g. from :func:`everyo.log_softmax`.
        target: probabilities of the same shape, or log-probabilities with
            ``log_target=True`` (pointwise ``exp(t) * (t - log_probs)``).
        reduction: ``"mean"`` (over every element, PyTorch's default, which
            is not the divergence), ``"batchmean"`` (the sum divided by the
            batch size: KL(p || q) per sample, what is usually meant), ``"sum"``
            or ``"none"``.

    Examples:
        >>> p = eo.tensor([[0.5, 0.5]])
        >>> round(eo.kl_div(eo.log(eo.tensor([[0.25, 0.75]])), p, reduction="batchmean").item(), 4)
        0.1438
    """
    check_reduction("kl_div", reduction, ("none", "mean", "sum", "batchmean"))
    log_probs, target = float32_at_least(_t(log_probs), _t(target))
    same_shape(log_probs, target, "kl_div")
    x, t = log_probs.data, target.data
    with np.errstate(divide="ignore", invalid="ignore"):
        if log_target:
            p = np.exp(t)
            per = p * (t - x)
        else:
            # PyTorch's xlogy: 0 * log 0 = 0; a negative target gives NaN (its log).
            log_t = np.log(t)
            per = np.where(t == 0, 0, t * log_t) - t * x
    if reduction == "batchmean":
        batch = x.shape[0] if x.ndim else 1
        out, scale = reduce(per, "mean", batch)
    else:
        out, scale = reduce(per, reduction)

    def backward(g):
        gi = spread(g, scale, per.shape)
        gx = -gi * (p if log_target else t)
        gt = None
        if target.requires_grad:
            # d/dt (t log t) = log t + 1: -inf at t = 0, which PyTorch returns as NaN.
            with np.errstate(invalid="ignore"):
                gt = gi * (p * (t - x + 1) if log_target else np.where(t == 0, np.nan, log_t + 1 - x))
        return gx, gt

    return Tensor._from_op(np.asarray(out, x.dtype), (log_probs, target), backward)
