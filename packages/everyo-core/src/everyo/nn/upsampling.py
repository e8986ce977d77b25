"""UpSampling2D: enlarge NHWC feature maps by integer factors."""

from __future__ import annotations

from typing import TYPE_CHECKING

from everyo.nn import arguments as args
from everyo.nn.module import Module, as_input
from everyo.upsampling import upsample2d

if TYPE_CHECKING:
    from collections.abc import Sequence

    from everyo._typing import TensorLike
    from everyo.tensor import Tensor

__all__ = ["UpSampling2D"]


class UpSampling2D(Module):
    """Repeat rows and columns (``'nearest'``) or interpolate them (``'bilinear'``).

    Args:
        size: int or (sh, sw) integer factors (Keras's argument).
        interpolation: ``'nearest'`` or ``'bilinear'``.
        align_corners: bilinear only. False (default) is PyTorch's default and
            Keras's behaviour (half-pixel centres: output p samples input
            ``(p + 0.5) / scale - 0.5``, clamped at the border); True maps the
            corner pixels onto each other (``p * (H - 1) / (OH - 1)``).

    Shape:
        (N, H, W, C) -> (N, H * sh, W * sw, C).

    Examples:
        >>> eo.UpSampling2D(2, interpolation="bilinear")(eo.ones(1, 3, 3, 2)).shape
        (1, 6, 6, 2)
    """

    def __init__(
        self, size: int | Sequence[int] = 2, interpolation: str = "nearest", align_corners: bool = False
    ) -> None:
        super().__init__()
        self.size = args.positive_ints("UpSampling2D", "size", size)
        self.interpolation = args.one_of("UpSampling2D", "interpolation", interpolation, ("nearest", "bilinear"))
        if align_corners and interpolation != "bilinear":
            raise ValueError("UpSampling2D: align_corners applies to interpolation='bilinear' only")
        self.align_corners = bool(align_corners)

    def forward(self, x: TensorLike) -> Tensor:
        x = as_input(self, x, ndim=4, what="NHWC input")
        return upsample2d(x, self.size, self.interpolation, self.align_corners)

    def extra_repr(self) -> str:
        extra = ", align_corners=True" if self.align_corners else ""
        return f"size={self.size}, interpolation={self.interpolation!r}" + extra
