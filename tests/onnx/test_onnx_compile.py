"""eo.onnx.compile: ONNX Runtime behind the model's call signature, checked
against EveryO's own eval-mode forward pass; the fallback, the weight check
and the guards."""

import numpy as np
import pytest
from onnx_agreement import digit_cnn, randomize_norms
from test_onnx_nesting import LM_AXES, RNNModel, _assert_same, _expected, lm_inputs

import everyo as eo
from everyo.errors import EveryOShapeError
from everyo.onnx import EveryOWeightsChangedError


def images(batch, seed=0):
    return np.random.default_rng(seed + batch).standard_normal((batch, 8, 8, 1)).astype(np.float32)


def _eval_forward(model, x):
    with eo.no_grad():
        return np.asarray(model(eo.tensor(x)).data)


def test_compiled_cnn_agrees_with_eager_in_eval_mode_at_several_batches():
    model = randomize_norms(digit_cnn(), (1, 8, 8, 1))
    fast = eo.onnx.compile(model, images(1))
    assert fast.session is not None and fast.fallback_reason is None
    model.train()  # the compiled model runs as in eval mode, and leaves the mode alone
    for batch in (1, 7, 256):
        x = images(batch, seed=3)
        y = fast(x)
        assert isinstance(y, eo.Tensor) and y.shape == (batch, 10)
        assert model.training
        model.eval()
        np.testing.assert_allclose(y.data, _eval_forward(model, x), rtol=0, atol=1e-5)
        model.train()
    np.testing.assert_allclose(fast(eo.tensor(images(2))).data, fast(images(2)).data)  # Tensors or arrays


def test_batch_one_runs_in_a_one_thread_session_unless_threads_is_given():
    model = digit_cnn().eval()
    fast = eo.onnx.compile(model, images(2))
    fast(images(4))
    assert fast._single is None  # built on the first batch-1 call only
    y = fast(images(1, seed=4))
    single = fast._single
    assert single is not None and single is not fast.session
    assert single.get_session_options().intra_op_num_threads == 1
    np.testing.assert_allclose(y.data, _eval_forward(model, images(1, seed=4)), rtol=0, atol=1e-5)
    fast(images(1))
    assert fast._single is single  # reused
    as_float64 = images(1, seed=4).astype(np.float64)  # cast to the graph's float32 (not the one-array shortcut)
    np.testing.assert_allclose(fast(as_float64).data, y.data, rtol=0, atol=0)
    np.testing.assert_allclose(fast(eo.tensor(images(1, seed=4))).data, y.data, rtol=0, atol=0)
    fast.recompile()
    assert fast._single is None
    pinned = eo.onnx.compile(model, images(2), threads=2)
    pinned(images(1))
    assert pinned._single is None


def test_compiled_lstm_language_model_takes_and_returns_the_nesting():
    model = RNNModel().eval()
    fast = eo.onnx.compile(model, lm_inputs(2, 5), input_names=["ids", "h0", "c0"], dynamic_axes=LM_AXES)
    assert fast.session is not None
    for batch, seq in [(2, 5), (1, 1), (4, 11)]:
        ids, hidden = lm_inputs(batch, seq, seed=5)
        returned = fast(ids, hidden)
        log_probs, (h, c) = returned
        assert all(isinstance(t, eo.Tensor) for t in (log_probs, h, c))
        _assert_same(returned, _expected(model, ids, hidden))


def test_weights_changed_after_compiling_raise_until_recompile():
    model = eo.Sequential(eo.Linear(3, 4, seed=0), eo.ReLU(), eo.Linear(4, 2, seed=1))
    x = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    fast = eo.onnx.compile(model, x)
    fast(x)
    opt = eo.SGD(model.parameters(), lr=0.1)
    loss = (model(eo.tensor(x)) ** 2).sum()
    loss.backward()
    opt.step()
    with pytest.raises(EveryOWeightsChangedError, match=r"changed in place.*recompile\(\)"):
        fast(x)
    fast.recompile()
    np.testing.assert_allclose(fast(x).data, _eval_forward(model, x), rtol=0, atol=1e-5)
    model[2].weight = eo.Parameter(np.zeros((4, 2), np.float32))  # replaced, not changed in place
    with pytest.raises(EveryOWeightsChangedError, match="replaced"):
        fast(x)
    fast.recompile()
    np.testing.assert_allclose(fast(x).data, _eval_forward(model, x), rtol=0, atol=1e-5)


def _replacements(model):
    """Every route that swaps a weight of ``model`` (Linear, ReLU, Linear, BatchNorm1D) for another."""
    zeros = np.zeros((4, 2), np.float32)
    return {
        "attribute": lambda: setattr(model[2], "weight", eo.Parameter(zeros)),
        "register_parameter": lambda: model[2].register_parameter("weight", eo.Parameter(zeros)),
        "parameter set to None": lambda: setattr(model[2], "bias", None),
        "buffer attribute": lambda: setattr(model[3], "running_mean", eo.tensor(np.ones(2, np.float32))),
        "register_buffer": lambda: model[3].register_buffer("running_var", np.full(2, 4.0, np.float32)),
        "submodule": lambda: model.register_module("2", eo.Linear(4, 2, seed=7)),
        "load_state_dict": lambda: model.load_state_dict({k: np.asarray(v) + 1 for k, v in model.state_dict().items()}),
        "in place": lambda: _shift(model[0].weight),
    }


def _shift(weight):
    weight.data -= 1.0


@pytest.mark.parametrize("route", list(_replacements(None)))
def test_every_way_of_replacing_a_weight_is_caught_between_calls(route):
    model = eo.Sequential(eo.Linear(3, 4, seed=0), eo.ReLU(), eo.Linear(4, 2, seed=1), eo.BatchNorm1D(2)).eval()
    x = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    fast = eo.onnx.compile(model, x)
    fast(x)
    fast(x)  # a second call takes the fast path (no counter moved)
    eo.Linear(2, 2)  # a new module elsewhere moves core's registry clock: still no change to this model's weights
    fast(x)
    _replacements(model)[route]()
    with pytest.raises(EveryOWeightsChangedError, match="recompile"):
        fast(x)
    fast.recompile()
    np.testing.assert_allclose(fast(x).data, _eval_forward(model, x), rtol=0, atol=1e-5)


class DataDependent(eo.Module):
    def forward(self, x):
        return x * 2 if float(x.sum()) > 0 else x - 1  # data-dependent control flow: no graph can follow


def test_a_model_that_cannot_be_exported_runs_in_everyo_with_a_warning_saying_why():
    with pytest.warns(RuntimeWarning, match=r"runs in EveryO.*could not be exported.*Python float"):
        fast = eo.onnx.compile(DataDependent(), np.ones((1, 3), np.float32))
    assert fast.session is None and "Python float" in fast.fallback_reason
    x = np.array([[1.0, -5.0, 1.0]], np.float32)
    np.testing.assert_array_equal(fast(x).data, x - 1)


class Small(eo.Module):
    def forward(self, x):
        return eo.tanh(x) * 3


def test_a_graph_that_fails_verification_on_the_first_call_falls_back(monkeypatch):
    from everyo.onnx import rules

    def wrong_tanh(t, node):  # a deliberately broken rule: Sigmoid instead of Tanh
        t.set(node.outputs[0], t.g.node("Sigmoid", [t.name(node.inputs[0])]))

    monkeypatch.setitem(rules.RULES, "tanh", wrong_tanh)
    fast = eo.onnx.compile(Small(), np.ones((1, 4), np.float32))
    assert fast.session is not None  # built; not yet verified
    x = np.linspace(-2, 2, 8, dtype=np.float32).reshape(2, 4)
    with pytest.warns(RuntimeWarning, match=r"did not pass verification.*'tanh'"):
        y = fast(x)
    np.testing.assert_allclose(y.data, np.tanh(x) * 3, rtol=1e-6)  # EveryO's result, not the wrong graph's
    assert fast.session is None
    np.testing.assert_allclose(fast(x).data, np.tanh(x) * 3, rtol=1e-6)


class BlockSized(eo.Module):
    def forward(self, x):
        t = x.shape[1]
        assert t <= 8, f"sequence of {t} is longer than the block size 8"
        return x * 2


def test_export_guards_are_checked_on_every_call():
    fast = eo.onnx.compile(BlockSized(), np.ones((1, 5), np.float32), dynamic_axes={"input": {0: "batch", 1: "seq"}})
    assert fast.session is not None and [g.text for g in fast.guards] == ["seq <= 8"]
    np.testing.assert_array_equal(fast(np.ones((2, 8), np.float32)).data, np.full((2, 8), 2.0))
    with pytest.raises(EveryOShapeError, match=r"needs seq <= 8.*seq=9"):
        fast(np.ones((2, 9), np.float32))
