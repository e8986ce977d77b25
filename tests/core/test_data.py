import numpy as np
import pytest

import everyo as eo


def test_batches_cover_the_data_in_order():
    x, y = np.arange(10.0).reshape(10, 1), np.arange(10)
    batches = list(eo.DataLoader(x, y, batch_size=4))
    assert len(batches) == 3 and [b[0].shape[0] for b in batches] == [4, 4, 2]
    assert np.array_equal(np.concatenate([b[1].data for b in batches]), y)


def test_drop_last_and_len():
    loader = eo.DataLoader(np.zeros((10, 2)), batch_size=4, drop_last=True)
    assert len(loader) == 2 and [b.shape[0] for b in loader] == [4, 4]


def test_seeded_shuffle_is_reproducible_and_differs_per_epoch():
    x = np.arange(20)
    a = eo.DataLoader(x, batch_size=20, shuffle=True, seed=3)
    b = eo.DataLoader(x, batch_size=20, shuffle=True, seed=3)
    e1a, e2a = next(iter(a)).data, next(iter(a)).data
    e1b, e2b = next(iter(b)).data, next(iter(b)).data
    assert np.array_equal(e1a, e1b) and np.array_equal(e2a, e2b)
    assert not np.array_equal(e1a, e2a) and sorted(e1a) == list(range(20))


def test_rows_stay_aligned_when_shuffled():
    x = np.arange(30).reshape(15, 2)
    for bx, by in eo.DataLoader(x, x[:, 0] * 10, batch_size=4, shuffle=True, seed=0):
        assert np.array_equal(bx.data[:, 0] * 10, by.data)


def test_mismatched_lengths_are_refused():
    with pytest.raises(ValueError, match="array 1 has shape"):
        eo.DataLoader(np.zeros((4, 2)), np.zeros(3))
