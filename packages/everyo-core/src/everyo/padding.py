"""The one padding resolver, shared by Conv2D, the pooling layers, the ONNX
exporter and the tests."""

import math


def _pair(value, name):
    if isinstance(value, int):
        return (value, value)
    value = tuple(value)
    if len(value) != 2 or not all(isinstance(v, int) for v in value):
        raise ValueError(f"{name} must be an int or a pair of ints, got {value!r}")
    return value


def same_padding_1d(size, kernel, stride):
    """TensorFlow's 'same' rule on one axis: output ``ceil(size / stride)``.

    The total is ``max((ceil(size/stride) - 1) * stride + kernel - size, 0)``;
    the odd pixel goes at the end (bottom/right), which ONNX's ``auto_pad``
    would not reproduce exactly, hence explicit pads everywhere.
    """
    out = math.ceil(size / stride)
    total = max((out - 1) * stride + kernel - size, 0)
    before = total // 2
    return before, total - before


def resolve_padding2d(padding, in_hw, kernel, stride):
    """Return ``((top, bottom), (left, right))`` for an NHWC 2-D window op.

    ``padding`` is ``'valid'``, ``'same'``, an int, a pair ``(ph, pw)`` or an
    explicit ``((top, bottom), (left, right))``.
    """
    kernel, stride = _pair(kernel, "kernel_size"), _pair(stride, "stride")
    if isinstance(padding, str):
        mode = padding.lower()
        if mode == "valid":
            return (0, 0), (0, 0)
        if mode == "same":
            return tuple(same_padding_1d(in_hw[i], kernel[i], stride[i]) for i in range(2))
        raise ValueError(f"padding must be 'valid' or 'same' (or explicit numbers), got {padding!r}")
    if isinstance(padding, int):
        return (padding, padding), (padding, padding)
    padding = tuple(padding)
    if len(padding) == 2 and all(isinstance(p, int) for p in padding):
        return (padding[0], padding[0]), (padding[1], padding[1])
    if len(padding) == 2 and all(len(p) == 2 for p in padding):
        return tuple(tuple(int(v) for v in p) for p in padding)
    raise ValueError(f"cannot understand padding {padding!r}")


def output_size(size, kernel, stride, before, after):
    return (size + before + after - kernel) // stride + 1
