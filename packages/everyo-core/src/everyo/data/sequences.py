"""pad_sequences: variable-length sequences -> one padded batch and their lengths."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from everyo.errors import EveryOShapeError
from everyo.tensor import Tensor

if TYPE_CHECKING:
    from collections.abc import Sequence

    from everyo._typing import Array, DType, TensorLike

__all__ = ["pad_sequences"]


def pad_sequences(
    sequences: Sequence[TensorLike], value: float = 0, *, maxlen: int | None = None, dtype: DType | None = None
) -> tuple[Array, Array]:
    """Stack sequences of different lengths into one batch, padded at the end.

    The lengths it returns go straight to ``lengths=`` of RNN, LSTM and GRU,
    which then ignore the padding (outputs past each length are zero, final
    states are each sequence's own last step).

    Args:
        sequences: a list of arrays (or Tensors, or lists) of shape (length_i, ...);
            every trailing shape must agree.
        value: the padding value.
        maxlen: pad (or truncate, keeping each sequence's start) to this length;
            default the longest sequence.
        dtype: the batch's dtype (default: the sequences' common NumPy type).

    Shape:
        returns ``(batch, lengths)``: NumPy arrays of shape (n, maxlen, ...) and
        (n,) int64 (each length after truncation).

    Examples:
        >>> batch, lengths = eo.pad_sequences([[1, 2, 3], [4]], value=0)
        >>> batch.tolist(), lengths.tolist()
        ([[1, 2, 3], [4, 0, 0]], [3, 1])
    """
    if isinstance(sequences, (np.ndarray, Tensor)) or not hasattr(sequences, "__len__"):
        raise TypeError(f"pad_sequences takes a list of sequences, got {type(sequences).__name__}")
    arrays = [s.data if isinstance(s, Tensor) else np.asarray(s) for s in sequences]
    if not arrays:
        raise ValueError("pad_sequences got no sequences; it cannot infer the batch's shape")
    for i, a in enumerate(arrays):
        if a.ndim == 0:
            raise EveryOShapeError(f"pad_sequences: sequence {i} is a scalar; each sequence needs a time axis")
        if a.shape[1:] != arrays[0].shape[1:]:
            raise EveryOShapeError(
                f"pad_sequences: sequence {i} has shape {a.shape}, but sequence 0 has {arrays[0].shape}; "
                f"all must agree after the time axis"
            )
    if maxlen is not None and (isinstance(maxlen, bool) or int(maxlen) != maxlen or maxlen < 0):
        raise ValueError(f"pad_sequences maxlen must be a non-negative integer, got {maxlen!r}")
    lengths = np.array([len(a) for a in arrays], dtype=np.int64)
    steps = int(lengths.max()) if maxlen is None else int(maxlen)
    lengths = np.minimum(lengths, steps)
    dtype = np.result_type(*arrays) if dtype is None else np.dtype(dtype)
    batch = np.full((len(arrays), steps) + arrays[0].shape[1:], value, dtype=dtype)
    for i, (a, n) in enumerate(zip(arrays, lengths)):
        batch[i, :n] = a[:n]
    return batch, lengths
