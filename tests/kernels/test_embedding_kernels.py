"""everyo-kernels' embedding_backward (the embedding's scatter-add) against core's
``np.add.at``: bit-identical on random shapes with repeated indices and special
values, float32 and float64; the gradient through it passes the FD checker."""

import numpy as np
import pytest
from conftest import count_calls

from everyo import kernel_table
from everyo.sequence_ops import embedding
from everyo.tensor import Tensor
from everyo.testing import check_gradients

SPECIALS = [0.0, -0.0, np.nan, np.inf, -np.inf, 1e-45, -1e-45, 3e38, -3e38]


def _grad(w0, idx, g, padding_idx=None):
    w = Tensor(w0.copy(), requires_grad=True)
    with np.errstate(all="ignore"):
        embedding(idx, w, padding_idx).backward(Tensor(g))
    return w.grad


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    ("num", "idx_shape", "dim", "padding_idx"),
    [(65, (32, 64), 128, None), (10, (3000,), 7, 2), (1000, (16, 40), 33, None), (3, (2, 50, 60), 4, 0)],
)
def test_embedding_backward_matches_add_at_bit_for_bit(monkeypatch, dtype, num, idx_shape, dim, padding_idx):
    rng = np.random.default_rng(num)
    w0 = rng.standard_normal((num, dim)).astype(dtype)
    idx = rng.integers(0, num, idx_shape).astype(np.int64 if num != 10 else np.int32)
    g = rng.standard_normal(idx_shape + (dim,)).astype(dtype)
    g.reshape(-1)[rng.integers(0, g.size, len(SPECIALS))] = SPECIALS
    with kernel_table.disabled():
        want = _grad(w0, idx, g, padding_idx)
    calls = count_calls(monkeypatch, ("embedding_backward",))
    got = _grad(w0, idx, g, padding_idx)
    assert calls["embedding_backward"] == 1
    nan_a, nan_b = np.isnan(got), np.isnan(want)
    assert got.dtype == want.dtype and np.array_equal(nan_a, nan_b)
    assert np.array_equal(got[~nan_a], want[~nan_b])


def test_embedding_backward_non_contiguous_gradient(monkeypatch):
    rng = np.random.default_rng(1)
    w0 = rng.standard_normal((20, 64)).astype(np.float32)
    idx = rng.integers(0, 20, (300,))
    g = np.asfortranarray(rng.standard_normal((300, 64)).astype(np.float32))
    with kernel_table.disabled():
        want = _grad(w0, idx, g)
    calls = count_calls(monkeypatch, ("embedding_backward",))
    assert np.array_equal(_grad(w0, idx, g), want)
    assert calls["embedding_backward"] == 1


def test_embedding_gradient_through_kernel_passes_fd_check(monkeypatch):
    rng = np.random.default_rng(2)
    idx = rng.integers(0, 6, (2100,))  # 2100 x 8 gradient values: the kernel's path
    calls = count_calls(monkeypatch, ("embedding_backward",))
    w = Tensor(rng.standard_normal((6, 8)), requires_grad=True)
    check_gradients(lambda: embedding(idx, w), [], [w], name="embedding")
    assert calls["embedding_backward"] >= 1
