"""RNN, LSTM and GRU: forward against a plain-NumPy step-by-step reference
written here from the documented equations, gradients against central
differences, a 1,000-step sequence against an unfused autograd reference,
and the errors."""

import numpy as np
import pytest

import everyo as eo
from everyo.testing import check_gradients, check_module_gradients


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


# --- the reference: one direction of one layer, step by step, from the docstrings ---
def rnn_cell(x, h, p, act):
    return act(x @ p["w_ih"] + p["b_ih"] + h @ p["w_hh"] + p["b_hh"]), None


def lstm_cell(x, state, p):
    h, c = state
    z = x @ p["w_ih"] + p["b_ih"] + h @ p["w_hh"] + p["b_hh"]
    i, f, g, o = np.split(z, 4, axis=-1)
    c = sigmoid(f) * c + sigmoid(i) * np.tanh(g)
    return sigmoid(o) * np.tanh(c), c


def gru_cell(x, h, p):
    xr, xz, xn = np.split(x @ p["w_ih"] + p["b_ih"], 3, axis=-1)
    hr, hz, hn = np.split(h @ p["w_hh"] + p["b_hh"], 3, axis=-1)
    r, z = sigmoid(xr + hr), sigmoid(xz + hz)
    n = np.tanh(xn + r * hn)
    return (1 - z) * n + z * h, None


def reference(kind, module, x, h0, c0=None, act=np.tanh):
    """Run ``module``'s weights through the reference cells: (output, h_n, c_n)."""
    sd = module.state_dict()
    dirs = module.num_directions
    layer_in, h_n, c_n = x, [], []
    for layer in range(module.num_layers):
        outs = []
        for d in range(dirs):
            sfx = f"_l{layer}" + ("_reverse" if d else "")
            p = {k: sd[k + sfx] for k in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")}
            p = {"w_ih": p["weight_ih"], "w_hh": p["weight_hh"], "b_ih": p["bias_ih"], "b_hh": p["bias_hh"]}
            idx = layer * dirs + d
            h, c = h0[idx], None if c0 is None else c0[idx]
            out = np.zeros(layer_in.shape[:2] + (module.hidden_size,))
            steps = range(x.shape[1] - 1, -1, -1) if d else range(x.shape[1])
            for t in steps:
                if kind == "lstm":
                    h, c = lstm_cell(layer_in[:, t], (h, c), p)
                elif kind == "gru":
                    h, _ = gru_cell(layer_in[:, t], h, p)
                else:
                    h, _ = rnn_cell(layer_in[:, t], h, p, act)
                out[:, t] = h
            outs.append(out)
            h_n.append(h)
            c_n.append(c)
        layer_in = np.concatenate(outs, axis=-1)
    return layer_in, np.stack(h_n), (None if c0 is None else np.stack(c_n))


CONFIGS = [dict(num_layers=1, bidirectional=False), dict(num_layers=2, bidirectional=True)]


def _inputs(module, batch=3, steps=5, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, steps, module.input_size))
    h0 = rng.standard_normal((module.num_layers * module.num_directions, batch, module.hidden_size))
    c0 = rng.standard_normal(h0.shape)
    return x, h0, c0


@pytest.mark.parametrize("cfg", CONFIGS)
def test_lstm_forward_matches_numpy_reference(cfg):
    lstm = eo.LSTM(4, 6, seed=0, **cfg).to("float64")
    x, h0, c0 = _inputs(lstm)
    out, (h_n, c_n) = lstm(eo.tensor(x), (eo.tensor(h0), eo.tensor(c0)))
    ref_out, ref_h, ref_c = reference("lstm", lstm, x, h0, c0)
    np.testing.assert_allclose(out.data, ref_out, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(h_n.data, ref_h, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(c_n.data, ref_c, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("cfg", CONFIGS)
def test_gru_forward_matches_numpy_reference(cfg):
    gru = eo.GRU(4, 6, seed=1, **cfg).to("float64")
    x, h0, _ = _inputs(gru)
    out, h_n = gru(eo.tensor(x), eo.tensor(h0))
    ref_out, ref_h, _ = reference("gru", gru, x, h0)
    np.testing.assert_allclose(out.data, ref_out, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(h_n.data, ref_h, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("nonlinearity, act", [("tanh", np.tanh), ("relu", lambda v: np.maximum(v, 0))])
def test_rnn_forward_matches_numpy_reference(nonlinearity, act):
    rnn = eo.RNN(4, 6, num_layers=2, bidirectional=True, nonlinearity=nonlinearity, seed=2).to("float64")
    x, h0, _ = _inputs(rnn)
    out, h_n = rnn(eo.tensor(x), eo.tensor(h0))
    ref_out, ref_h, _ = reference("rnn", rnn, x, h0, act=act)
    np.testing.assert_allclose(out.data, ref_out, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(h_n.data, ref_h, rtol=1e-10, atol=1e-12)


def test_zero_initial_state_is_the_default():
    lstm = eo.LSTM(4, 6, seed=0).to("float64")
    x, h0, c0 = _inputs(lstm)
    out, _ = lstm(eo.tensor(x))
    ref_out, _, _ = reference("lstm", lstm, x, np.zeros_like(h0), np.zeros_like(c0))
    np.testing.assert_allclose(out.data, ref_out, rtol=1e-10, atol=1e-12)


def test_float32_forward_is_float32_and_close_to_float64():
    lstm = eo.LSTM(4, 6, seed=0)
    x, _, _ = _inputs(lstm)
    out, (h_n, c_n) = lstm(x.astype("float32"))
    assert out.dtype == h_n.dtype == c_n.dtype == "float32"
    ref, _, _ = reference("lstm", lstm.to("float64"), x, np.zeros((1, 3, 6)), np.zeros((1, 3, 6)))
    np.testing.assert_allclose(out.data, ref, atol=1e-5)


# --- gradients --------------------------------------------------------------------
@pytest.mark.parametrize("cfg", CONFIGS)
def test_lstm_gradients(cfg):
    lstm = eo.LSTM(3, 2, seed=3, **cfg)
    x, h0, c0 = _inputs(lstm, batch=2, steps=3)
    check_module_gradients(lstm, x, (h0, c0), loss=lambda r: (r[0], r[1][0], r[1][1]))


@pytest.mark.parametrize("cfg", CONFIGS)
def test_gru_gradients(cfg):
    gru = eo.GRU(3, 2, seed=4, **cfg)
    x, h0, _ = _inputs(gru, batch=2, steps=3)
    check_module_gradients(gru, x, h0, loss=lambda r: r)


@pytest.mark.parametrize("nonlinearity", ["tanh", "relu"])
def test_rnn_gradients(nonlinearity):
    rnn = eo.RNN(3, 2, num_layers=2, bidirectional=True, nonlinearity=nonlinearity, seed=5)
    x, h0, _ = _inputs(rnn, batch=2, steps=3)
    check_module_gradients(rnn, x, h0, loss=lambda r: r)


@pytest.mark.parametrize("layer", [eo.GRU, eo.RNN])
def test_gru_and_rnn_gradients_without_bias(layer):
    m = layer(3, 2, bias=False, seed=12)
    assert not any("bias" in name for name, _ in m.named_parameters())
    x, h0, _ = _inputs(m, batch=2, steps=3)
    check_module_gradients(m, x, h0, loss=lambda r: r)


def test_lstm_gradients_without_bias_and_with_initial_state_as_input():
    lstm = eo.LSTM(3, 2, bias=False, seed=6)
    x, h0, c0 = _inputs(lstm, batch=2, steps=3)
    lstm.to("float64")
    check_gradients(lambda x, h, c: lstm(x, (h, c))[1], [x, h0, c0], lstm.parameters(), name="LSTM(h0, c0)")


# --- long sequences: backpropagation through time is iterative ------------------------
def unfused_lstm(x_steps, h, c, w_ih, w_hh, b):
    """The LSTM built from core's small ops, one autograd node per op and step:
    about 20 nodes per step, so 1,000 steps make a graph 20,000 nodes deep."""
    hidden = h.shape[-1]
    for x in x_steps:
        z = eo.linear(x, w_ih, b) + h @ w_hh
        i, f = eo.sigmoid(z[:, :hidden]), eo.sigmoid(z[:, hidden : 2 * hidden])
        g, o = eo.tanh(z[:, 2 * hidden : 3 * hidden]), eo.sigmoid(z[:, 3 * hidden :])
        c = f * c + i * g
        h = o * eo.tanh(c)
    return h


def test_thousand_step_lstm_backward_matches_unfused_autograd():
    steps = 1000
    lstm = eo.LSTM(2, 3, seed=7).to("float64")
    x = np.random.default_rng(0).standard_normal((2, steps, 2))
    xt = eo.tensor(x, requires_grad=True)
    _, (h_n, _) = lstm(xt)
    h_n.sum().backward()
    fused = [xt.grad] + [p.grad for p in lstm.parameters()]

    w_ih = eo.tensor(lstm.weight_ih_l0.data, requires_grad=True)
    w_hh = eo.tensor(lstm.weight_hh_l0.data, requires_grad=True)
    b_ih = eo.tensor(lstm.bias_ih_l0.data, requires_grad=True)
    b_hh = eo.tensor(lstm.bias_hh_l0.data, requires_grad=True)
    x_steps = [eo.tensor(x[:, t], requires_grad=True) for t in range(steps)]
    zeros = eo.zeros(2, 3, dtype="float64")
    unfused_lstm(x_steps, zeros, zeros, w_ih, w_hh, b_ih + b_hh).sum().backward()
    unfused = [np.stack([s.grad for s in x_steps], axis=1), w_ih.grad, w_hh.grad, b_ih.grad, b_hh.grad]
    for a, b in zip(fused, unfused):
        np.testing.assert_allclose(a, b, rtol=1e-8, atol=1e-12)
    assert np.abs(fused[0][:, 0]).max() > 0  # the gradient reached the first step


@pytest.mark.parametrize("layer", [eo.RNN, eo.GRU])
def test_thousand_step_rnn_and_gru_backward_reach_the_first_step(layer):
    m = layer(2, 4, seed=8).to("float64")
    x = eo.tensor(np.random.default_rng(1).standard_normal((2, 1000, 2)), requires_grad=True)
    out, h_n = m(x)
    (out.sum() + h_n.sum()).backward()
    assert np.all(np.isfinite(x.grad)) and np.abs(x.grad[:, 0]).max() > 0


# --- behaviour and errors -------------------------------------------------------------
def test_seed_makes_initialisation_reproducible_and_names_follow_pytorch():
    a, b = (
        eo.GRU(3, 4, num_layers=2, bidirectional=True, seed=9),
        eo.GRU(3, 4, num_layers=2, bidirectional=True, seed=9),
    )
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    assert "weight_ih_l1_reverse" in sa and sa["weight_ih_l1_reverse"].shape == (8, 12)
    assert all(np.array_equal(sa[k], sb[k]) for k in sa)
    assert not np.array_equal(sa["weight_hh_l0"], eo.GRU(3, 4, seed=10).state_dict()["weight_hh_l0"])


def test_dropout_between_layers_only_in_training():
    lstm = eo.LSTM(3, 4, num_layers=2, dropout=0.5, seed=11)
    x = np.random.default_rng(0).standard_normal((2, 5, 3)).astype("float32")
    a, b = lstm(x)[0].data, lstm(x)[0].data
    assert not np.array_equal(a, b)
    lstm.eval()
    np.testing.assert_array_equal(lstm(x)[0].data, lstm(x)[0].data)


def test_input_errors_name_the_layer_and_shapes():
    lstm = eo.LSTM(3, 4, seed=0)
    with pytest.raises(eo.EveryOShapeError, match=r"LSTM\(3, 4\) expected a rank-3"):
        lstm(np.zeros((5, 3), dtype="float32"))
    with pytest.raises(eo.EveryOShapeError, match="last dimension 3"):
        lstm(np.zeros((2, 5, 4), dtype="float32"))
    with pytest.raises(eo.EveryOShapeError, match=r"h0 of shape .* \(1, 2, 4\), got \(2, 4\)|rank-3 h0"):
        lstm(np.zeros((2, 5, 3), dtype="float32"), (np.zeros((2, 4), dtype="float32"), None))
    with pytest.raises(eo.EveryOShapeError, match=r"\(1, 2, 4\), got \(1, 3, 4\)"):
        eo.GRU(3, 4)(np.zeros((2, 5, 3), dtype="float32"), np.zeros((1, 3, 4), dtype="float32"))
    with pytest.raises(eo.EveryOShapeError, match="empty sequence"):
        lstm(np.zeros((2, 0, 3), dtype="float32"))
    with pytest.raises(ValueError, match="nonlinearity"):
        eo.RNN(3, 4, nonlinearity="sigmoid")
