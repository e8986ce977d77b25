"""Refusals: what cannot be exported is refused before anything is written,
naming the op and the user's source line (or the layer and its position);
bad arguments fail clearly; a failed export leaves no file and an existing
file untouched."""

import inspect
import os
import re

import numpy as np
import pytest

import everyo as eo
from everyo.errors import EveryODTypeError, EveryOSerializationError, EveryOShapeError

THIS_FILE = os.path.basename(__file__)


def refused(model, path, *fragments, error=EveryOSerializationError, **kwargs):
    kwargs.setdefault("input_shape", (1, 4))
    with pytest.raises(error) as info:
        eo.export_onnx(model, path, **kwargs)
    message = str(info.value)
    for fragment in fragments:
        assert re.search(fragment, message), (fragment, message)
    assert not os.path.exists(path)
    assert not os.listdir(os.path.dirname(path)), "a temporary file was left behind"
    return message


def line_of(fn, text):
    """The line number in this file of the first line of ``fn`` containing ``text``."""
    import inspect

    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, line in enumerate(lines) if text in line)


class Branchy(eo.Module):
    def __init__(self):
        super().__init__()
        self.lin = eo.Linear(4, 4, seed=0)

    def forward(self, x):
        y = self.lin(x)
        if float(y.sum()) > 0:  # data-dependent control flow
            return y
        return -y


def test_python_value_of_a_traced_tensor_is_refused_with_the_line(tmp_path):
    line = line_of(Branchy.forward, "float(y.sum())")
    refused(
        Branchy(),
        str(tmp_path / "m.onnx"),
        "Python float",
        f"{THIS_FILE}:{line}",
        "op 'sum'",
        "data-dependent control flow",
    )


class UsesConstantValue(eo.Module):
    """Converting a *constant* (a parameter) to a Python value is fine: it is the same in every run."""

    def __init__(self):
        super().__init__()
        self.lin = eo.Linear(4, 4, seed=0)
        self.scale = eo.Parameter(np.array(2.0, np.float32))

    def forward(self, x):
        return self.lin(x) * float(self.scale)


def test_python_value_of_a_constant_is_allowed(tmp_path):
    path = tmp_path / "m.onnx"
    model = UsesConstantValue()
    eo.export_onnx(model, path, input_shape=(1, 4), verify=True)
    x = np.ones((3, 4), np.float32)
    np.testing.assert_allclose(eo.run_onnx(path, x), model(eo.tensor(x)).data, atol=1e-5)


class Activation(eo.Module):
    def forward(self, x):
        return eo.tanh(x) + 1


def test_op_without_a_rule_is_refused_with_op_and_line(tmp_path, monkeypatch):
    from everyo.onnx import rules

    monkeypatch.delitem(rules.RULES, "tanh")
    line = line_of(Activation.forward, "eo.tanh")
    refused(Activation(), str(tmp_path / "m.onnx"), "no ONNX translation rule for 'tanh'", f"{THIS_FILE}:{line}")


class InPlace(eo.Module):
    def __init__(self):
        super().__init__()
        self.lin = eo.Linear(4, 4, seed=0)

    def forward(self, x):
        y = self.lin(x)
        self.lin.weight.data = self.lin.weight.data * 2  # changes a weight the graph already used
        return self.lin(y)


class InPlaceMutation(InPlace):
    def forward(self, x):
        y = self.lin(x)
        self.lin.bias.data += 1  # in place, same array
        return y


@pytest.mark.parametrize(
    "cls, writes", [(InPlace, "self.lin.weight.data ="), (InPlaceMutation, "self.lin.bias.data +=")]
)
def test_in_place_data_change_during_the_trace_is_refused(cls, writes, tmp_path):
    line = line_of(cls.forward, writes)  # the line that wrote the weight, not the one that read it
    refused(
        cls(), str(tmp_path / "m.onnx"), r"lin\.(weight|bias)", rf"changed in place at \S*{THIS_FILE}:{line} in forward"
    )


@pytest.mark.parametrize("cls, input_shape", [(eo.BatchNorm1D, (1, 4)), (eo.BatchNorm2D, (1, 3, 3, 4))])
def test_batch_norm_without_running_stats_is_refused(cls, input_shape, tmp_path):
    model = eo.Sequential(eo.Sequential(cls(4, track_running_stats=False)))
    refused(
        model,
        str(tmp_path / "m.onnx"),
        re.escape(f"{cls.__name__} at model[0][0]") + ".*track_running_stats=False",
        input_shape=input_shape,
    )


def test_every_layer_problem_is_listed_at_once(tmp_path):
    model = eo.Sequential(
        eo.Linear(4, 4, seed=0).to("float64"), eo.ReLU(), eo.BatchNorm1D(4, track_running_stats=False)
    )
    refused(model, str(tmp_path / "m.onnx"), re.escape("Linear at model[0]"), re.escape("BatchNorm1D at model[2]"))


def test_float64_model_is_refused_with_the_fix(tmp_path):
    model = eo.Sequential(eo.Linear(4, 2, seed=0)).to("float64")
    refused(
        model, str(tmp_path / "m.onnx"), re.escape("Linear at model[0]"), "float64", re.escape("model.to('float32')")
    )


def test_float16_weights_and_inputs_are_refused(tmp_path):
    model = eo.Sequential(eo.Linear(4, 2, seed=0)).to("float16")
    refused(
        model, str(tmp_path / "m.onnx"), re.escape("Linear at model[0]"), "float16", re.escape("model.to('float32')")
    )
    refused(
        eo.Sequential(eo.Linear(4, 2, seed=0)),
        str(tmp_path / "m.onnx"),
        "example input 0 has dtype float16",
        input_shape=None,
        example_input=np.ones((1, 4), np.float16),
    )


def test_bfloat16_weights_and_inputs_are_refused(tmp_path):
    # ml_dtypes comes with everyo-amp (bfloat16 autocast); core and this add-on never import it.
    ml_dtypes = pytest.importorskip("ml_dtypes")
    model = eo.Sequential(eo.Linear(4, 2, seed=0))
    model[0].weight.data = model[0].weight.data.astype(ml_dtypes.bfloat16)
    refused(model, str(tmp_path / "m.onnx"), "bfloat16", re.escape("model.to('float32')"))
    x = np.ones((1, 4), ml_dtypes.bfloat16)
    refused(
        eo.Sequential(eo.Linear(4, 2, seed=0)),
        str(tmp_path / "m.onnx"),
        "example input 0 has dtype bfloat16",
        input_shape=None,
        example_input=x,
    )


def test_a_float64_result_inside_the_graph_is_refused(tmp_path):
    class Promotes(eo.Module):
        def forward(self, x):
            return x * eo.tensor(np.ones(4, np.float64))

    refused(Promotes(), str(tmp_path / "m.onnx"), "produces float64", "op 'mul'")


def test_models_over_two_gib_are_refused(tmp_path, monkeypatch):
    from everyo.onnx import export

    # The limit is protobuf's 2 GiB; lowered here so the test needs no 2 GiB of weights.
    monkeypatch.setattr(export, "MAX_MODEL_BYTES", 1000)
    refused(eo.Sequential(eo.Linear(4, 100, seed=0)), str(tmp_path / "m.onnx"), "2 GiB", "external data")


def test_example_input_the_model_rejects_is_its_own_error_while_tracing(tmp_path):
    model = eo.Sequential(eo.Linear(4, 8, seed=0), eo.Sequential(eo.ReLU(), eo.Linear(5, 2, seed=1)))
    refused(
        model,
        str(tmp_path / "m.onnx"),
        "while tracing Sequential",
        re.escape("layer [1][1]"),
        "last dimension 5",
        error=EveryOShapeError,
    )
    ids = np.zeros((2, 4), np.int64)  # integer ids into a Linear
    refused(
        model,
        str(tmp_path / "m.onnx"),
        "while tracing",
        "int64",
        error=EveryODTypeError,
        input_shape=None,
        example_input=ids,
    )


class Looped(eo.Module):
    def forward(self, x):
        total = x[:, 0]
        for t in range(1, x.shape[1]):  # a Python loop over the sequence axis
            total = total + x[:, t]
        return total


class BakedZeros(eo.Module):
    def forward(self, x):
        return x + eo.zeros(*x.data.shape)  # a constant of the traced size (x.shape the graph would follow)


class TwoBakedSizes(eo.Module):
    def forward(self, x):
        b, t, e = x.data.shape  # plain ints: the graph cannot follow them (x.shape it can)
        return eo.reshape(x, (t, b, e))  # two sizes taken from the traced arrays, in other places


class ThroughData(eo.Module):
    def forward(self, x):
        return x + eo.tensor(np.tanh(x.data))  # NumPy on .data: invisible to the trace


@pytest.mark.parametrize(
    "cls, fragment",
    [
        (Looped, "records 5 ops .* but 7"),
        (ThroughData, "op 'add'.*differs between"),
        (BakedZeros, "op 'add'.*differs between"),
        (TwoBakedSizes, "op 'reshape'.*translates differently"),
    ],
)
def test_the_dynamic_axes_check_catches_what_the_graph_cannot_follow(cls, fragment, tmp_path):
    refused(
        cls(),
        str(tmp_path / "m.onnx"),
        fragment,
        "Nothing was written",
        input_shape=None,
        example_input=np.ones((2, 3, 4), np.float32) * np.arange(1, 4, dtype=np.float32)[:, None],
        dynamic_axes={"input": {0: "batch", 1: "seq"}},
    )


def test_static_axes_export_what_the_dynamic_check_refuses(tmp_path):
    # Without dynamic axes the loop unrolls at the traced size: correct there.
    path = tmp_path / "m.onnx"
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    eo.export_onnx(Looped(), path, example_input=x, dynamic_axes={}, verify=True)
    np.testing.assert_allclose(eo.run_onnx(path, x), Looped()(eo.tensor(x)).data, atol=1e-5)


def test_refusal_leaves_an_existing_file_untouched(tmp_path):
    path = tmp_path / "m.onnx"
    eo.export_onnx(eo.Sequential(eo.Linear(4, 2, seed=0)), path, input_shape=(1, 4))
    old = path.read_bytes()
    with pytest.raises(EveryOSerializationError):
        eo.export_onnx(Branchy(), path, input_shape=(1, 4))
    assert path.read_bytes() == old


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(input_shape=None), "exactly one of input_shape"),
        (dict(input_shape=(1, 4), example_input=np.ones((1, 4), np.float32)), "exactly one of input_shape"),
        (dict(input_shape=(4,)), "input_shape"),
        (dict(input_shape=(1, 0)), "input_shape"),
        (dict(input_shape=(1, 4), output_name="input"), "must differ"),
        (dict(input_shape=(1, 4), output_name=""), "output_names"),
        (dict(input_shape=(1, 4), output_names=["a", "b"]), "returns 1 outputs"),
        (dict(input_shape=(1, 4), input_names=["a", "b"]), "2 names for 1 example input tensors"),
        (dict(input_shape=(1, 4), dynamic_axes={"input": {2: "x"}}), "axis 2, but that input has rank 2"),
        (dict(input_shape=(1, 4), dynamic_axes={"inptu": {0: "batch"}}), r"\['inptu'\], which are not inputs"),
        (dict(input_shape=(1, 4), opset=12), "opset must be an integer from 13"),
        (dict(input_shape=(1, 4), opset=10_000), "opset must be an integer from 13"),
    ],
)
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


class WrongWidth(eo.Module):
    def __init__(self):
        super().__init__()
        self.lin = eo.Linear(5, 2, seed=0)

    def forward(self, x):
        return self.lin(x) * 2  # x has 4 features, the layer takes 5


def test_an_error_raised_while_tracing_names_the_users_line(tmp_path):
    line = line_of(WrongWidth.forward, "self.lin(x)")
    refused(
        WrongWidth(),
        str(tmp_path / "m.onnx"),
        "while tracing WrongWidth",
        f"raised from .*{THIS_FILE}:{line} in forward",
        "last dimension",
        error=EveryOShapeError,
    )


def test_a_graph_the_checker_rejects_names_the_op_and_line(tmp_path, monkeypatch):
    from everyo.onnx import rules

    def broken(t, node):  # a rule that writes an ONNX node with an attribute Tanh does not have
        t.set(node.outputs[0], t.g.node("Tanh", [t.name(node.inputs[0])], alpha=1.0))

    monkeypatch.setitem(rules.RULES, "tanh", broken)
    line = line_of(Activation.forward, "eo.tanh")
    refused(
        Activation(), str(tmp_path / "m.onnx"), "failed onnx.checker at the node for op 'tanh'", f"{THIS_FILE}:{line}"
    )


class ForgotReturn(eo.Module):
    def __init__(self):
        super().__init__()
        self.lin = eo.Linear(4, 2, seed=0)

    def forward(self, x):
        self.lin(x)  # no return statement


class ReturnsAnInt(eo.Module):
    def forward(self, x):
        return x * 2, x.shape[0]


@pytest.mark.parametrize(
    "cls, fragment",
    [
        (ForgotReturn, "returned no Tensor .*does it end with a return statement"),
        (ReturnsAnInt, r"returned a size \(an int from x.shape\)"),
    ],
)
def test_a_result_that_is_not_tensors_names_forward_and_the_fix(cls, fragment, tmp_path):
    line = inspect.getsourcelines(cls.forward)[1]
    refused(cls(), str(tmp_path / "m.onnx"), fragment, f"{cls.__name__}.forward at .*{THIS_FILE}:{line}")
