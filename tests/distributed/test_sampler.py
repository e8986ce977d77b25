"""DistributedSampler: N ranks' batches put together are one process's global batches."""

from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from everyo.distributed import DistributedSampler


def samplers(n, world, **kwargs):
    return [DistributedSampler(n, SimpleNamespace(rank=r, world_size=world), **kwargs) for r in range(world)]


@settings(max_examples=150, deadline=None)
@given(
    n=st.integers(0, 300),
    world=st.integers(1, 5),
    per_rank=st.integers(1, 9),
    seed=st.integers(0, 3),
    epoch=st.integers(0, 3),
    shuffle=st.booleans(),
    drop_last=st.booleans(),
)
def test_rank_batches_together_are_the_global_batches(n, world, per_rank, seed, epoch, shuffle, drop_last):
    ranks = samplers(n, world, seed=seed, shuffle=shuffle, drop_last=drop_last)
    for s in ranks:
        s.set_epoch(epoch)
    order = ranks[0].global_order()
    assert all(np.array_equal(s.global_order(), order) for s in ranks)  # no communication needed
    lists = [list(s) for s in ranks]
    assert len({len(x) for x in lists}) == 1 and len(lists[0]) == len(ranks[0])  # same step count everywhere
    global_batch = per_rank * world
    for k, start in enumerate(range(0, len(lists[0]), per_rank)):
        together = sorted(i for x in lists for i in x[start : start + per_rank])
        assert together == sorted(order[k * global_batch : (k + 1) * global_batch].tolist())
        assert len({len(x[start : start + per_rank]) for x in lists}) == 1  # equal shares: means average exactly
    if n % world == 0:
        assert sorted(order.tolist()) == list(range(n))  # exactly one process's epoch
    elif drop_last:
        assert len(order) == n - n % world and len(set(order.tolist())) == len(order)
    else:
        assert len(order) == n + world - n % world and set(order.tolist()) == set(range(n))


def test_epochs_shuffle_differently_and_reproducibly():
    a, b = samplers(100, 2, seed=5)
    first = list(a)
    a.set_epoch(1)
    assert list(a) != first
    a.set_epoch(0)
    assert list(a) == first and set(first).isdisjoint(b)
    assert list(samplers(6, 2, shuffle=False)[1]) == [1, 3, 5]
    assert list(samplers(100, 2, seed=6)[0]) != first


def test_padding_and_dropping():
    # 10 rows, 4 ranks: drop_last keeps 8 rows (2 each); otherwise 12 positions, the first two repeated.
    ranks = samplers(10, 4, shuffle=False)
    assert [list(s) for s in ranks] == [[0, 4, 8], [1, 5, 9], [2, 6, 0], [3, 7, 1]]
    ranks = samplers(10, 4, shuffle=False, drop_last=True)
    assert [list(s) for s in ranks] == [[0, 4], [1, 5], [2, 6], [3, 7]] and len(ranks[0]) == 2


def test_bad_arguments():
    with pytest.raises(ValueError, match="n must be >= 0"):
        samplers(-1, 2)
    with pytest.raises(TypeError):
        samplers(3.5, 2)
