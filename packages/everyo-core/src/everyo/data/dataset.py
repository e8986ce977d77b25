"""Datasets: anything with ``__len__`` and ``__getitem__`` (PyTorch's map-style protocol)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from everyo.tensor import Tensor

if TYPE_CHECKING:
    from collections.abc import Iterable

    from everyo._typing import Array, TensorLike

__all__ = ["Dataset", "TensorDataset"]


def aligned_arrays(arrays: Iterable[TensorLike], who: str) -> list[Array]:
    """The arrays as NumPy arrays, checked to share their first dimension."""
    out = [a.data if isinstance(a, Tensor) else np.asarray(a) for a in arrays]
    if not out:
        raise ValueError(f"{who} needs at least one array")
    n = len(out[0]) if out[0].ndim else None
    for i, a in enumerate(out):
        if a.ndim == 0 or len(a) != n:
            raise ValueError(
                f"{who} arrays must share their first dimension: array 0 has shape {out[0].shape}, "
                f"array {i} has shape {a.shape}"
            )
    return out


class Dataset:
    """Base class of a map-style dataset: subclasses define ``__len__`` and
    ``__getitem__(index) -> sample``. A DataLoader accepts any object with
    those two methods; subclassing only documents the intent.

    Examples:
        >>> class Squares(eo.Dataset):
        ...     def __len__(self):
        ...         return 10
        ...     def __getitem__(self, i):
        ...         return np.float32(i), np.float32(i * i)
        >>> x, y = next(iter(eo.DataLoader(Squares(), batch_size=4)))
        >>> y.data.tolist()
        [0.0, 1.0, 4.0, 9.0]
    """

    def __len__(self) -> int:
        raise NotImplementedError(f"{type(self).__name__} must implement __len__")

    def __getitem__(self, index: int) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must implement __getitem__")


class TensorDataset(Dataset):
    """Aligned arrays (or Tensors) with the same first dimension; sample ``i`` is
    the tuple of every array's row ``i``.

    Batches are gathered by one fancy index per array (:meth:`gather`), not
    row by row, so a loader over in-memory data costs what the 0.1 one did.

    Shape:
        every array (n, ...); a sample is a tuple of (...) rows.

    Examples:
        >>> ds = eo.TensorDataset(np.zeros((5, 3)), np.arange(5))
        >>> len(ds), int(ds[2][1])
        (5, 2)
    """

    def __init__(self, *arrays: TensorLike) -> None:
        self.arrays = aligned_arrays(arrays, "TensorDataset")

    def __len__(self) -> int:
        return len(self.arrays[0])

    def __getitem__(self, index: int) -> tuple[Any, ...]:
        return tuple(a[index] for a in self.arrays)

    def gather(self, indices: Array | slice) -> tuple[Array, ...]:
        """One batch: every array indexed by ``indices`` (an int array or a slice)."""
        return tuple(a[indices] for a in self.arrays)
