from everyo.conv import avg_pool2d, conv2d, max_pool2d
from everyo.nn.init import rng_for, uniform_fan_in
from everyo.nn.module import Module, as_input
from everyo.padding import _pair
from everyo.tensor import Parameter


class Conv2D(Module):
    """2-D convolution on NHWC input.

    Args:
        in_channels, out_channels: channel counts.
        kernel_size: int or (kh, kw).
        stride: int or (sh, sw).
        padding: 'valid' (no padding) or 'same' (TensorFlow's rule: output
            ``ceil(in / stride)``, the odd pixel of padding at the end).
        seed: makes the initialisation reproducible.

    Shape:
        input (N, H, W, in_channels) -> output (N, OH, OW, out_channels).
        ``weight`` is (kh, kw, in_channels, out_channels), ``bias`` (out_channels,).
    """

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding="valid", bias=True,
                 *, seed=None, dtype="float32"):
        super().__init__()
        self.in_channels, self.out_channels = int(in_channels), int(out_channels)
        self.kernel_size = _pair(kernel_size, "kernel_size")
        self.stride = _pair(stride, "stride")
        self.padding = padding
        rng = rng_for(seed)
        fan_in = self.kernel_size[0] * self.kernel_size[1] * self.in_channels
        self.weight = Parameter(uniform_fan_in(rng, self.kernel_size + (self.in_channels, self.out_channels), fan_in, dtype))
        self.bias = Parameter(uniform_fan_in(rng, (self.out_channels,), fan_in, dtype)) if bias else None

    def forward(self, x):
        x = as_input(self, x, ndim=4, last_dim=self.in_channels, what="NHWC input")
        return conv2d(x, self.weight, self.bias, stride=self.stride, padding=self.padding)

    def extra_repr(self):
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, padding={self.padding!r}")


class _Pool2D(Module):
    _op = None

    def __init__(self, pool_size=2, stride=None, padding="valid"):
        super().__init__()
        self.pool_size = _pair(pool_size, "pool_size")
        self.stride = self.pool_size if stride is None else _pair(stride, "stride")
        self.padding = padding

    def forward(self, x):
        x = as_input(self, x, ndim=4, what="NHWC input")
        return type(self)._op(x, self.pool_size, self.stride, self.padding)

    def extra_repr(self):
        return f"pool_size={self.pool_size}, stride={self.stride}, padding={self.padding!r}"


class MaxPool2D(_Pool2D):
    """Max pooling on NHWC input; ``stride`` defaults to ``pool_size`` (Keras)."""

    _op = staticmethod(max_pool2d)


class AvgPool2D(_Pool2D):
    """Average pooling on NHWC input; with 'same' padding, padded cells are not counted."""

    _op = staticmethod(avg_pool2d)
