"""run_onnx, onnx_available, the lazy eo.* names and the install hints."""

import json
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import everyo as eo
import everyo.onnx

HINT = "pip install everyo-core[onnx]"


def test_lazy_names_resolve_to_the_addon():
    assert eo.verify_onnx is everyo.onnx.verify_onnx
    assert eo.export_onnx is everyo.onnx.export_onnx
    assert eo.run_onnx is everyo.onnx.run_onnx
    assert eo.onnx_available is everyo.onnx.onnx_available
    assert eo.onnx_available() is True


def test_run_onnx_hint_without_onnxruntime(tmp_path, monkeypatch):
    from importlib import metadata

    path = tmp_path / "m.onnx"
    eo.export_onnx(eo.Sequential(eo.ReLU()), path, input_shape=(1, 3))
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # makes `import onnxruntime` fail

    def not_installed(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", not_installed)
    with pytest.raises(
        ImportError, match="not installed. Install it with: " + HINT.replace("[", r"\[").replace("]", r"\]")
    ):
        eo.run_onnx(path, np.zeros((1, 3), np.float32))


def test_run_onnx_says_installed_but_failed_to_import(tmp_path, monkeypatch):
    # onnxruntime is installed here; an import that fails (e.g. 1.18 under NumPy 2) is told apart.
    path = tmp_path / "m.onnx"
    eo.export_onnx(eo.Sequential(eo.ReLU()), path, input_shape=(1, 3))
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with pytest.raises(ImportError, match=r"installed but failed to import: .*onnxruntime>=1.19"):
        eo.run_onnx(path, np.zeros((1, 3), np.float32))


def test_pyproject_pins_an_onnxruntime_that_imports_under_numpy_2():
    text = open(os.path.join(os.path.dirname(__file__), "..", "..", "packages", "everyo-onnx", "pyproject.toml")).read()
    assert '"onnxruntime>=1.19"' in text


def test_export_hint_and_onnx_available_without_onnx(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnx", None)
    assert eo.onnx_available() is False
    with pytest.raises(ImportError, match=r"pip install everyo-core\[onnx\]"):
        eo.export_onnx(eo.Sequential(eo.ReLU()), tmp_path / "m.onnx", input_shape=(1, 3))
    assert not (tmp_path / "m.onnx").exists()


def test_importing_the_addon_imports_neither_onnx_nor_onnxruntime():
    code = "import sys, json, everyo.onnx; print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('onnx', 'onnxruntime'))))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ.copy())
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_run_onnx_takes_tensors_and_float64_and_returns_numpy(tmp_path):
    path = tmp_path / "m.onnx"
    model = eo.Sequential(eo.Linear(3, 2, seed=0))
    eo.export_onnx(model, path, input_shape=(1, 3))
    x = np.random.default_rng(0).standard_normal((4, 3))  # float64, cast to the graph's float32
    expected = model(eo.tensor(x.astype(np.float32))).data
    for batch in (x, eo.tensor(x.astype(np.float32))):
        out = eo.run_onnx(path, batch)
        assert isinstance(out, np.ndarray) and out.dtype == np.float32
        np.testing.assert_allclose(out, expected, rtol=0, atol=1e-5)


def test_run_onnx_returns_a_list_for_several_outputs(tmp_path):
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["x"], ["b"])],
        "two",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 2])],
        [
            helper.make_tensor_value_info("a", TensorProto.FLOAT, ["n", 2]),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, ["n", 2]),
        ],
    )
    ids = [helper.make_opsetid("", 17)]
    path = tmp_path / "two.onnx"
    onnx.save(helper.make_model(graph, opset_imports=ids, ir_version=helper.find_min_ir_version_for(ids)), str(path))
    x = np.array([[-1.0, 2.0]], np.float32)
    a, b = eo.run_onnx(path, x)
    np.testing.assert_array_equal(a, [[0.0, 2.0]])
    np.testing.assert_array_equal(b, [[1.0, -2.0]])


def test_run_onnx_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="no ONNX file"):
        eo.run_onnx(tmp_path / "absent.onnx", np.zeros((1, 3), np.float32))


def test_run_onnx_feeds_several_inputs_and_keeps_integers(tmp_path):
    class TwoInputs(eo.Module):
        def __init__(self):
            super().__init__()
            self.emb = eo.Embedding(10, 3, seed=0)

        def forward(self, ids, x):
            return self.emb(ids) + x, x * 2

    model = TwoInputs()
    ids = np.array([[1, 2], [9, 0]], np.int64)
    x = np.random.default_rng(0).standard_normal((2, 2, 3)).astype(np.float32)
    path = tmp_path / "m.onnx"
    eo.export_onnx(model, path, example_input=(ids, x), input_names=["ids", "x"], output_names=["a", "b"])
    proto = onnx.load(str(path))
    assert [i.type.tensor_type.elem_type for i in proto.graph.input] == [TensorProto.INT64, TensorProto.FLOAT]
    a, b = eo.run_onnx(path, ids.astype(np.int32), x.astype(np.float64))  # int32 ids become the graph's int64
    np.testing.assert_allclose(a, model(eo.tensor(ids), eo.tensor(x))[0].data, atol=1e-6)
    np.testing.assert_allclose(b, 2 * x, atol=1e-6)
    with pytest.raises(ValueError, match="takes 2 input"):
        eo.run_onnx(path, ids)
