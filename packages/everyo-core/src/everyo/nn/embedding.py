"""Embedding (ids -> learned vectors) and PositionalEncoding (positions -> fixed vectors)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from everyo import functional as F
from everyo.errors import EveryOShapeError
from everyo.nn.module import Module, as_input
from everyo.random import generator_for
from everyo.sequence_ops import embedding
from everyo.tensor import Parameter, Tensor

if TYPE_CHECKING:
    from everyo._typing import Array, DType, TensorLike

__all__ = ["Embedding", "PositionalEncoding"]


class Embedding(Module):
    """A lookup table: integer ids -> learned vectors.

    Args:
        num_embeddings: number of rows (valid ids are ``0 .. num_embeddings - 1``).
        dim: size of each vector.
        padding_idx: an id whose row starts at zero and never receives a
            gradient (e.g. the padding token). Negative values count from the end.
        seed: makes the N(0, 1) initialisation (PyTorch's) reproducible.

    Shape:
        integer input of any shape (...) -> output (..., dim). ``weight`` is
        (num_embeddings, dim). Ids out of range raise ``EveryOIndexError``;
        they never wrap around. Repeated ids accumulate their gradients.

    Examples:
        >>> emb = eo.Embedding(10, 4, seed=0)
        >>> emb(np.array([[1, 2, 2]])).shape
        (1, 3, 4)
    """

    def __init__(
        self,
        num_embeddings: int,
        dim: int,
        padding_idx: int | None = None,
        *,
        seed: int | np.random.Generator | None = None,
        dtype: DType = "float32",
    ) -> None:
        super().__init__()
        self.num_embeddings, self.dim = int(num_embeddings), int(dim)
        if padding_idx is not None:
            if not -self.num_embeddings <= padding_idx < self.num_embeddings:
                raise ValueError(f"Embedding padding_idx {padding_idx} is outside the table of {num_embeddings} rows")
            padding_idx = int(padding_idx) % self.num_embeddings
        self.padding_idx = padding_idx
        weight = generator_for(seed).standard_normal((self.num_embeddings, self.dim)).astype(dtype)
        if padding_idx is not None:
            weight[padding_idx] = 0
        self.weight = Parameter(weight)

    def forward(self, indices: TensorLike) -> Tensor:
        return embedding(indices, self.weight, self.padding_idx)

    def extra_repr(self) -> str:
        pad = "" if self.padding_idx is None else f", padding_idx={self.padding_idx}"
        return f"{self.num_embeddings}, {self.dim}{pad}"


def sinusoidal_table(max_len: int, dim: int) -> Array:
    """The (max_len, dim) table of "Attention Is All You Need":
    ``PE[p, 2i] = sin(p / 10000^(2i/dim))``, ``PE[p, 2i+1] = cos(p / 10000^(2i/dim))``."""
    position = np.arange(max_len, dtype=np.float64)[:, None]
    frequency = np.exp(np.arange(0, dim, 2, dtype=np.float64) * (-math.log(10000.0) / dim))
    table = np.zeros((max_len, dim))
    table[:, 0::2] = np.sin(position * frequency)
    table[:, 1::2] = np.cos(position * frequency[: dim // 2])
    return table


class PositionalEncoding(Module):
    """Adds the fixed sinusoidal position table to a batch-first sequence, then dropout.

    Args:
        dim: the feature width (last axis) of the input.
        max_len: the longest sequence accepted.
        dropout: dropout probability applied after the addition (train mode only).
        seed: makes the dropout masks reproducible.

    The table has no parameters and is not saved in ``state_dict()``: it is a
    fixed function of ``(max_len, dim)``, rebuilt on construction.

    Shape:
        input (batch, time, dim) with time <= max_len -> output of the same shape.

    Examples:
        >>> pe = eo.PositionalEncoding(16, max_len=100, dropout=0.0)
        >>> pe(eo.zeros(2, 7, 16)).shape
        (2, 7, 16)
    """

    generator: np.random.Generator  # registered in __init__ when dropout > 0

    def __init__(
        self, dim: int, max_len: int = 5000, dropout: float = 0.1, *, seed: int | np.random.Generator | None = None
    ) -> None:
        super().__init__()
        if not 0 <= dropout < 1:
            raise ValueError(f"PositionalEncoding dropout must be in [0, 1), got {dropout}")
        self.dim, self.max_len, self.dropout = int(dim), int(max_len), float(dropout)
        self.table = sinusoidal_table(self.max_len, self.dim)  # float64; cast per input dtype
        self._cast: dict[np.dtype[Any], Array] = {}
        stream = generator_for(seed)
        if self.dropout:  # saved in state_dict only where it is drawn from
            self.register_generator("generator", stream)

    def forward(self, x: TensorLike) -> Tensor:
        x = as_input(self, x, ndim=3, last_dim=self.dim)
        length = x.data.shape[1]
        if length > self.max_len:
            raise EveryOShapeError(
                f"{self!r} received a sequence of length {length}, longer than max_len={self.max_len}; "
                f"build it with a larger max_len"
            )
        dtype = x.data.dtype
        if dtype not in self._cast:
            self._cast[dtype] = self.table.astype(dtype)
        y = x + Tensor(self._cast[dtype][:length])
        return F.dropout(y, self.dropout, self.training, self.generator) if self.dropout else y

    def extra_repr(self) -> str:
        return f"{self.dim}, max_len={self.max_len}, dropout={self.dropout}"
