"""Data-parallel training matches one-process training (the spec's worker example)."""

from types import SimpleNamespace

import numpy as np
import pytest
import shm_workers

import everyo as eo
from everyo.distributed import average_gradients, spawn

STEPS = 15


def one_process(inputs, targets, steps=STEPS):
    return shm_workers.one_process(inputs, targets, steps)


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    inputs = rng.standard_normal((384, 16)).astype(np.float32)  # 384 = 2 * 192 = 3 * 128
    targets = np.sin(inputs[:, :1] * 2).astype(np.float32)
    return inputs, targets


@pytest.mark.usefixtures("no_leftovers")
@pytest.mark.parametrize("world_size", [2, 3])
def test_spec_worker_matches_one_process(data, world_size, recwarn):
    reference = one_process(*data)
    results = spawn(shm_workers.spec_worker, world_size, args=(*data, STEPS), timeout=120)
    assert len(results) == world_size
    # Every rank ends bit-identical.
    for other in results[1:]:
        for a, b in zip(results[0], other):
            assert a.tobytes() == b.tobytes()
    # Same arithmetic as one big batch, up to float32 rounding of a different summation order.
    moved = max(
        float(np.abs(ref - start.data).max())
        for ref, start in zip(reference, shm_workers.build_spec_model().parameters())
    )
    drift = max(float(np.abs(a - ref).max()) for a, ref in zip(results[0], reference))
    assert moved > 1e-2  # training really changed the weights
    assert drift < 1e-5
    assert all(a.dtype == np.float32 for a in results[0])


class RecordingGroup:
    """A one-rank stand-in that records what average_gradients sends."""

    rank, world_size = 0, 1

    def __init__(self):
        self.calls = []

    def all_reduce_mean(self, array):
        self.calls.append(array.copy())
        return array.astype(np.float64).astype(array.dtype)


def test_average_gradients_is_one_collective_and_identity_on_one_rank():
    model = shm_workers.build_spec_model()
    x = eo.tensor(np.ones((4, 16), np.float32))
    eo.mean(model(x) * model(x)).backward()
    before = [p.grad.copy() for p in model.parameters()]
    group = RecordingGroup()
    average_gradients(model.parameters(), group)
    assert len(group.calls) == 1
    sent = group.calls[0]
    n_params = len(before)
    assert sent.size == sum(g.size for g in before) + n_params
    assert sent.dtype == np.float32
    np.testing.assert_array_equal(sent[-n_params:], np.ones(n_params))  # presence flags
    for p, g in zip(model.parameters(), before):
        assert p.grad.dtype == g.dtype and p.grad.shape == g.shape
        np.testing.assert_array_equal(p.grad, g)


def test_average_gradients_mixed_dtypes_round_once_per_parameter():
    params = [
        SimpleNamespace(data=np.zeros(3, np.float16), grad=np.array([1, 2, 3], np.float16)),
        SimpleNamespace(data=np.zeros(2, np.float64), grad=np.array([0.1, 1e-300])),
    ]
    group = RecordingGroup()
    average_gradients(params, group)
    assert group.calls[0].dtype == np.float64
    assert params[0].grad.dtype == np.float16 and params[0].grad.tolist() == [1, 2, 3]
    assert params[1].grad.tolist() == [0.1, 1e-300]


def test_average_gradients_of_nothing_sends_nothing():
    group = RecordingGroup()
    average_gradients([], group)
    assert group.calls == []
