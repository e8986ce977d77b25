"""Batch, layer and group normalisation, channels last (NHWC / (N, C) / (N, L, C)).

Each layer is one :func:`~everyo.normalization_ops.normalize` node. The
statistics and the normalisation are computed in float32 (or wider); the
parameters and running statistics keep their own type. Under ``autocast``
(Keras's ``mixed_float16`` behaviour) a float16 or bfloat16 input gives an
output of that type, rounded once, and backward keeps only the 16-bit input
and the per-group statistics.
"""

from __future__ import annotations

import math
import numbers
from typing import TYPE_CHECKING, Any

import numpy as np

from everyo import functional as F
from everyo.errors import EveryOShapeError
from everyo.nn import arguments as args
from everyo.nn.module import Module, as_input
from everyo.normalization_ops import _wide, normalize
from everyo.tensor import Parameter

if TYPE_CHECKING:
    from collections.abc import Sequence

    from everyo._typing import DType, TensorLike
    from everyo.tensor import Tensor


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
            return normalize(
                x, self.weight, self.bias, axes, self.eps, np.zeros((), np.float32), np.ones((), np.float32)
            )
        if self.training or not self.track_running_stats:
            if self.training and self.track_running_stats:
                self._update_running_stats(x, axes)
            return normalize(x, self.weight, self.bias, axes, self.eps)
        return normalize(x, self.weight, self.bias, axes, self.eps, self.running_mean.data, self.running_var.data)

    def _update_running_stats(self, x, axes):
        # The batch's statistics in float32 (or wider), as normalize computes them.
        data = _wide(x)
        if data.dtype != np.float64:
            data = data.astype(np.float32, copy=False)
        mean = data.mean(axis=axes, keepdims=True)
        centered = data - mean
        var = (centered * centered).sum(axis=axes) / (data.size // self.num_features)
        n = x.data.size // self.num_features
        m = self.momentum
        unbiased = var.reshape(-1) * (n / max(n - 1, 1))
        rm, rv = self.running_mean.data, self.running_var.data
        self.running_mean.data = ((1 - m) * rm + m * mean.reshape(-1)).astype(rm.dtype)
        self.running_var.data = ((1 - m) * rv + m * unbiased).astype(rv.dtype)

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
    """Normalise over the trailing ``normalized_shape`` axes of each sample.

    Args:
        normalized_shape: the trailing shape normalised over (an int for one axis).
        eps: added to the variance.
        elementwise_affine: learn a scale ``weight`` (ones) and, with ``bias``,
            a shift ``bias`` (zeros), each of ``normalized_shape``.
        bias: learn the shift (``bias=False``: scale only, ``self.bias`` is None), as PyTorch.
        dtype: the parameters' dtype.
    """

    def __init__(
        self,
        normalized_shape: int | Sequence[int],
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
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
        self.bias = Parameter(np.zeros(self.normalized_shape, dtype=dtype)) if elementwise_affine and bias else None

    def forward(self, x: TensorLike) -> Tensor:
        x = as_input(self, x)
        k = len(self.normalized_shape)
        if x.data.shape[x.data.ndim - k :] != self.normalized_shape or x.data.ndim < k:
            raise EveryOShapeError(
                f"{self!r} expected input whose last {k} dimension(s) are {self.normalized_shape}, "
                f"got shape {x.data.shape}"
            )
        axes = tuple(range(x.data.ndim - k, x.data.ndim))
        if self.weight is not None and self.bias is None:
            return normalize(x, axis=axes, eps=self.eps) * self.weight
        return normalize(x, self.weight, self.bias, axes, self.eps)

    def extra_repr(self) -> str:
        extra = "" if self.bias is not None or self.weight is None else ", bias=False"
        return f"{self.normalized_shape}, eps={self.eps}{extra}"


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
        if self.weight is None or self.bias is None:
            return F.reshape(normalize(grouped, None, None, (1, 3), self.eps), shape)
        # The per-channel scale and shift in the grouped layout: one op, one rounding.
        per_group = (self.num_groups, self.num_channels // self.num_groups)
        weight, bias = F.reshape(self.weight, per_group), F.reshape(self.bias, per_group)
        return F.reshape(normalize(grouped, weight, bias, (1, 3), self.eps), shape)

    def extra_repr(self) -> str:
        return f"{self.num_groups}, {self.num_channels}, eps={self.eps}, affine={self.affine}"
