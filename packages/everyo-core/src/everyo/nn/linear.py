from __future__ import annotations

from typing import TYPE_CHECKING

from everyo.errors import EveryOShapeError
from everyo.functional import linear
from everyo.nn import arguments as args
from everyo.nn.init import rng_for, uniform_fan_in
from everyo.nn.module import Module, as_input
from everyo.tensor import Parameter, Tensor

if TYPE_CHECKING:
    import numpy as np

    from everyo._typing import DType, TensorLike


class Linear(Module):
    """Fully connected layer ``y = x @ weight + bias``.

    Args:
        in_features: size of the last axis of the input.
        out_features: size of the last axis of the output.
        bias: learn an additive bias.
        seed: makes the initialisation reproducible.
        weight: a Parameter to share instead of a new one (weight tying), in
            PyTorch's (out_features, in_features) layout, e.g. an
            :class:`Embedding`'s (num_embeddings, dim) table for a decoder
            ``Linear(dim, num_embeddings, weight=embedding.weight)``. It is used
            transposed, without a copy (``x @ weight.T``); see :meth:`tie_weight`.

    Shape:
        input (..., in_features) -> output (..., out_features).
        ``weight`` is (in_features, out_features) (Keras layout), or
        (out_features, in_features) when tied (``weight_transposed`` is True);
        ``bias`` (out_features,).

    Examples:
        >>> layer = eo.Linear(8, 4, seed=0)
        >>> layer(eo.ones(3, 8)).shape
        (3, 4)
        >>> emb = eo.Embedding(10, 4, seed=0)
        >>> decoder = eo.Linear(4, 10, weight=emb.weight)
        >>> decoder.weight is emb.weight, decoder(emb(np.array([[1, 2]]))).shape
        (True, (1, 2, 10))
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        *,
        seed: int | np.random.Generator | None = None,
        dtype: DType = "float32",
        weight: Parameter | None = None,
    ) -> None:
        super().__init__()
        self.in_features = args.positive_int("Linear", "in_features", in_features)
        self.out_features = args.positive_int("Linear", "out_features", out_features)
        rng = rng_for(seed)
        self.weight_transposed = False
        self.weight = Parameter(uniform_fan_in(rng, (self.in_features, self.out_features), self.in_features, dtype))
        self.bias = Parameter(uniform_fan_in(rng, (self.out_features,), self.in_features, dtype)) if bias else None
        if weight is not None:
            self.tie_weight(weight)

    def tie_weight(self, weight: Parameter) -> None:
        """Share ``weight`` (PyTorch's (out_features, in_features) layout, e.g. an
        Embedding's table) as this layer's weight, used transposed without a copy.

        PyTorch's ``decoder.weight = encoder.weight`` is
        ``decoder.tie_weight(encoder.weight)`` here. Gradients from both uses add
        up in the one Parameter; ``parameters()`` and ``state_dict()`` list it once
        (under the name first reached), a loaded checkpoint keeps it shared, and
        ONNX export writes one initializer.

        Raises:
            EveryOShapeError: ``weight`` is not (out_features, in_features).
        """
        expected = (self.out_features, self.in_features)
        if not isinstance(weight, Parameter) or weight.data.shape != expected:
            got = weight.data.shape if isinstance(weight, Tensor) else type(weight).__name__
            raise EveryOShapeError(
                f"{self!r}.tie_weight needs a Parameter of shape (out_features, in_features) = {expected} "
                f"(PyTorch's layout, an Embedding's (num_embeddings, dim) table), got {got}"
            )
        self.weight = weight
        self.weight_transposed = True

    def forward(self, x: TensorLike) -> Tensor:
        x = as_input(self, x, last_dim=self.in_features)
        expected = (
            (self.out_features, self.in_features) if self.weight_transposed else (self.in_features, self.out_features)
        )
        if self.weight.data.shape != expected:
            raise EveryOShapeError(
                f"{self!r} has a weight of shape {self.weight.data.shape}, expected {expected}; to share an "
                "Embedding's table (PyTorch's decoder.weight = encoder.weight) use decoder.tie_weight(encoder.weight)"
            )
        return linear(x, self.weight, self.bias, transpose_weight=self.weight_transposed)

    def extra_repr(self) -> str:
        tied = ", tied (weight used transposed)" if self.weight_transposed else ""
        return f"{self.in_features}, {self.out_features}" + ("" if self.bias is not None else ", bias=False") + tied
