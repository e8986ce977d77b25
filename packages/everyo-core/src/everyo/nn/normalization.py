"""Batch and layer normalisation, channels last (NHWC / (N, C) / (N, L, C))."""
import numpy as np

from everyo import functional as F
from everyo.errors import EveryOShapeError
from everyo.nn.module import Module, as_input
from everyo.tensor import Parameter, Tensor


def _normalize(x, mean, var, eps, weight, bias):
    """``(x - mean) / sqrt(var + eps)``, then the learned scale and shift (if any)."""
    y = (x - mean) / F.sqrt(var + eps)
    return y if weight is None else y * weight + bias


class _BatchNorm(Module):
    _ranks = ()

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True,
                 *, dtype="float32"):
        super().__init__()
        self.num_features, self.eps, self.momentum = int(num_features), float(eps), float(momentum)
        self.affine, self.track_running_stats = affine, track_running_stats
        self.weight = Parameter(np.ones(num_features, dtype=dtype)) if affine else None
        self.bias = Parameter(np.zeros(num_features, dtype=dtype)) if affine else None
        if track_running_stats:
            self.register_buffer("running_mean", np.zeros(num_features, dtype=dtype))
            self.register_buffer("running_var", np.ones(num_features, dtype=dtype))
        else:
            self.running_mean = self.running_var = None

    def forward(self, x):
        x = as_input(self, x, ndim=self._ranks, last_dim=self.num_features)
        axes = tuple(range(x.data.ndim - 1))
        if self.training or not self.track_running_stats:
            mean = F.mean(x, axis=axes, keepdims=True)
            var = F.var(x, axis=axes, keepdims=True)
            if self.training and self.track_running_stats:
                n = x.data.size // self.num_features
                m = self.momentum
                unbiased = var.data.reshape(-1) * (n / max(n - 1, 1))
                rm, rv = self.running_mean.data, self.running_var.data
                self.running_mean.data = ((1 - m) * rm + m * mean.data.reshape(-1)).astype(rm.dtype)
                self.running_var.data = ((1 - m) * rv + m * unbiased).astype(rv.dtype)
        else:
            mean, var = Tensor(self.running_mean.data), Tensor(self.running_var.data)
        return _normalize(x, mean, var, self.eps, self.weight, self.bias)

    def extra_repr(self):
        return f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, track_running_stats={self.track_running_stats}"


class BatchNorm1D(_BatchNorm):
    """Batch normalisation over (N, C) or channels-last (N, L, C) input.

    In train mode it normalises with the batch's statistics and updates the
    running mean and (unbiased) variance with ``momentum``; in eval mode it
    uses the running statistics. ``track_running_stats=False`` always uses the
    batch's statistics.
    """

    _ranks = (2, 3)


class BatchNorm2D(_BatchNorm):
    """Batch normalisation over NHWC input, per channel (the last axis)."""

    _ranks = (4,)


class LayerNorm(Module):
    """Normalise over the trailing ``normalized_shape`` axes of each sample."""

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, *, dtype="float32"):
        super().__init__()
        if isinstance(normalized_shape, int):
            normalized_shape = (normalized_shape,)
        self.normalized_shape, self.eps = tuple(normalized_shape), float(eps)
        self.elementwise_affine = elementwise_affine
        self.weight = Parameter(np.ones(self.normalized_shape, dtype=dtype)) if elementwise_affine else None
        self.bias = Parameter(np.zeros(self.normalized_shape, dtype=dtype)) if elementwise_affine else None

    def forward(self, x):
        x = as_input(self, x)
        k = len(self.normalized_shape)
        if x.data.shape[x.data.ndim - k:] != self.normalized_shape or x.data.ndim < k:
            raise EveryOShapeError(
                f"{self!r} expected input whose last {k} dimension(s) are {self.normalized_shape}, "
                f"got shape {x.data.shape}"
            )
        axes = tuple(range(x.data.ndim - k, x.data.ndim))
        mean = F.mean(x, axis=axes, keepdims=True)
        var = F.var(x, axis=axes, keepdims=True)
        return _normalize(x, mean, var, self.eps, self.weight, self.bias)

    def extra_repr(self):
        return f"{self.normalized_shape}, eps={self.eps}"
