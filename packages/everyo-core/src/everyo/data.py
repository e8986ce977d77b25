"""Mini-batches over in-memory NumPy arrays."""
import math

import numpy as np

from everyo.tensor import Tensor


class DataLoader:
    """Iterate over aligned arrays in mini-batches, yielding Tensors.

    Args:
        *arrays: arrays with the same first dimension (inputs, targets, ...).
        batch_size: rows per batch.
        shuffle: reshuffle at the start of every epoch.
        seed: makes the shuffling reproducible (each epoch still differs).
        drop_last: drop a final batch smaller than ``batch_size``.

    Example:
        >>> loader = eo.DataLoader(x, y, batch_size=64, shuffle=True, seed=0)
        >>> for batch, targets in loader:
        ...     ...
    """

    def __init__(self, *arrays, batch_size=32, shuffle=False, seed=None, drop_last=False):
        if not arrays:
            raise ValueError("DataLoader needs at least one array")
        self.arrays = [a.data if isinstance(a, Tensor) else np.asarray(a) for a in arrays]
        n = len(self.arrays[0])
        for i, a in enumerate(self.arrays):
            if a.ndim == 0 or len(a) != n:
                raise ValueError(
                    f"DataLoader arrays must share their first dimension: array 0 has {n} rows, "
                    f"array {i} has shape {a.shape}"
                )
        if int(batch_size) < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.batch_size, self.shuffle, self.drop_last = int(batch_size), shuffle, drop_last
        self._rng = np.random.default_rng(seed)

    def __len__(self):
        n = len(self.arrays[0])
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def __iter__(self):
        n = len(self.arrays[0])
        order = self._rng.permutation(n) if self.shuffle else None
        for b in range(len(self)):
            lo, hi = b * self.batch_size, min((b + 1) * self.batch_size, n)
            rows = order[lo:hi] if order is not None else slice(lo, hi)
            batch = tuple(Tensor(a[rows]) for a in self.arrays)
            yield batch if len(batch) > 1 else batch[0]
