"""Loss functions, fused and numerically stable, with PyTorch's arguments and
conventions (``reduction="none" | "mean" | "sum"``, ``weight=``,
``ignore_index=``, ``label_smoothing=``, ``pos_weight=`` where PyTorch has
them). They run in float32 or wider, with or without autocast; weights are
constants (no gradient flows into them).

One difference of layout: class axes are last (EveryO's channels-last), so
multi-dimensional ``cross_entropy``/``nll_loss`` take (N, d1, ..., C) where
PyTorch takes (N, C, d1, ...); for (N, C) they agree.
"""

from everyo.losses.binary import binary_cross_entropy, binary_cross_entropy_with_logits
from everyo.losses.classification import cross_entropy, nll_loss
from everyo.losses.divergence import kl_div
from everyo.losses.regression import huber_loss, l1_loss, mse_loss, smooth_l1_loss

__all__ = [
    "mse_loss",
    "l1_loss",
    "smooth_l1_loss",
    "huber_loss",
    "cross_entropy",
    "nll_loss",
    "binary_cross_entropy",
    "binary_cross_entropy_with_logits",
    "kl_div",
]
