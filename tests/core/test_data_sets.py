"""Datasets, samplers, collate functions and pad_sequences."""

import numpy as np
import pytest

import everyo as eo
from everyo.data import default_collate


class Squares(eo.Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"x": np.full(2, i, np.float32), "y": i * i}


def test_loader_over_a_dataset_collates_dicts_and_respects_drop_last():
    loader = eo.DataLoader(Squares(7), batch_size=3, drop_last=True)
    batches = list(loader)
    assert len(loader) == len(batches) == 2
    assert batches[1]["x"].shape == (3, 2) and batches[1]["y"].data.tolist() == [9, 16, 25]
    assert len(list(eo.DataLoader(Squares(7), batch_size=3))) == 3


def test_tensor_dataset_samples_and_batches():
    x, y = np.arange(12.0).reshape(6, 2), np.arange(6)
    ds = eo.TensorDataset(x, eo.tensor(y))
    assert len(ds) == 6 and np.array_equal(ds[4][0], x[4]) and ds[4][1] == 4
    bx, by = next(iter(eo.DataLoader(ds, batch_size=4)))
    np.testing.assert_array_equal(bx.data, x[:4])
    np.testing.assert_array_equal(by.data, y[:4])
    (single,) = next(iter(eo.DataLoader(eo.TensorDataset(x), batch_size=2)))  # a tuple, as PyTorch
    assert single.shape == (2, 2)
    with pytest.raises(ValueError, match="array 1 has shape \\(5,\\)"):
        eo.TensorDataset(x, np.arange(5))


def test_sampler_gives_the_order_and_the_length():
    sampler = [5, 0, 3, 3, 1]
    loader = eo.DataLoader(np.arange(10) * 10, batch_size=2, sampler=sampler)
    assert len(loader) == 3
    assert np.concatenate([b.data for b in loader]).tolist() == [50, 0, 30, 30, 10]

    class Shard:  # what a distributed sampler looks like: an iterable of indices with set_epoch
        def __init__(self):
            self.epoch = 0

        def set_epoch(self, e):
            self.epoch = e

        def __iter__(self):
            return iter(np.random.default_rng(self.epoch).permutation(6)[:3])

        def __len__(self):
            return 3

    shard, ds = Shard(), eo.TensorDataset(np.arange(6))
    loader = eo.DataLoader(ds, batch_size=3, sampler=shard)
    (first,) = next(iter(loader))
    shard.set_epoch(1)
    (second,) = next(iter(loader))
    assert first.data.tolist() == np.random.default_rng(0).permutation(6)[:3].tolist()
    assert second.data.tolist() == np.random.default_rng(1).permutation(6)[:3].tolist()
    with pytest.raises(ValueError, match="exclude each other"):
        eo.DataLoader(ds, sampler=shard, shuffle=True)


def test_collate_fn_gets_the_list_of_samples():
    seqs = [np.arange(n, dtype=np.float32) + 1 for n in (3, 1, 2)]

    class Ragged(eo.Dataset):
        def __len__(self):
            return 3

        def __getitem__(self, i):
            return seqs[i], i

    def collate(samples):
        batch, lengths = eo.pad_sequences([s for s, _ in samples])
        return eo.tensor(batch), lengths, np.array([label for _, label in samples])

    batch, lengths, labels = next(iter(eo.DataLoader(Ragged(), batch_size=3, collate_fn=collate)))
    assert batch.data.tolist() == [[1, 2, 3], [1, 0, 0], [1, 2, 0]]
    assert lengths.tolist() == [3, 1, 2] and labels.tolist() == [0, 1, 2]
    with pytest.raises(ValueError, match="different shapes.*pad_sequences"):
        next(iter(eo.DataLoader(Ragged(), batch_size=3)))


def test_default_collate():
    batch = default_collate([(np.zeros(3), 1, "a"), (np.ones(3), 0, "b")])
    assert batch[0].shape == (2, 3) and batch[1].data.tolist() == [1, 0] and batch[2] == ["a", "b"]
    with pytest.raises(TypeError, match="pass collate_fn"):
        default_collate([object()])
    with pytest.raises(TypeError, match="same structure"):
        default_collate([(1, 2), (1,)])


def test_the_0_1_form_still_yields_one_tensor_for_one_array():
    loader = eo.DataLoader(np.arange(5.0), batch_size=2)
    assert [b.data.tolist() for b in loader] == [[0, 1], [2, 3], [4]]
    with pytest.raises(ValueError, match="batch_size must be an integer >= 1"):
        eo.DataLoader(np.arange(5.0), batch_size=0)


# --- pad_sequences ---------------------------------------------------------------
def test_pad_sequences_pads_at_the_end_and_returns_lengths():
    seqs = [np.ones((3, 2)), np.full((1, 2), 2.0), np.full((4, 2), 3.0)]
    batch, lengths = eo.pad_sequences(seqs, value=-1)
    assert batch.shape == (3, 4, 2) and lengths.tolist() == [3, 1, 4] and lengths.dtype == np.int64
    for s, row, n in zip(seqs, batch, lengths):
        np.testing.assert_array_equal(row[:n], s)
        assert (row[n:] == -1).all()
    batch, lengths = eo.pad_sequences([[1, 2, 3], [4]], maxlen=2, dtype="float32")
    assert batch.tolist() == [[1, 2], [4, 0]] and batch.dtype == np.float32 and lengths.tolist() == [2, 1]
    ids, _ = eo.pad_sequences([np.array([1, 2]), np.array([3])])
    assert ids.dtype == np.int64  # ids stay integers for Embedding


def test_pad_sequences_errors():
    with pytest.raises(eo.EveryOShapeError, match="sequence 1 has shape \\(2, 3\\)"):
        eo.pad_sequences([np.zeros((2, 2)), np.zeros((2, 3))])
    with pytest.raises(ValueError, match="no sequences"):
        eo.pad_sequences([])
    with pytest.raises(TypeError, match="list of sequences"):
        eo.pad_sequences(np.zeros((2, 3)))
