"""Loss modules: each holds its options (class weights as buffers, as in
PyTorch, so they are saved in ``state_dict``) and calls the loss function in
:mod:`everyo.losses`, where the maths and the conventions are documented."""

from __future__ import annotations

from typing import TYPE_CHECKING

from everyo import losses
from everyo.losses._common import REDUCTIONS, check_reduction, positional_reduction
from everyo.nn.module import Module

if TYPE_CHECKING:
    from everyo._typing import TensorLike
    from everyo.tensor import Tensor

__all__ = [
    "MSELoss",
    "L1Loss",
    "SmoothL1Loss",
    "HuberLoss",
    "CrossEntropyLoss",
    "NLLLoss",
    "BCELoss",
    "BCEWithLogitsLoss",
    "KLDivLoss",
]


class _Loss(Module):
    _reductions: tuple[str, ...] = REDUCTIONS

    def __init__(self, reduction: str = "mean") -> None:
        super().__init__()
        check_reduction(type(self).__name__, reduction, self._reductions)
        self.reduction = reduction

    def extra_repr(self) -> str:
        return f"reduction={self.reduction!r}"


class _WeightedLoss(_Loss):
    weight: Tensor | None

    def __init__(self, weight: TensorLike | None = None, reduction: str = "mean") -> None:
        weight, reduction = positional_reduction(weight, reduction)
        super().__init__(reduction)
        self.register_buffer("weight", weight)


class MSELoss(_Loss):
    """Mean squared error between predictions and targets of the same shape
    (:func:`everyo.mse_loss`).

    Examples:
        >>> eo.MSELoss(reduction="sum")(eo.tensor([1.0, 2.0]), eo.tensor([0.0, 0.0])).item()
        5.0
    """

    def forward(self, pred: TensorLike, target: TensorLike) -> Tensor:
        return losses.mse_loss(pred, target, self.reduction)


class L1Loss(_Loss):
    """Mean absolute error (:func:`everyo.l1_loss`)."""

    def forward(self, pred: TensorLike, target: TensorLike) -> Tensor:
        return losses.l1_loss(pred, target, self.reduction)


class SmoothL1Loss(_Loss):
    """Smooth L1 loss with threshold ``beta`` (:func:`everyo.smooth_l1_loss`)."""

    def __init__(self, reduction: str = "mean", beta: float = 1.0) -> None:
        super().__init__(reduction)
        self.beta = beta

    def forward(self, pred: TensorLike, target: TensorLike) -> Tensor:
        return losses.smooth_l1_loss(pred, target, self.reduction, self.beta)


class HuberLoss(_Loss):
    """Huber loss with threshold ``delta`` (:func:`everyo.huber_loss`)."""

    def __init__(self, reduction: str = "mean", delta: float = 1.0) -> None:
        super().__init__(reduction)
        self.delta = delta

    def forward(self, pred: TensorLike, target: TensorLike) -> Tensor:
        return losses.huber_loss(pred, target, self.reduction, self.delta)


class CrossEntropyLoss(_WeightedLoss):
    """Cross-entropy from raw logits (N, C) (classes last) and integer targets
    (N,) or class probabilities (:func:`everyo.cross_entropy`).

    Args:
        weight: optional (C,) class weights (a buffer).
        ignore_index: targets equal to it are left out, of the mean's denominator too.
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.
        label_smoothing: in [0, 1].

    Examples:
        >>> loss = eo.CrossEntropyLoss(weight=[1.0, 2.0], ignore_index=-1)
        >>> round(loss(eo.tensor([[1.0, 0.0], [0.0, 1.0], [5.0, 0.0]]), [0, 1, -1]).item(), 4)
        0.3133
    """

    def __init__(
        self,
        weight: TensorLike | None = None,
        ignore_index: int = -100,
        reduction: str = "mean",
        label_smoothing: float = 0.0,
    ) -> None:
        super().__init__(weight, reduction)
        self.ignore_index = ignore_index
        self.label_smoothing = label_smoothing

    def forward(self, logits: TensorLike, targets: TensorLike) -> Tensor:
        return losses.cross_entropy(
            logits,
            targets,
            self.weight,
            ignore_index=self.ignore_index,
            reduction=self.reduction,
            label_smoothing=self.label_smoothing,
        )


class NLLLoss(_WeightedLoss):
    """Negative log-likelihood of log-probabilities (:func:`everyo.nll_loss`);
    ``NLLLoss()(log_softmax(z), t)`` is ``CrossEntropyLoss()(z, t)``."""

    def __init__(self, weight: TensorLike | None = None, ignore_index: int = -100, reduction: str = "mean") -> None:
        super().__init__(weight, reduction)
        self.ignore_index = ignore_index

    def forward(self, log_probs: TensorLike, targets: TensorLike) -> Tensor:
        return losses.nll_loss(
            log_probs, targets, self.weight, ignore_index=self.ignore_index, reduction=self.reduction
        )


class BCELoss(_WeightedLoss):
    """Binary cross-entropy of probabilities (:func:`everyo.binary_cross_entropy`)."""

    def forward(self, probs: TensorLike, targets: TensorLike) -> Tensor:
        return losses.binary_cross_entropy(probs, targets, self.weight, reduction=self.reduction)


class BCEWithLogitsLoss(_WeightedLoss):
    """Binary cross-entropy from raw logits; stable for large |logits|
    (:func:`everyo.binary_cross_entropy_with_logits`).

    Args:
        weight: optional per-element weights, broadcast (a buffer).
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.
        pos_weight: optional weight of the positive term per class (last axis; a buffer).
    """

    pos_weight: Tensor | None

    def __init__(
        self, weight: TensorLike | None = None, reduction: str = "mean", pos_weight: TensorLike | None = None
    ) -> None:
        super().__init__(weight, reduction)
        self.register_buffer("pos_weight", pos_weight)

    def forward(self, logits: TensorLike, targets: TensorLike) -> Tensor:
        return losses.binary_cross_entropy_with_logits(
            logits, targets, self.weight, reduction=self.reduction, pos_weight=self.pos_weight
        )


class KLDivLoss(_Loss):
    """Kullback-Leibler divergence of log-probabilities from a target
    (:func:`everyo.kl_div`); ``reduction`` may also be ``"batchmean"``."""

    _reductions = ("none", "mean", "sum", "batchmean")

    def __init__(self, reduction: str = "mean", log_target: bool = False) -> None:
        super().__init__(reduction)
        self.log_target = bool(log_target)

    def forward(self, log_probs: TensorLike, target: TensorLike) -> Tensor:
        return losses.kl_div(log_probs, target, self.reduction, log_target=self.log_target)
