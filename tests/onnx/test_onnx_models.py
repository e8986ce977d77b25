"""Models as people write them: custom forward(), residuals, a global average
pool, functional calls, several inputs and outputs, Sequential inside custom
modules and the reverse. Each is traced, verified, and checked against ONNX
Runtime at batch 1 and 7."""

import numpy as np
import onnx
import pytest
from onnx_agreement import assert_traced_agrees, randomize_norms

import everyo as eo


class ResidualBlock(eo.Module):
    def __init__(self, channels, seed):
        super().__init__()
        self.conv1 = eo.Conv2D(channels, channels, 3, padding="same", seed=seed)
        self.bn1 = eo.BatchNorm2D(channels)
        self.conv2 = eo.Conv2D(channels, channels, 3, padding="same", seed=seed + 1)
        self.bn2 = eo.BatchNorm2D(channels)

    def forward(self, x):
        y = eo.relu(self.bn1(self.conv1(x)))
        return eo.relu(x + self.bn2(self.conv2(y)))


class ResidualCNN(eo.Module):
    """Stem, two residual blocks, global average pool written as eo.mean, a head."""

    def __init__(self):
        super().__init__()
        self.stem = eo.Sequential(eo.Conv2D(1, 8, 3, padding="same", seed=0), eo.ReLU())
        self.blocks = eo.Sequential(ResidualBlock(8, 1), eo.MaxPool2D(2), ResidualBlock(8, 3))
        self.head = eo.Linear(8, 10, seed=5)

    def forward(self, x):
        features = self.blocks(self.stem(x))
        return eo.log_softmax(self.head(eo.mean(features, axis=(1, 2))))


def images(batch, size=8, seed=0):
    return np.random.default_rng(seed + batch).standard_normal((batch, size, size, 1)).astype(np.float32)


def test_residual_cnn_with_global_average_pool(tmp_path):
    model = randomize_norms(ResidualCNN(), (1, 8, 8, 1))
    proto = assert_traced_agrees(model, images, tmp_path / "resnet.onnx", sizes=[(1,), (7,)])
    ops = [n.op_type for n in proto.graph.node]
    assert ops.count("Conv") == 5 and "ReduceMean" in ops
    dims = proto.graph.input[0].type.tensor_type.shape.dim
    assert dims[0].dim_param == "batch" and [d.dim_value for d in dims[1:]] == [8, 8, 1]


def test_residual_cnn_with_dynamic_spatial_size(tmp_path):
    # 'same' padding with stride 1 does not depend on the size, so H and W may be dynamic too.
    model = randomize_norms(ResidualCNN(), (1, 8, 8, 1))
    axes = {"input": {0: "batch", 1: "height", 2: "width"}}
    assert_traced_agrees(
        model, lambda b, s: images(b, s), tmp_path / "resnet.onnx", sizes=[(1, 8), (7, 8), (2, 12)], dynamic_axes=axes
    )


class TwoInTwoOut(eo.Module):
    def __init__(self):
        super().__init__()
        self.image = eo.Sequential(eo.Conv2D(1, 4, 3, seed=0), eo.ReLU(), eo.Flatten(), eo.Linear(4 * 6 * 6, 8, seed=1))
        self.meta = eo.Linear(3, 8, seed=2)
        self.out = eo.Linear(8, 2, seed=3)

    def forward(self, image, meta):
        joint = eo.tanh(self.image(image) + self.meta(meta))
        return self.out(joint), eo.softmax(joint, axis=-1)


def test_two_inputs_and_two_outputs(tmp_path):
    def make(batch):
        rng = np.random.default_rng(batch)
        return (
            rng.standard_normal((batch, 8, 8, 1)).astype(np.float32),
            rng.standard_normal((batch, 3)).astype(np.float32),
        )

    proto = assert_traced_agrees(TwoInTwoOut(), make, tmp_path / "two.onnx", sizes=[(1,), (7,)])
    assert [i.name for i in proto.graph.input] == ["input0", "input1"]
    assert [o.name for o in proto.graph.output] == ["output0", "output1"]
    for value in list(proto.graph.input) + list(proto.graph.output):
        assert value.type.tensor_type.shape.dim[0].dim_param == "batch", value.name


def test_graph_names_that_clash_with_weight_names(tmp_path):
    model = eo.Sequential(eo.Linear(3, 2, seed=0))
    path = tmp_path / "m.onnx"
    # "0.weight" is the parameter's name, "n1_linear_MatMul" the name the first node would get.
    eo.export_onnx(
        model, path, input_shape=(1, 3), input_names=["0.weight"], output_names=["n1_linear_MatMul"], verify=True
    )
    x = np.ones((2, 3), np.float32)
    np.testing.assert_allclose(eo.run_onnx(path, x), model(eo.tensor(x)).data, atol=1e-6)


def test_names_and_singular_keywords(tmp_path):
    path = tmp_path / "m.onnx"
    x = (np.ones((2, 8, 8, 1), np.float32), np.ones((2, 3), np.float32))
    eo.export_onnx(
        TwoInTwoOut(), path, example_input=x, input_names=["image", "meta"], output_names=["logits", "probs"]
    )
    proto = onnx.load(str(path))
    assert [i.name for i in proto.graph.input] == ["image", "meta"]
    assert [o.name for o in proto.graph.output] == ["logits", "probs"]
    eo.export_onnx(eo.Sequential(eo.Linear(3, 2, seed=0)), path, input_shape=(1, 3), input_name="x", output_name="y")
    proto = onnx.load(str(path))
    assert (proto.graph.input[0].name, proto.graph.output[0].name) == ("x", "y")


class CustomInsideSequential(eo.Module):
    def __init__(self):
        super().__init__()
        self.lin = eo.Linear(5, 5, seed=0)

    def forward(self, x):
        return x + eo.sigmoid(self.lin(x)) * x


def test_sequential_inside_custom_and_custom_inside_sequential(tmp_path):
    model = eo.Sequential(eo.Linear(4, 5, seed=1), CustomInsideSequential(), eo.Dropout(0.5), eo.LayerNorm(5))
    make = lambda b: np.random.default_rng(b).standard_normal((b, 4)).astype(np.float32)  # noqa: E731
    assert_traced_agrees(randomize_norms(model, (1, 4)), make, tmp_path / "m.onnx", sizes=[(1,), (7,)])


def test_the_seeds_call_still_works(tmp_path):
    from onnx_agreement import digit_cnn

    model = randomize_norms(digit_cnn(), (1, 8, 8, 1))
    path = tmp_path / "model.onnx"
    eo.export_onnx(model, str(path), input_shape=(1, 8, 8, 1), output_name="logits")
    x = images(5)
    np.testing.assert_allclose(eo.run_onnx(path, x), model(eo.tensor(x)).data, rtol=0, atol=1e-5)


def test_returning_something_else_than_tensors_is_refused(tmp_path):
    class ReturnsText(eo.Module):  # (dicts of Tensors are flattened by key: test_onnx_nesting.py)
        def forward(self, x):
            return {"y": x, "note": "text"}

    with pytest.raises(eo.EveryOSerializationError, match="returned a str"):
        eo.export_onnx(ReturnsText(), tmp_path / "m.onnx", input_shape=(1, 3))
    assert not (tmp_path / "m.onnx").exists()
