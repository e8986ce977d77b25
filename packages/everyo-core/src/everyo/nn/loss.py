from __future__ import annotations

from typing import TYPE_CHECKING

from everyo import losses
from everyo.nn.module import Module

if TYPE_CHECKING:
    from everyo._typing import TensorLike
    from everyo.tensor import Tensor


class _Loss(Module):
    def __init__(self, reduction: str = "mean") -> None:
        super().__init__()
        self.reduction = reduction

    def extra_repr(self) -> str:
        return f"reduction={self.reduction!r}"


class MSELoss(_Loss):
    """Mean squared error between predictions and targets of the same shape."""

    def forward(self, pred: TensorLike, target: TensorLike) -> Tensor:
        return losses.mse_loss(pred, target, self.reduction)


class CrossEntropyLoss(_Loss):
    """Cross-entropy from raw logits (N, C) and integer targets (N,)."""

    def forward(self, logits: TensorLike, targets: TensorLike) -> Tensor:
        return losses.cross_entropy(logits, targets, self.reduction)


class BCEWithLogitsLoss(_Loss):
    """Binary cross-entropy from raw logits; stable for large |logits|."""

    def forward(self, logits: TensorLike, targets: TensorLike) -> Tensor:
        return losses.binary_cross_entropy_with_logits(logits, targets, self.reduction)
