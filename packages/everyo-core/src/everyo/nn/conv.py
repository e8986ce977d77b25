"""Convolution and pooling layers, channels last (Keras's NHWC / NLC layouts)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from everyo.conv import avg_pool2d, conv1d, conv2d, max_pool2d
from everyo.conv_transpose import conv_transpose2d
from everyo.nn import arguments as args
from everyo.nn.init import rng_for, uniform_fan_in
from everyo.nn.module import Module, as_input
from everyo.tensor import Parameter

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    import numpy as np

    from everyo._typing import DType, TensorLike
    from everyo.tensor import Tensor


class Conv2D(Module):
    """2-D convolution on NHWC input.

    Args:
        in_channels: input channel count.
        out_channels: output channel count.
        kernel_size: int or (kh, kw).
        stride: int or (sh, sw).
        padding: 'valid' (no padding), 'same' (TensorFlow's rule: output
            ``ceil(in / stride)``, the odd pixel of padding at the end), or
            explicit non-negative numbers: an int, (ph, pw) or ((top, bottom), (left, right)).
        dilation: int or (dh, dw): spacing between kernel taps (atrous convolution).
        groups: split channels into ``groups`` independent convolutions; must
            divide both channel counts. ``groups == in_channels`` is depthwise.
        seed: makes the initialisation reproducible.

    Shape:
        input (N, H, W, in_channels) -> output (N, OH, OW, out_channels).
        ``weight`` is (kh, kw, in_channels // groups, out_channels), ``bias`` (out_channels,).

    Examples:
        >>> eo.Conv2D(8, 8, 3, padding="same", groups=8, seed=0)(eo.ones(2, 5, 5, 8)).shape
        (2, 5, 5, 8)
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | Sequence[int],
        stride: int | Sequence[int] = 1,
        padding: str | int | Sequence[int] | Sequence[Sequence[int]] = "valid",
        bias: bool = True,
        *,
        dilation: int | Sequence[int] = 1,
        groups: int = 1,
        seed: int | np.random.Generator | None = None,
        dtype: DType = "float32",
    ) -> None:
        super().__init__()
        name = type(self).__name__
        self.in_channels = args.positive_int(name, "in_channels", in_channels)
        self.out_channels = args.positive_int(name, "out_channels", out_channels)
        self.kernel_size = args.positive_ints(name, "kernel_size", kernel_size)
        self.stride = args.positive_ints(name, "stride", stride)
        self.padding = args.padding2d(name, padding)
        self.dilation = args.positive_ints(name, "dilation", dilation)
        self.groups = args.positive_int(name, "groups", groups)
        args.divides(name, "groups", self.groups, in_channels=self.in_channels, out_channels=self.out_channels)
        rng = rng_for(seed)
        cin_g = self.in_channels // self.groups
        fan_in = self.kernel_size[0] * self.kernel_size[1] * cin_g
        self.weight = Parameter(uniform_fan_in(rng, self.kernel_size + (cin_g, self.out_channels), fan_in, dtype))
        self.bias = Parameter(uniform_fan_in(rng, (self.out_channels,), fan_in, dtype)) if bias else None

    def forward(self, x: TensorLike) -> Tensor:
        x = as_input(self, x, ndim=4, last_dim=self.in_channels, what="NHWC input")
        args.window_fits(self, x.data.shape, self.kernel_size, self.stride, self.padding, self.dilation)
        return conv2d(
            x,
            self.weight,
            self.bias,
            stride=self.stride,
            padding=self.padding,
            dilation=self.dilation,
            groups=self.groups,
        )

    def extra_repr(self) -> str:
        extra = "".join(
            f", {k}={v}" for k, v in (("dilation", self.dilation), ("groups", self.groups)) if v not in ((1, 1), 1)
        )
        return (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
            f"stride={self.stride}, padding={self.padding!r}" + extra
        )


class Conv1D(Module):
    """1-D convolution on channels-last (N, L, C) input, Keras's layout.

    Args:
        in_channels: as :class:`Conv2D`.
        out_channels: as :class:`Conv2D`.
        groups: as :class:`Conv2D`.
        seed: as :class:`Conv2D`.
        kernel_size: an int.
        stride: an int.
        dilation: an int.
        padding: 'valid', 'same' (output ``ceil(L / stride)``), 'causal'
            (left padding only: output t depends on inputs up to t), an int or
            a pair (left, right).

    Shape:
        input (N, L, in_channels) -> (N, OL, out_channels).
        ``weight`` is (k, in_channels // groups, out_channels).

    Examples:
        >>> eo.Conv1D(4, 6, 3, padding="causal", dilation=2, seed=0)(eo.ones(2, 10, 4)).shape
        (2, 10, 6)
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        stride: int = 1,
        padding: str | int | Sequence[int] = "valid",
        bias: bool = True,
        *,
        dilation: int = 1,
        groups: int = 1,
        seed: int | np.random.Generator | None = None,
        dtype: DType = "float32",
    ) -> None:
        super().__init__()
        self.in_channels = args.positive_int("Conv1D", "in_channels", in_channels)
        self.out_channels = args.positive_int("Conv1D", "out_channels", out_channels)
        self.kernel_size = args.positive_int("Conv1D", "kernel_size", kernel_size)
        self.stride = args.positive_int("Conv1D", "stride", stride)
        self.dilation = args.positive_int("Conv1D", "dilation", dilation)
        self.groups = args.positive_int("Conv1D", "groups", groups)
        args.divides("Conv1D", "groups", self.groups, in_channels=self.in_channels, out_channels=self.out_channels)
        self.padding: str | int | Sequence[int]
        if isinstance(padding, str):
            self.padding = args.one_of("Conv1D", "padding", padding.lower(), ("valid", "same", "causal"))
        else:
            self.padding = padding
            args.ints("Conv1D", "padding", padding, 1 if isinstance(padding, int) else 2, minimum=0)
        rng = rng_for(seed)
        cin_g = self.in_channels // self.groups
        fan_in = self.kernel_size * cin_g
        self.weight = Parameter(uniform_fan_in(rng, (self.kernel_size, cin_g, self.out_channels), fan_in, dtype))
        self.bias = Parameter(uniform_fan_in(rng, (self.out_channels,), fan_in, dtype)) if bias else None

    def _padding2d(self):
        if self.padding == "causal":
            return ((0, 0), (self.dilation * (self.kernel_size - 1), 0))
        if isinstance(self.padding, str):
            return self.padding
        p = (self.padding, self.padding) if isinstance(self.padding, int) else tuple(self.padding)
        return ((0, 0), p)

    def forward(self, x: TensorLike) -> Tensor:
        x = as_input(self, x, ndim=3, last_dim=self.in_channels, what="(N, L, C) input")
        n, length, c = x.data.shape
        args.window_fits(
            self, (n, 1, length, c), (1, self.kernel_size), (1, self.stride), self._padding2d(), (1, self.dilation)
        )
        return conv1d(
            x,
            self.weight,
            self.bias,
            stride=self.stride,
            padding=self.padding,
            dilation=self.dilation,
            groups=self.groups,
        )

    def extra_repr(self) -> str:
        return (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
            f"padding={self.padding!r}, dilation={self.dilation}, groups={self.groups}"
        )


class Conv2DTranspose(Module):
    """Transposed 2-D convolution on NHWC input (up-sampling by ``stride``).

    Args:
        in_channels: as :class:`Conv2D`.
        out_channels: as :class:`Conv2D`.
        kernel_size: as :class:`Conv2D`.
        stride: as :class:`Conv2D`.
        dilation: as :class:`Conv2D`.
        seed: as :class:`Conv2D`.
        padding: 'valid' (output ``(H - 1) * stride + dilation * (k - 1) + 1``),
            'same' (Keras: output ``H * stride``), or non-negative numbers,
            PyTorch's meaning (rows/columns cropped from each side).
        output_padding: extra rows/columns at the bottom/right; each must be
            smaller than the stride or the dilation (PyTorch's rule).

    Shape:
        input (N, H, W, in_channels) -> (N, OH, OW, out_channels).
        ``weight`` is (kh, kw, in_channels, out_channels), ``bias`` (out_channels,).
        Initialised as PyTorch's ConvTranspose2d: U(+-1/sqrt(out_channels * kh * kw)).

    Examples:
        >>> eo.Conv2DTranspose(4, 2, 3, stride=2, padding="same", seed=0)(eo.ones(1, 5, 5, 4)).shape
        (1, 10, 10, 2)
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | Sequence[int],
        stride: int | Sequence[int] = 1,
        padding: str | int | Sequence[int] | Sequence[Sequence[int]] = "valid",
        output_padding: int | Sequence[int] = 0,
        bias: bool = True,
        *,
        dilation: int | Sequence[int] = 1,
        seed: int | np.random.Generator | None = None,
        dtype: DType = "float32",
    ) -> None:
        super().__init__()
        name = "Conv2DTranspose"
        self.in_channels = args.positive_int(name, "in_channels", in_channels)
        self.out_channels = args.positive_int(name, "out_channels", out_channels)
        self.kernel_size = args.positive_ints(name, "kernel_size", kernel_size)
        self.stride = args.positive_ints(name, "stride", stride)
        self.padding = args.padding2d(name, padding)
        self.dilation = args.positive_ints(name, "dilation", dilation)
        self.output_padding = args.ints(name, "output_padding", output_padding, 2, minimum=0)
        for extra, s, d in zip(self.output_padding, self.stride, self.dilation):
            if extra >= max(s, d):
                raise ValueError(
                    f"{name}: output_padding {self.output_padding} must be smaller than the stride "
                    f"{self.stride} or the dilation {self.dilation}"
                )
        rng = rng_for(seed)
        fan_in = self.kernel_size[0] * self.kernel_size[1] * self.out_channels
        shape = self.kernel_size + (self.in_channels, self.out_channels)
        self.weight = Parameter(uniform_fan_in(rng, shape, fan_in, dtype))
        self.bias = Parameter(uniform_fan_in(rng, (self.out_channels,), fan_in, dtype)) if bias else None

    def forward(self, x: TensorLike) -> Tensor:
        x = as_input(self, x, ndim=4, last_dim=self.in_channels, what="NHWC input")
        return conv_transpose2d(
            x,
            self.weight,
            self.bias,
            stride=self.stride,
            padding=self.padding,
            output_padding=self.output_padding,
            dilation=self.dilation,
        )

    def extra_repr(self) -> str:
        return (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
            f"padding={self.padding!r}, output_padding={self.output_padding}, dilation={self.dilation}"
        )


class _Pool2D(Module):
    _op: Callable[..., Tensor]  # the pooling function, set by each subclass

    def __init__(
        self,
        pool_size: int | Sequence[int] = 2,
        stride: int | Sequence[int] | None = None,
        padding: str | int | Sequence[int] | Sequence[Sequence[int]] = "valid",
    ) -> None:
        super().__init__()
        name = type(self).__name__
        self.pool_size = args.positive_ints(name, "pool_size", pool_size)
        self.stride = self.pool_size if stride is None else args.positive_ints(name, "stride", stride)
        self.padding = args.padding2d(name, padding)
        if not isinstance(self.padding, str):
            from everyo.padding import resolve_padding2d

            (t, b), (l, r) = resolve_padding2d(self.padding, (0, 0), self.pool_size, self.stride)
            if max(t, b) >= self.pool_size[0] or max(l, r) >= self.pool_size[1]:
                # A window made only of padding would have no input to pool.
                raise ValueError(f"{name}: padding {padding!r} must be smaller than pool_size {self.pool_size}")

    def forward(self, x: TensorLike) -> Tensor:
        x = as_input(self, x, ndim=4, what="NHWC input")
        args.window_fits(self, x.data.shape, self.pool_size, self.stride, self.padding)
        return type(self)._op(x, self.pool_size, self.stride, self.padding)

    def extra_repr(self) -> str:
        return f"pool_size={self.pool_size}, stride={self.stride}, padding={self.padding!r}"


class MaxPool2D(_Pool2D):
    """Max pooling on NHWC input; ``stride`` defaults to ``pool_size`` (Keras)."""

    _op = staticmethod(max_pool2d)


class AvgPool2D(_Pool2D):
    """Average pooling on NHWC input; ``stride`` defaults to ``pool_size`` (Keras).

    Args:
        pool_size: the window, as for :class:`MaxPool2D`.
        stride: the step, as for :class:`MaxPool2D`.
        padding: as for :class:`MaxPool2D`.
        count_include_pad: whether padded cells count in each window's divisor.
            ``None`` (the default) follows the spelling of ``padding``: with
            ``'same'``, Keras' rule (they do not); with numeric padding,
            PyTorch's default (they do, as ``nn.AvgPool2d`` counts them).
            See :func:`everyo.avg_pool2d`.

    Examples:
        >>> eo.AvgPool2D(3, 2, padding=1)(eo.ones(1, 5, 5, 2)).shape
        (1, 3, 3, 2)
    """

    _op = staticmethod(avg_pool2d)

    def __init__(
        self,
        pool_size: int | Sequence[int] = 2,
        stride: int | Sequence[int] | None = None,
        padding: str | int | Sequence[int] | Sequence[Sequence[int]] = "valid",
        count_include_pad: bool | None = None,
    ) -> None:
        super().__init__(pool_size, stride, padding)
        if count_include_pad is not None and not isinstance(count_include_pad, bool):
            raise TypeError(f"AvgPool2D: count_include_pad must be True, False or None, got {count_include_pad!r}")
        self.count_include_pad = count_include_pad

    def forward(self, x: TensorLike) -> Tensor:
        x = as_input(self, x, ndim=4, what="NHWC input")
        args.window_fits(self, x.data.shape, self.pool_size, self.stride, self.padding)
        return avg_pool2d(x, self.pool_size, self.stride, self.padding, self.count_include_pad)

    def extra_repr(self) -> str:
        extra = "" if self.count_include_pad is None else f", count_include_pad={self.count_include_pad}"
        return super().extra_repr() + extra
