"""The fused recurrences (LSTM, GRU, RNN) take their per-sequence arrays from the
recycled pool (everyo._buffers): a buffer still held by a live graph or handed to
the user must never be reused by a later sequence of the same shapes."""

import numpy as np
import pytest

import everyo as eo
from everyo import _buffers

# batch 16, 40 steps, hidden 64, float32: every saved array is above _buffers.MIN_BYTES
BATCH, STEPS, FEATURES, HIDDEN = 16, 40, 8, 64
LAYERS = {
    "lstm": lambda: eo.LSTM(FEATURES, HIDDEN, seed=0),
    "gru": lambda: eo.GRU(FEATURES, HIDDEN, seed=1),
    "rnn": lambda: eo.RNN(FEATURES, HIDDEN, seed=2),
    "lstm-reverse-padded": lambda: eo.LSTM(FEATURES, HIDDEN, bidirectional=True, seed=3),
}
LENGTHS = {"lstm-reverse-padded": np.array([STEPS] * (BATCH - 2) + [7, 31])}


def _input(seed):
    return eo.tensor(
        np.random.default_rng(seed).standard_normal((BATCH, STEPS, FEATURES)).astype(np.float32), requires_grad=True
    )


def _run(layer, x, lengths):
    out = layer(x, lengths=lengths)[0] if lengths is not None else layer(x)[0]
    weights = np.random.default_rng(9).standard_normal(out.shape).astype(np.float32)
    return out, (out * eo.tensor(weights)).sum()


def held_graph_survives(kind):
    """Run a sequence and keep its output and its graph; run more sequences of the same
    shapes (forward and backward, so their buffers are freed and recycled); then say
    whether the kept output and the kept graph's gradients are still what they were."""
    layer, lengths = LAYERS[kind](), LENGTHS.get(kind)
    x = _input(0)
    out, loss = _run(layer, x, lengths)
    expected_out = np.array(out.data, copy=True)
    expected = [np.array(g, copy=True) for g in eo.grad(loss, [x, *layer.parameters()], retain_graph=True)]
    for seed in range(1, 4):
        other = _input(seed)
        _, other_loss = _run(layer, other, lengths)
        eo.grad(other_loss, [other, *layer.parameters()])
        del other, other_loss
    grads = eo.grad(loss, [x, *layer.parameters()])
    return np.array_equal(out.data, expected_out) and all(np.array_equal(g, e) for g, e in zip(grads, expected))


@pytest.mark.parametrize("kind", sorted(LAYERS))
def test_a_live_graph_and_a_held_output_are_never_recycled(kind):
    assert held_graph_survives(kind)


@pytest.mark.parametrize("kind", ["lstm", "gru", "rnn"])
def test_the_check_catches_a_pool_that_ignores_references(kind, monkeypatch):
    # A pool that takes an array held once elsewhere (by the graph) for free hands the
    # saved gates and states out again: the check above must then fail.
    _buffers.clear()
    monkeypatch.setattr(_buffers, "_UNREFERENCED", _buffers._UNREFERENCED + 1)
    assert not held_graph_survives(kind)
    monkeypatch.undo()
    _buffers.clear()


SAVED = {"lstm": (STEPS, 4, BATCH, HIDDEN), "gru": (STEPS, 2, BATCH, HIDDEN), "rnn": (STEPS, BATCH, HIDDEN)}


@pytest.mark.parametrize("kind", ["lstm", "gru", "rnn"])
def test_a_training_step_reuses_its_sequence_buffers(kind):
    # Once a step's graph is gone, the next step of the same shapes allocates no new
    # pooled arrays (its saved states and gradients come back from the pool).
    layer = LAYERS[kind]()

    def step(seed):
        x = _input(seed)
        _, loss = _run(layer, x, None)
        eo.grad(loss, [x, *layer.parameters()])

    step(0)
    step(1)
    before = _buffers.stats()["arrays"]
    step(2)
    assert _buffers.stats()["arrays"] == before
    # and the scan's saved gates (or states) are among the pooled arrays
    assert (SAVED[kind], np.dtype(np.float32)) in _buffers._pool().arrays
