"""Global pooling layers (Keras names): one value per channel of an NHWC input."""

from __future__ import annotations

from typing import TYPE_CHECKING

from everyo import functional as F
from everyo.nn.module import Module, as_input

if TYPE_CHECKING:
    from collections.abc import Callable

    from everyo._typing import TensorLike
    from everyo.tensor import Tensor

__all__ = ["GlobalAveragePooling2D", "GlobalMaxPooling2D"]


class _GlobalPool2D(Module):
    _reduce: Callable[..., Tensor]  # the reduction over (H, W), set by each subclass

    def __init__(self, keepdims: bool = False) -> None:
        super().__init__()
        self.keepdims = bool(keepdims)

    def forward(self, x: TensorLike) -> Tensor:
        x = as_input(self, x, ndim=4, what="NHWC input")
        return type(self)._reduce(x, axis=(1, 2), keepdims=self.keepdims)

    def extra_repr(self) -> str:
        return "keepdims=True" if self.keepdims else ""


class GlobalAveragePooling2D(_GlobalPool2D):
    """Mean over the spatial axes.

    Args:
        keepdims: keep H and W as size-1 axes.

    Shape:
        (N, H, W, C) -> (N, C), or (N, 1, 1, C) with ``keepdims``.

    Examples:
        >>> eo.GlobalAveragePooling2D()(eo.ones(2, 5, 5, 3)).shape
        (2, 3)
    """

    _reduce = staticmethod(F.mean)


class GlobalMaxPooling2D(_GlobalPool2D):
    """Maximum over the spatial axes; tied maxima share the gradient equally
    (``eo.max``'s rule; MaxPool2D gives it to the first maximum instead).

    Shape:
        (N, H, W, C) -> (N, C), or (N, 1, 1, C) with ``keepdims``.

    Examples:
        >>> eo.GlobalMaxPooling2D()(eo.ones(2, 5, 5, 3)).shape
        (2, 3)
    """

    _reduce = staticmethod(F.max)
