"""The one padding resolver, shared by Conv2D, the pooling layers, the ONNX
exporter and the tests."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any, TypeAlias

    #: A 2-D window op's padding: ``'valid'``, ``'same'``, an int, a pair
    #: ``(ph, pw)`` or explicit ``((top, bottom), (left, right))``.
    Padding2d: TypeAlias = str | int | Sequence[int] | Sequence[Sequence[int]]


def _pair(value: int | Sequence[int], name: str) -> tuple[int, int]:
    if isinstance(value, int):
        return (value, value)
    value = tuple(value)
    if len(value) != 2 or not all(isinstance(v, int) for v in value):
        raise ValueError(f"{name} must be an int or a pair of ints, got {value!r}")
    return value[0], value[1]


def same_padding_1d(size: int, kernel: int, stride: int) -> tuple[int, int]:
    """TensorFlow's 'same' rule on one axis: output ``ceil(size / stride)``.

    The total is ``max((ceil(size/stride) - 1) * stride + kernel - size, 0)``;
    the odd pixel goes at the end (bottom/right), which ONNX's ``auto_pad``
    would not reproduce exactly, hence explicit pads everywhere.
    """
    out = math.ceil(size / stride)
    total = max((out - 1) * stride + kernel - size, 0)
    before = total // 2
    return before, total - before


def resolve_padding2d(
    padding: Padding2d, in_hw: Sequence[int], kernel: int | Sequence[int], stride: int | Sequence[int]
) -> tuple[tuple[int, int], tuple[int, int]]:
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
            return same_padding_1d(in_hw[0], kernel[0], stride[0]), same_padding_1d(in_hw[1], kernel[1], stride[1])
        raise ValueError(f"padding must be 'valid' or 'same' (or explicit numbers), got {padding!r}")
    if isinstance(padding, int):
        return (padding, padding), (padding, padding)
    pads: tuple[Any, ...] = tuple(padding)
    if len(pads) == 2 and all(isinstance(p, int) for p in pads):
        return (pads[0], pads[0]), (pads[1], pads[1])
    if len(pads) == 2 and all(len(p) == 2 for p in pads):
        (top, bottom), (left, right) = pads
        return (int(top), int(bottom)), (int(left), int(right))
    raise ValueError(f"cannot understand padding {pads!r}")


def output_size(size: int, kernel: int, stride: int, before: int, after: int) -> int:
    return (size + before + after - kernel) // stride + 1


def counts_padding(padding: Padding2d, count_include_pad: bool | None) -> bool:
    """Whether average pooling divides by the whole window, padded cells included.

    ``None`` picks the convention that goes with the spelling of ``padding``:
    ``'same'`` follows Keras/TensorFlow (only the input cells of each window
    are counted), numeric padding follows PyTorch (``count_include_pad=True``:
    every window divides by ``kernel_h * kernel_w``). ``'valid'`` pads nothing,
    so either answer gives the same numbers.
    """
    if count_include_pad is not None:
        return bool(count_include_pad)
    return not isinstance(padding, str)
