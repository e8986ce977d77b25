"""``DistributedSampler``: each rank's share of every global batch, so N workers train on one process's batches."""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from collections.abc import Iterator

    from everyo.distributed.protocol import ProcessGroup

__all__ = ["DistributedSampler"]


class DistributedSampler:
    """The indices of ``range(n)`` that this rank trains on, in the order it should see them.

    Every epoch all ranks draw the same permutation of ``range(n)`` (from
    ``seed`` and the epoch; no communication), and rank ``r`` of ``N`` takes
    positions ``r, r + N, r + 2N, ...`` of it. Iterate it (or pass it as a
    DataLoader's ``sampler=``) with a per-rank batch size ``b``.

    The batch-size contract: with per-rank batches of ``b`` rows, rank ``r``'s
    ``k``-th batch holds exactly the rows of positions ``kNb .. (k+1)Nb - 1``
    that are ``r`` modulo ``N``, so the ``N`` ranks' ``k``-th batches together
    are exactly the ``k``-th batch of one process that iterates the same
    permutation with batch size ``B = N * b`` -- the last, shorter batch
    included, and with equal shares, so averaging the ranks' mean gradients
    (``DistributedDataParallel``, ``average_gradients``) gives that process's
    gradient. This holds exactly when ``n % N == 0``. Otherwise every rank
    still yields the same number of indices (``len(sampler)``), so the ranks'
    collectives stay in step: ``drop_last=False`` appends the first
    ``N - n % N`` positions of the permutation again (those rows count twice
    in the last global batch), ``drop_last=True`` leaves the last ``n % N``
    positions out. :meth:`global_order` gives the sequence the ranks share
    out, for a one-process run to iterate.

    Args:
        n: the number of rows in the data set.
        group: the :class:`~everyo.distributed.ProcessGroup` (only its ``rank``
            and ``world_size`` are read; no collective is called).
        shuffle: draw a new permutation each epoch (``False``: ``0, 1, 2, ...``).
        seed: must be the same on every rank.
        drop_last: see above.

    Example (needs a running process group, so not run as a doctest)::

        sampler = DistributedSampler(len(x), group, seed=0)
        for epoch in range(epochs):
            sampler.set_epoch(epoch)            # a new permutation, the same on every rank
            rows = np.fromiter(sampler, np.int64)
            for start in range(0, len(rows), per_rank_batch):
                batch = rows[start:start + per_rank_batch]
    """

    def __init__(
        self, n: int, group: ProcessGroup, *, shuffle: bool = True, seed: int = 0, drop_last: bool = False
    ) -> None:
        self.n = operator.index(n)
        if self.n < 0:
            raise ValueError(f"DistributedSampler: n must be >= 0, got {n}")
        self.rank, self.world_size = group.rank, group.world_size
        self.shuffle, self.seed, self.drop_last = bool(shuffle), operator.index(seed), bool(drop_last)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch``'s permutation from now on (call it on every rank, with the same epoch)."""
        self.epoch = operator.index(epoch)

    def global_order(self) -> np.ndarray:
        """This epoch's indices for all ranks together: what one process iterates to see the same batches."""
        order = (
            np.random.default_rng([self.seed, self.epoch]).permutation(self.n) if self.shuffle else np.arange(self.n)
        )
        world, extra = self.world_size, self.n % self.world_size
        if extra and self.drop_last:
            order = order[: self.n - extra]
        elif extra and self.n:
            order = np.concatenate([order, np.resize(order, world - extra)])
        return order.astype(np.int64, copy=False)

    def indices(self) -> np.ndarray:
        """This rank's indices for the current epoch, in order."""
        return self.global_order()[self.rank :: self.world_size]

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices().tolist())

    def __len__(self) -> int:
        if self.drop_last:
            return self.n // self.world_size
        return -(-self.n // self.world_size)

    def __repr__(self) -> str:
        return (
            f"DistributedSampler(n={self.n}, rank={self.rank}, world_size={self.world_size}, "
            f"shuffle={self.shuffle}, seed={self.seed}, drop_last={self.drop_last}, epoch={self.epoch})"
        )
