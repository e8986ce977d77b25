"""verify=True and eo.verify_onnx: ONNX Runtime's values against EveryO's
recorded ones, node by node, with optimisations off and on."""

import os

import numpy as np
import pytest

import everyo as eo
from everyo.errors import EveryOExportMismatchError, EveryOSerializationError

THIS_FILE = os.path.basename(__file__)


class Small(eo.Module):
    def __init__(self):
        super().__init__()
        self.a = eo.Linear(4, 6, seed=0)
        self.b = eo.Linear(6, 3, seed=1)

    def forward(self, x):
        return self.b(eo.tanh(self.a(x)))  # the tanh line


def test_the_mismatch_error_is_a_serialization_error():
    assert issubclass(EveryOExportMismatchError, EveryOSerializationError)


def test_verify_report_compares_every_intermediate(tmp_path):
    model = Small()
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    path = tmp_path / "m.onnx"
    eo.export_onnx(model, path, example_input=x, verify=True)
    rows = eo.verify_onnx(model, path, x)
    off = [r for r in rows if r["run"] == "optimisations off"]
    assert [r["op"] for r in off] == ["linear", "tanh", "linear", "linear"]  # three nodes, then the output
    assert all(r["ok"] and r["max_abs"] <= 1e-5 for r in rows)
    runs = {r["run"] for r in rows}
    assert "optimisations on" in runs and any("input sizes" in r for r in runs)
    assert THIS_FILE in off[1]["line"]
    assert off[1]["node"].endswith("_tanh_Tanh")
    table = eo.onnx.format_report(rows)
    assert "tanh" in table and "max abs" in table


def test_a_wrong_translation_is_caught_named_and_nothing_is_written(tmp_path, monkeypatch):
    from everyo.onnx import rules

    def wrong_tanh(t, node):  # a deliberately broken rule: Sigmoid instead of Tanh
        t.set(node.outputs[0], t.g.node("Sigmoid", [t.name(node.inputs[0])]))

    path = tmp_path / "m.onnx"
    eo.export_onnx(Small(), path, input_shape=(1, 4))
    old = path.read_bytes()
    monkeypatch.setitem(rules.RULES, "tanh", wrong_tanh)
    with pytest.raises(EveryOExportMismatchError, match=r"from op 'tanh' at .*" + THIS_FILE + r".*over the tolerance"):
        eo.export_onnx(Small(), path, input_shape=(1, 4), verify=True)
    assert path.read_bytes() == old and os.listdir(tmp_path) == ["m.onnx"]
    # Without verify the broken file would have been written: the check is what caught it.
    eo.export_onnx(Small(), tmp_path / "unchecked.onnx", input_shape=(1, 4))
    x = np.ones((2, 4), np.float32)
    assert np.abs(eo.run_onnx(tmp_path / "unchecked.onnx", x) - Small()(eo.tensor(x)).data).max() > 1e-3
    rows = eo.verify_onnx(Small(), tmp_path / "unchecked.onnx", x)
    assert [r["op"] for r in rows if not r["ok"]][0] == "tanh"
