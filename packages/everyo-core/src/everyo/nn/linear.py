from __future__ import annotations

from typing import TYPE_CHECKING

from everyo.functional import linear
from everyo.nn import arguments as args
from everyo.nn.init import rng_for, uniform_fan_in
from everyo.nn.module import Module, as_input
from everyo.tensor import Parameter

if TYPE_CHECKING:
    import numpy as np

    from everyo._typing import DType, TensorLike
    from everyo.tensor import Tensor


class Linear(Module):
    """Fully connected layer ``y = x @ weight + bias``.

    Args:
        in_features: size of the last axis of the input.
        out_features: size of the last axis of the output.
        bias: learn an additive bias.
        seed: makes the initialisation reproducible.

    Shape:
        input (..., in_features) -> output (..., out_features).
        ``weight`` is (in_features, out_features) (Keras layout), ``bias`` (out_features,).

    Examples:
        >>> layer = eo.Linear(8, 4, seed=0)
        >>> layer(eo.ones(3, 8)).shape
        (3, 4)
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        *,
        seed: int | np.random.Generator | None = None,
        dtype: DType = "float32",
    ) -> None:
        super().__init__()
        self.in_features = args.positive_int("Linear", "in_features", in_features)
        self.out_features = args.positive_int("Linear", "out_features", out_features)
        rng = rng_for(seed)
        self.weight = Parameter(uniform_fan_in(rng, (self.in_features, self.out_features), self.in_features, dtype))
        self.bias = Parameter(uniform_fan_in(rng, (self.out_features,), self.in_features, dtype)) if bias else None

    def forward(self, x: TensorLike) -> Tensor:
        x = as_input(self, x, last_dim=self.in_features)
        return linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}" + ("" if self.bias is not None else ", bias=False")
