"""``shard_indices``: which rows of a data set a rank trains on."""

from __future__ import annotations

import operator

import numpy as np

__all__ = ["shard_indices"]


def shard_indices(n: int, rank: int, world_size: int) -> np.ndarray:
    """The row indices rank ``rank`` of ``world_size`` owns out of ``n`` rows.

    Ranks get contiguous blocks in rank order (so a shard is a cache-friendly
    slice and concatenating the shards by rank gives ``0 .. n-1``). The shards
    are disjoint, cover every row, and differ in length by at most one row (the
    first ``n % world_size`` ranks get the extra rows). Deterministic: no
    shuffling, no seed.

    What it preserves: every row is used once per epoch, by exactly one rank.
    What it does not: the batches. Rank ``r`` trains on the ``r``-th slice of
    the data set, so the rows that the ranks average in one step are not the
    global batch a single process would take at that step (it would take
    consecutive rows of the whole data set): training on shards drifts away
    from one-process training as soon as each rank makes more than one step
    per epoch (issue #15 measured a drift of 4.7e-2 instead of 3e-8 on the seed
    MLP). For training that matches one process batch for batch, use
    :class:`~everyo.distributed.DistributedSampler`. With one full-shard
    step per epoch (the spec's example), the shards together are the global
    batch and averaging is exact when ``n % world_size == 0``.

    Examples:
        >>> from everyo.distributed.sharding import shard_indices
        >>> [shard_indices(10, r, 3).tolist() for r in range(3)]
        [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    """
    n, rank, world_size = (operator.index(v) for v in (n, rank, world_size))
    if n < 0:
        raise ValueError(f"shard_indices: n must be >= 0, got {n}")
    if world_size < 1:
        raise ValueError(f"shard_indices: world_size must be >= 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"shard_indices: rank {rank} is outside 0..{world_size - 1}")
    base, extra = divmod(n, world_size)
    start = rank * base + min(rank, extra)
    stop = start + base + (1 if rank < extra else 0)
    return np.arange(start, stop, dtype=np.int64)
