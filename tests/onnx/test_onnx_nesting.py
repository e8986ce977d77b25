"""Nested inputs and outputs as torch.onnx.export takes them: the
word_language_model LSTM of pytorch/examples (``forward(input, hidden)``
returning ``(decoded, hidden)``), ``None`` and dict outputs, the session
cache of run_onnx, and ``eo.onnx`` reachable lazily."""

import json
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx_agreement import _flat, _skeleton

import everyo as eo
from everyo.onnx import runtime

NTOKEN, NINP, NHID, NLAYERS = 20, 8, 12, 2


class RNNModel(eo.Module):
    """pytorch/examples word_language_model's RNNModel (LSTM), batch-first as EveryO's LSTM is."""

    def __init__(self):
        super().__init__()
        self.drop = eo.Dropout(0.5, seed=0)
        self.encoder = eo.Embedding(NTOKEN, NINP, seed=0)
        self.rnn = eo.LSTM(NINP, NHID, NLAYERS, dropout=0.5, seed=1)
        self.decoder = eo.Linear(NHID, NTOKEN, seed=2)

    def forward(self, input, hidden):
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        output = self.drop(output)
        decoded = self.decoder(output)
        decoded = decoded.reshape(-1, NTOKEN)
        return eo.log_softmax(decoded, axis=1), hidden


def lm_inputs(batch, seq, seed=0):
    rng = np.random.default_rng(seed + 31 * batch + seq)
    ids = rng.integers(0, NTOKEN, size=(batch, seq)).astype(np.int64)
    h0, c0 = (rng.standard_normal((NLAYERS, batch, NHID)).astype(np.float32) for _ in range(2))
    return ids, (h0, c0)


LM_AXES = {"ids": {0: "batch", 1: "seq"}, "h0": {1: "batch"}, "c0": {1: "batch"}}


def _expected(model, ids, hidden):
    with eo.no_grad():
        return model(eo.tensor(ids), tuple(eo.tensor(h) for h in hidden))


def _assert_same(returned, result):
    assert _skeleton(returned) == _skeleton(result)
    for a, e in zip(_flat(returned), _flat(result), strict=True):
        np.testing.assert_allclose(a, e.data, rtol=0, atol=1e-5)


def test_word_language_model_exports_nested_and_runs_nested(tmp_path):
    model = RNNModel().eval()
    path = tmp_path / "lm.onnx"
    eo.export_onnx(
        model,
        path,
        example_input=lm_inputs(2, 5),
        input_names=["ids", "h0", "c0"],
        output_names=["log_probs", "h", "c"],
        dynamic_axes=LM_AXES,
        verify=True,
    )
    graph = onnx.load(str(path)).graph
    assert [i.name for i in graph.input] == ["ids", "h0", "c0"]
    assert [o.name for o in graph.output] == ["log_probs", "h", "c"]
    dims = [[d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in graph.input]
    assert dims == [["batch", "seq"], [NLAYERS, "batch", NHID], [NLAYERS, "batch", NHID]]
    for batch, seq in [(2, 5), (1, 1), (3, 9)]:
        ids, hidden = lm_inputs(batch, seq, seed=7)
        returned = eo.run_onnx(path, ids, hidden)
        assert isinstance(returned, tuple) and isinstance(returned[1], tuple)  # (log_probs, (h, c))
        _assert_same(returned, _expected(model, ids, hidden))
    ids, (h0, c0) = lm_inputs(2, 4, seed=3)
    _assert_same(eo.run_onnx(path, ids, h0, c0), _expected(model, ids, (h0, c0)))  # flat leaves work too


def test_nested_input_without_names_is_three_inputs_never_stacked(tmp_path):
    path = tmp_path / "lm.onnx"
    eo.export_onnx(RNNModel(), path, example_input=lm_inputs(2, 5), dynamic_axes={"input0": [1]})
    graph = onnx.load(str(path)).graph
    shapes = [[d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in graph.input]
    assert [i.name for i in graph.input] == ["input0", "input1", "input2"]
    assert shapes == [[2, "input0_dim1"], [NLAYERS, 2, NHID], [NLAYERS, 2, NHID]]


def test_input_names_that_do_not_match_the_leaves_are_refused(tmp_path):
    with pytest.raises(ValueError, match=r"2 names for 3 example input tensors \(example_input is \(T, \(T, T\)\)"):
        eo.export_onnx(RNNModel(), tmp_path / "m.onnx", example_input=lm_inputs(2, 5), input_names=["ids", "hidden"])
    assert not (tmp_path / "m.onnx").exists()
    with pytest.raises(ValueError, match="takes 3 input"):
        path = eo.export_onnx(RNNModel(), tmp_path / "m.onnx", example_input=lm_inputs(2, 5), dynamic_axes={})
        eo.run_onnx(path, lm_inputs(2, 5)[0])


def test_a_top_level_list_of_tensors_is_refused_not_stacked(tmp_path):
    x = np.ones((2, 3), np.float32)
    with pytest.raises(TypeError, match="pass a tuple"):
        eo.export_onnx(eo.Linear(3, 2), tmp_path / "m.onnx", example_input=[x, x])


class LogitsAndNone(eo.Module):
    def __init__(self):
        super().__init__()
        self.head = eo.Linear(4, 3, seed=0)

    def forward(self, x, targets=None):
        logits = self.head(x)
        loss = None if targets is None else eo.mse_loss(logits, targets)
        return logits, loss


def test_none_output_is_dropped_and_its_place_recorded(tmp_path):
    model = LogitsAndNone().eval()
    path = eo.export_onnx(model, tmp_path / "m.onnx", example_input=np.ones((2, 4), np.float32), verify=True)
    proto = onnx.load(str(path))
    assert [o.name for o in proto.graph.output] == ["output"]
    meta = {p.key: p.value for p in proto.metadata_props}
    assert json.loads(meta["everyo.outputs"]) == {"tuple": [0, None]}
    x = np.random.default_rng(1).standard_normal((5, 4)).astype(np.float32)
    logits, loss = eo.run_onnx(path, x)
    assert loss is None
    np.testing.assert_allclose(logits, model(eo.tensor(x))[0].data, rtol=0, atol=1e-5)


class DictOut(eo.Module):
    def forward(self, x):
        return {"scaled": x * 2.0, "shifted": (x + 1.0, [x - 1.0]), "absent": None}


def test_dict_outputs_are_flattened_by_sorted_key(tmp_path):
    path = eo.export_onnx(DictOut(), tmp_path / "m.onnx", example_input=np.ones((1, 3), np.float32), verify=True)
    assert [o.name for o in onnx.load(str(path)).graph.output] == ["output0", "output1", "output2"]
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    returned = eo.run_onnx(path, x)
    assert _skeleton(returned) == {"absent": None, "scaled": "T", "shifted": ("T", ["T"])}
    np.testing.assert_array_equal(returned["scaled"], 2 * x)
    np.testing.assert_array_equal(returned["shifted"][1][0], x - 1)


def test_run_onnx_reuses_its_session_until_the_file_changes(tmp_path):
    path = tmp_path / "m.onnx"
    x = np.ones((1, 3), np.float32)
    eo.export_onnx(eo.Linear(3, 2, seed=0), path, example_input=x)
    first = eo.run_onnx(path, x)
    session = runtime._SESSIONS[os.path.abspath(path)][1]
    eo.run_onnx(path, x)
    assert runtime._SESSIONS[os.path.abspath(path)][1] is session
    other = eo.Linear(3, 2, seed=1)
    eo.export_onnx(other, path, example_input=x)  # replaced atomically: a new file
    np.testing.assert_allclose(eo.run_onnx(path, x), other(eo.tensor(x)).data, atol=1e-6)
    assert not np.allclose(eo.run_onnx(path, x), first)


def test_eo_onnx_is_an_attribute_right_after_import_loaded_lazily():
    code = (
        "import sys, everyo as eo\n"
        "assert 'everyo.onnx' not in sys.modules and 'onnx' not in sys.modules\n"
        "import everyo.onnx\n"
        "assert eo.onnx is sys.modules['everyo.onnx'] and callable(eo.onnx.export_onnx)\n"
    )
    lazy = "import sys, everyo as eo\nm = eo.onnx\nassert m is sys.modules['everyo.onnx'], m\nprint(m.__name__)\n"
    for script in (code, lazy):
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False)
        assert out.returncode == 0, out.stderr


def test_verify_onnx_takes_the_nested_example(tmp_path):
    model = RNNModel().eval()
    path = eo.export_onnx(model, tmp_path / "lm.onnx", example_input=lm_inputs(2, 5), dynamic_axes={})
    rows = eo.verify_onnx(model, path, lm_inputs(2, 5, seed=9))
    assert rows and all(r["ok"] for r in rows)


def test_a_file_without_everyo_metadata_runs_flat(tmp_path):
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["x"], ["b"])],
        "foreign",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 2])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [None, 2]) for n in "ab"],
    )
    ids = [helper.make_opsetid("", 17)]
    proto = helper.make_model(graph, opset_imports=ids, ir_version=helper.find_min_ir_version_for(ids))
    path = tmp_path / "foreign.onnx"
    path.write_bytes(proto.SerializeToString())
    x = np.array([[-1.0, 2.0]], np.float32)
    returned = eo.run_onnx(path, x)
    assert isinstance(returned, list)  # as before: a list for several outputs
    np.testing.assert_array_equal(returned[0], [[0.0, 2.0]])
    np.testing.assert_array_equal(returned[1], [[1.0, -2.0]])


def test_nested_lists_of_numbers_are_one_array(tmp_path):
    path = eo.export_onnx(eo.Linear(2, 3, seed=0), tmp_path / "m.onnx", example_input=[[1.0, 2.0], [3.0, 4.0]])
    assert len(onnx.load(str(path)).graph.input) == 1
    np.testing.assert_allclose(
        eo.run_onnx(path, [[1.0, 2.0]]), eo.Linear(2, 3, seed=0)(eo.tensor([[1.0, 2.0]])).data, atol=1e-6
    )
