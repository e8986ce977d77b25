from everyo import losses
from everyo.nn.module import Module


class _Loss(Module):
    def __init__(self, reduction="mean"):
        super().__init__()
        self.reduction = reduction

    def extra_repr(self):
        return f"reduction={self.reduction!r}"


class MSELoss(_Loss):
    """Mean squared error between predictions and targets of the same shape."""

    def forward(self, pred, target):
        return losses.mse_loss(pred, target, self.reduction)


class CrossEntropyLoss(_Loss):
    """Cross-entropy from raw logits (N, C) and integer targets (N,)."""

    def forward(self, logits, targets):
        return losses.cross_entropy(logits, targets, self.reduction)


class BCEWithLogitsLoss(_Loss):
    """Binary cross-entropy from raw logits; stable for large |logits|."""

    def forward(self, logits, targets):
        return losses.binary_cross_entropy_with_logits(logits, targets, self.reduction)
