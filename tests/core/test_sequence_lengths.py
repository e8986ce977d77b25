"""``lengths=`` on RNN, LSTM and GRU: each padded batch against running every
sequence alone through the plain-NumPy step-by-step reference, gradients
against central differences, and the errors."""

import numpy as np
import pytest
from test_sequence_recurrent import reference

import everyo as eo
from everyo.testing import check_gradients

KINDS = {
    "rnn": lambda **kw: eo.RNN(3, 4, **kw),
    "rnn_relu": lambda **kw: eo.RNN(3, 4, nonlinearity="relu", **kw),
    "lstm": lambda **kw: eo.LSTM(3, 4, **kw),
    "gru": lambda **kw: eo.GRU(3, 4, **kw),
}
CONFIGS = [
    dict(num_layers=1, bidirectional=False),
    dict(num_layers=1, bidirectional=True),
    dict(num_layers=2, bidirectional=True),
]


def make(kind, config, seed=0):
    return KINDS[kind](seed=seed, **config).to("float64")


def inputs(module, batch, steps, seed=1):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, steps, module.input_size))
    shape = (module.num_layers * module.num_directions, batch, module.hidden_size)
    return x, rng.standard_normal(shape), rng.standard_normal(shape)


def call(kind, module, x, h0, c0, lengths):
    """(output, h_n, c_n or None), whatever the layer's state layout."""
    if kind == "lstm":
        out, (h, c) = module(x, (h0, c0), lengths=lengths)
        return out, h, c
    out, h = module(x, h0, lengths=lengths)
    return out, h, None


@pytest.mark.parametrize("config", CONFIGS, ids=["uni", "bi", "2-layer-bi"])
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_padded_batch_equals_each_sequence_run_alone(kind, config):
    module = make(kind, config)
    lengths = np.array([6, 2, 4, 1])
    x, h0, c0 = inputs(module, 4, 6)
    x[np.arange(6)[None, :] >= lengths[:, None]] = 1e3  # loud padding: any leak would show
    out, h_n, c_n = call(kind, module, eo.tensor(x), eo.tensor(h0), eo.tensor(c0), lengths)
    ref_kind = "rnn" if kind.startswith("rnn") else kind
    act = (lambda v: np.maximum(v, 0)) if kind == "rnn_relu" else np.tanh
    for b, n in enumerate(lengths):
        ref_out, ref_h, ref_c = reference(
            ref_kind, module, x[b : b + 1, :n], h0[:, b : b + 1], c0[:, b : b + 1] if kind == "lstm" else None, act=act
        )
        np.testing.assert_allclose(out.data[b, :n], ref_out[0], rtol=1e-10, atol=1e-12)
        assert not out.data[b, n:].any(), "outputs past the length must be zero"
        np.testing.assert_allclose(h_n.data[:, b], ref_h[:, 0], rtol=1e-10, atol=1e-12)
        if kind == "lstm":
            np.testing.assert_allclose(c_n.data[:, b], ref_c[:, 0], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_gradients_with_lengths(kind):
    module = make(kind, dict(num_layers=2, bidirectional=True), seed=3)
    lengths = np.array([3, 1, 2])
    x, h0, c0 = inputs(module, 3, 3, seed=4)

    def fn(x, h0, c0):
        out, h, c = call(kind, module, x, h0, c0, lengths)
        return (out, h) if c is None else (out, h, c)

    grads = check_gradients(fn, [x, h0, c0], module.parameters(), name=f"{kind} with lengths")
    assert not grads[0][1, 1:].any() and not grads[0][2, 2:].any()  # padding gets no gradient


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_full_lengths_change_nothing_and_length_zero_keeps_the_initial_state(kind):
    module = make(kind, dict(num_layers=1, bidirectional=True))
    x, h0, c0 = inputs(module, 3, 5)
    plain = call(kind, module, x, h0, c0, None)
    full = call(kind, module, x, h0, c0, [5, 5, 5])
    for a, b in zip(plain, full):
        if a is not None:
            np.testing.assert_array_equal(a.data, b.data)
    out, h_n, c_n = call(kind, module, x, h0, c0, np.array([5, 0, 2]))
    assert not out.data[1].any()
    np.testing.assert_array_equal(h_n.data[:, 1], h0[:, 1])
    if c_n is not None:
        np.testing.assert_array_equal(c_n.data[:, 1], c0[:, 1])


def test_a_padded_bidirectional_gru_trains_from_pad_sequences():
    rng = np.random.default_rng(0)
    seqs = [rng.standard_normal((n, 3)).astype(np.float32) for n in (5, 2, 4)]
    batch, lengths = eo.pad_sequences(seqs)
    gru = eo.GRU(3, 4, bidirectional=True, seed=0)
    out, h_n = gru(batch, lengths=lengths)
    alone = gru(seqs[1][None])[1]
    np.testing.assert_allclose(h_n.data[:, 1], alone.data[:, 0], rtol=1e-6, atol=1e-7)
    (out.sum() + h_n.sum()).backward()
    assert all(np.isfinite(p.grad).all() for p in gru.parameters())


def test_bad_lengths_are_named():
    lstm = eo.LSTM(3, 4, seed=0)
    x = np.zeros((2, 5, 3), np.float32)
    with pytest.raises(eo.EveryOShapeError, match="lengths of shape \\(batch,\\) = \\(2,\\)"):
        lstm(x, lengths=[1, 2, 3])
    with pytest.raises(eo.EveryOShapeError, match="integer dtype"):
        lstm(x, lengths=np.array([1.0, 2.0]))
    with pytest.raises(ValueError, match="lengths must lie in \\[0, 5\\].*max 6"):
        lstm(x, lengths=[6, 2])
