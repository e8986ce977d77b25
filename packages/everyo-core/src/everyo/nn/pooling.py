"""Global pooling layers (Keras names): one value per channel of an NHWC input."""

from everyo import functional as F
from everyo.nn.module import Module, as_input

__all__ = ["GlobalAveragePooling2D", "GlobalMaxPooling2D"]


class _GlobalPool2D(Module):
    _reduce = None

    def __init__(self, keepdims=False):
        super().__init__()
        self.keepdims = bool(keepdims)

    def forward(self, x):
        x = as_input(self, x, ndim=4, what="NHWC input")
        return type(self)._reduce(x, axis=(1, 2), keepdims=self.keepdims)

    def extra_repr(self):
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
