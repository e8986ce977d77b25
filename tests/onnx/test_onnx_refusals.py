"""Refusals: unsupported layers are named (class and position) before anything
is written; bad arguments fail clearly; a failed export leaves no file."""
import os
import re

import numpy as np
import pytest

import everyo as eo
from everyo.errors import EveryOSerializationError, EveryOShapeError

# The layers the spec says are not exportable, built as a user would build them.
REFUSED = {
    "RNN": lambda: eo.RNN(4, 4, seed=0),
    "LSTM": lambda: eo.LSTM(4, 4, seed=0),
    "GRU": lambda: eo.GRU(4, 4, seed=0),
    "Embedding": lambda: eo.Embedding(10, 4, seed=0),
    "MultiHeadAttention": lambda: eo.MultiHeadAttention(4, 2, seed=0),
    "PositionalEncoding": lambda: eo.PositionalEncoding(4),
    "TransformerEncoderLayer": lambda: eo.TransformerEncoderLayer(4, 2, dim_feedforward=8, seed=0),
    "TransformerDecoderLayer": lambda: eo.TransformerDecoderLayer(4, 2, dim_feedforward=8, seed=0),
    "TransformerEncoder": lambda: eo.TransformerEncoder(1, 4, 2, dim_feedforward=8, seed=0),
    "TransformerDecoder": lambda: eo.TransformerDecoder(1, 4, 2, dim_feedforward=8, seed=0),
}


def test_every_transformer_block_in_core_is_covered():
    assert sorted(n for n in dir(eo) if n.startswith("Transformer")) == sorted(
        n for n in REFUSED if n.startswith("Transformer"))


def assert_refused(model, path, *fragments):
    with pytest.raises(EveryOSerializationError) as info:
        eo.export_onnx(model, path, input_shape=(1, 4))
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    assert not os.path.exists(path)
    assert not os.listdir(os.path.dirname(path)), "a temporary file was left behind"
    return message


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_sequence_layers_are_refused_with_class_and_position(name, tmp_path):
    layer = REFUSED[name]()
    model = eo.Sequential(eo.Linear(4, 4, seed=0), eo.Sequential(eo.ReLU(), layer))
    assert_refused(model, str(tmp_path / "m.onnx"), f"{name} at model[1][1]", "tracing exporter")


class Residual(eo.Module):
    def __init__(self):
        super().__init__()
        self.inner = eo.Linear(4, 4, seed=0)

    def forward(self, x):
        return x + self.inner(x)


class MyLinear(eo.Linear):
    def forward(self, x):
        return super().forward(x) * 2


class MySequential(eo.Sequential):
    def forward(self, x):
        return x


@pytest.mark.parametrize("custom, name", [
    (lambda: Residual(), "Residual"),
    (lambda: MyLinear(4, 4, seed=0), "MyLinear"),
    (lambda: MySequential(eo.ReLU()), "MySequential"),
])
def test_users_own_modules_are_refused(custom, name, tmp_path):
    model = eo.Sequential(eo.Linear(4, 4, seed=0), eo.ReLU(), eo.Sequential(custom()))
    message = assert_refused(model, str(tmp_path / "m.onnx"), f"{name} at model[2][0]", "not a layer the exporter knows")
    assert "Conv2D" in message  # the message lists what is supported


def test_refused_model_at_the_top_level_is_named_model(tmp_path):
    assert_refused(Residual(), str(tmp_path / "m.onnx"), "Residual at model ")


@pytest.mark.parametrize("cls, input_shape", [(eo.BatchNorm1D, (1, 4)), (eo.BatchNorm2D, (1, 3, 3, 4))])
def test_batch_norm_without_running_stats_is_refused(cls, input_shape, tmp_path):
    model = eo.Sequential(eo.Sequential(cls(4, track_running_stats=False)))
    path = tmp_path / "m.onnx"
    with pytest.raises(EveryOSerializationError, match=re.escape(f"{cls.__name__} at model[0][0]") + ".*track_running_stats=False"):
        eo.export_onnx(model, path, input_shape=input_shape)
    assert not path.exists()


def test_every_problem_is_listed_at_once(tmp_path):
    model = eo.Sequential(Residual(), eo.ReLU(), eo.BatchNorm1D(4, track_running_stats=False))
    assert_refused(model, str(tmp_path / "m.onnx"), "Residual at model[0]", "BatchNorm1D at model[2]")


def test_float64_model_is_refused_with_the_fix(tmp_path):
    model = eo.Sequential(eo.Linear(4, 2, seed=0)).to("float64")
    assert_refused(model, str(tmp_path / "m.onnx"), "Linear at model[0]", "float64", "model.to('float32')")


def test_refusal_leaves_an_existing_file_untouched(tmp_path):
    path = tmp_path / "m.onnx"
    eo.export_onnx(eo.Sequential(eo.Linear(4, 2, seed=0)), path, input_shape=(1, 4))
    old = path.read_bytes()
    with pytest.raises(EveryOSerializationError):
        eo.export_onnx(eo.Sequential(Residual()), path, input_shape=(1, 4))
    assert path.read_bytes() == old


def test_shape_mismatch_names_the_layer_and_writes_nothing(tmp_path):
    model = eo.Sequential(eo.Linear(4, 8, seed=0), eo.Sequential(eo.ReLU(), eo.Linear(5, 2, seed=1)))
    path = tmp_path / "m.onnx"
    with pytest.raises(EveryOShapeError, match=re.escape("Linear at model[1][1]") + r".*\(\.\.\., 5\).*\('batch', 8\)"):
        eo.export_onnx(model, path, input_shape=(1, 4))
    with pytest.raises(EveryOShapeError, match=re.escape("Conv2D at model[0]") + ".*NHWC"):
        eo.export_onnx(eo.Sequential(eo.Conv2D(1, 2, 3)), path, input_shape=(1, 8, 8))
    with pytest.raises(EveryOShapeError, match=re.escape("MaxPool2D at model[0]")):
        eo.export_onnx(eo.Sequential(eo.MaxPool2D(4)), path, input_shape=(1, 3, 3, 1))
    assert not path.exists()


@pytest.mark.parametrize("kwargs, match", [
    (dict(input_shape=None), "input_shape"),
    (dict(input_shape=(4,)), "input_shape"),
    (dict(input_shape=(1, 0)), "input_shape"),
    (dict(input_shape=(1, 4), output_name="input"), "must differ"),
    (dict(input_shape=(1, 4), output_name=""), "output_name"),
    (dict(input_shape=(1, 4), opset=12), "opset must be an integer from 13"),
    (dict(input_shape=(1, 4), opset=10_000), "opset must be an integer from 13"),
])
def test_bad_arguments(kwargs, match, tmp_path):
    path = tmp_path / "m.onnx"
    with pytest.raises(ValueError, match=match):
        eo.export_onnx(eo.Sequential(eo.Linear(4, 2, seed=0)), path, **kwargs)
    assert not path.exists()


@pytest.mark.parametrize("input_shape", [(None, 4), [3, 4], (np.int64(1), np.int64(4))])
def test_input_shape_forms(input_shape, tmp_path):
    path = tmp_path / "m.onnx"
    eo.export_onnx(eo.Sequential(eo.Linear(4, 2, seed=0)), path, input_shape=input_shape)
    assert eo.run_onnx(path, np.ones((5, 4), np.float32)).shape == (5, 2)


def test_not_a_module(tmp_path):
    with pytest.raises(TypeError, match="EveryO Module"):
        eo.export_onnx(lambda x: x, tmp_path / "m.onnx", input_shape=(1, 4))


def test_layer_norm_needs_opset_17(tmp_path):
    path = tmp_path / "m.onnx"
    with pytest.raises(EveryOSerializationError, match=re.escape("LayerNorm at model[1]") + ".*opset 17"):
        eo.export_onnx(eo.Sequential(eo.Linear(4, 4, seed=0), eo.LayerNorm(4)), path, input_shape=(1, 4), opset=16)
    assert not path.exists()


@pytest.mark.parametrize("failing", ["os.fsync", "os.replace"])
def test_failure_while_writing_leaves_no_file(failing, tmp_path, monkeypatch):
    import everyo.io  # the exporter writes through core's one atomic writer

    def boom(*args):
        raise OSError(f"simulated failure in {failing}")

    monkeypatch.setattr(everyo.io.os, failing.split(".")[1], boom)
    path = tmp_path / "m.onnx"
    with pytest.raises(OSError, match="simulated"):
        eo.export_onnx(eo.Sequential(eo.Linear(4, 2, seed=0)), path, input_shape=(1, 4))
    assert os.listdir(tmp_path) == []


def test_missing_folder_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        eo.export_onnx(eo.Sequential(eo.ReLU()), tmp_path / "nope" / "m.onnx", input_shape=(1, 4))


def test_export_writes_a_complete_file_and_returns_the_path(tmp_path):
    path = tmp_path / "m.onnx"
    assert eo.export_onnx(eo.Sequential(eo.Linear(4, 2, seed=0)), path, input_shape=(1, 4)) == path
    assert os.listdir(tmp_path) == ["m.onnx"]
    x = np.ones((2, 4), np.float32)
    assert eo.run_onnx(path, x).shape == (2, 2)
