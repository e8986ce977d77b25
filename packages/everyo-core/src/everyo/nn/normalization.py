"""Batch, layer and group normalisation, channels last (NHWC / (N, C) / (N, L, C))."""

from __future__ import annotations

import math
import numbers
from typing import TYPE_CHECKING, Any

import numpy as np

from everyo import functional as F
from everyo.errors import EveryOShapeError
from everyo.nn import arguments as args
from everyo.nn.module import Module, as_input
from everyo.tensor import Parameter, Tensor

if TYPE_CHECKING:
    from collections.abc import Sequence

    from everyo._typing import DType, TensorLike


def _normalize(x, mean, var, eps, weight, bias):
    """``(x - mean) / sqrt(var + eps)``, then the learned scale and shift (if any)."""
    y = (x - mean) / F.sqrt(var + eps)
    return y if weight is None else y * weight + bias


class _BatchNorm(Module):
    _ranks: tuple[int, ...] = ()
    # Buffers (register_buffer): Tensors, or None without track_running_stats.
    running_mean: Any
    running_var: Any

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        *,
        dtype: DType = "float32",
    ) -> None:
        super().__init__()
        name = type(self).__name__
        self.num_features = args.positive_int(name, "num_features", num_features)
        self.eps = args.positive_float(name, "eps", eps)
        self.momentum = args.probability(name, "momentum", momentum, include_one=True)
        self.affine, self.track_running_stats = affine, track_running_stats
        self.weight = Parameter(np.ones(num_features, dtype=dtype)) if affine else None
        self.bias = Parameter(np.zeros(num_features, dtype=dtype)) if affine else None
        if track_running_stats:
            self.register_buffer("running_mean", np.zeros(num_features, dtype=dtype))
            self.register_buffer("running_var", np.ones(num_features, dtype=dtype))
        else:
            self.running_mean = self.running_var = None

    def forward(self, x: TensorLike) -> Tensor:
        x = as_input(self, x, ndim=self._ranks, last_dim=self.num_features)
        axes = tuple(range(x.data.ndim - 1))
        if x.data.size == 0:
            # An empty batch (a data-parallel shard with no rows) has no
            # statistics: the output is empty, the running statistics stay as
            # they are, and backward gives zero parameter gradients.
            mean, var = Tensor(np.zeros((), x.data.dtype)), Tensor(np.ones((), x.data.dtype))
        elif self.training or not self.track_running_stats:
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

    def extra_repr(self) -> str:
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

    def __init__(
        self,
        normalized_shape: int | Sequence[int],
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        *,
        dtype: DType = "float32",
    ) -> None:
        super().__init__()
        if isinstance(normalized_shape, (int, numbers.Integral)):
            normalized_shape = (normalized_shape,)
        self.normalized_shape = args.ints(
            "LayerNorm", "normalized_shape", tuple(normalized_shape), len(normalized_shape)
        )
        self.eps = args.positive_float("LayerNorm", "eps", eps)
        self.elementwise_affine = elementwise_affine
        self.weight = Parameter(np.ones(self.normalized_shape, dtype=dtype)) if elementwise_affine else None
        self.bias = Parameter(np.zeros(self.normalized_shape, dtype=dtype)) if elementwise_affine else None

    def forward(self, x: TensorLike) -> Tensor:
        x = as_input(self, x)
        k = len(self.normalized_shape)
        if x.data.shape[x.data.ndim - k :] != self.normalized_shape or x.data.ndim < k:
            raise EveryOShapeError(
                f"{self!r} expected input whose last {k} dimension(s) are {self.normalized_shape}, "
                f"got shape {x.data.shape}"
            )
        axes = tuple(range(x.data.ndim - k, x.data.ndim))
        mean = F.mean(x, axis=axes, keepdims=True)
        var = F.var(x, axis=axes, keepdims=True)
        return _normalize(x, mean, var, self.eps, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}"


class GroupNorm(Module):
    """Group normalisation (Wu & He, 2018), channels last.

    The channels are split into ``num_groups`` groups of consecutive channels;
    each sample is normalised over its spatial positions and the channels of
    one group, independently of the batch (so it behaves the same in train and
    eval mode, and with a batch of one).

    Args:
        num_groups: must divide ``num_channels``. 1 is LayerNorm over (H, W, C);
            ``num_channels`` is InstanceNorm.
        num_channels: the last axis' size.
        eps: added to the variance.
        affine: learn a per-channel scale (``weight``, ones) and shift (``bias``, zeros).

    Shape:
        (N, ..., C) -> same shape (any rank >= 2).

    Examples:
        >>> eo.GroupNorm(2, 6)(eo.randn(3, 4, 4, 6, seed=0)).shape
        (3, 4, 4, 6)
    """

    def __init__(
        self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True, *, dtype: DType = "float32"
    ) -> None:
        super().__init__()
        self.num_groups = args.positive_int("GroupNorm", "num_groups", num_groups)
        self.num_channels = args.positive_int("GroupNorm", "num_channels", num_channels)
        args.divides("GroupNorm", "num_groups", self.num_groups, num_channels=self.num_channels)
        self.eps, self.affine = args.positive_float("GroupNorm", "eps", eps), bool(affine)
        self.weight = Parameter(np.ones(self.num_channels, dtype=dtype)) if affine else None
        self.bias = Parameter(np.zeros(self.num_channels, dtype=dtype)) if affine else None

    def forward(self, x: TensorLike) -> Tensor:
        x = as_input(self, x, ndim=tuple(range(2, 33)), last_dim=self.num_channels)
        shape = x.data.shape
        # (N, positions, groups, channels per group); explicit sizes so a batch of 0 reshapes too.
        grouped = F.reshape(
            x, (shape[0], math.prod(shape[1:-1]), self.num_groups, self.num_channels // self.num_groups)
        )
        mean = F.mean(grouped, axis=(1, 3), keepdims=True)
        var = F.var(grouped, axis=(1, 3), keepdims=True)
        y = F.reshape(_normalize(grouped, mean, var, self.eps, None, None), shape)
        return y if self.weight is None else y * self.weight + self.bias

    def extra_repr(self) -> str:
        return f"{self.num_groups}, {self.num_channels}, eps={self.eps}, affine={self.affine}"
