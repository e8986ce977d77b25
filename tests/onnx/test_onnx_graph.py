"""What the exported graph contains: the layout and padding decisions, the
symbolic batch axis, opset and checker, and that export leaves the model alone."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx_agreement import ATOL, digit_cnn, random_batch, randomize_norms

import everyo as eo
from everyo.onnx import DEFAULT_OPSET

WINDOW_OPS = ("Conv", "MaxPool", "AveragePool")


def attrs(node):
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


@pytest.fixture
def cnn_proto(tmp_path):
    model = randomize_norms(digit_cnn(), (1, 8, 8, 1))
    path = tmp_path / "cnn.onnx"
    eo.export_onnx(model, path, input_shape=(1, 8, 8, 1), output_name="logits")
    return model, path, onnx.load(str(path))


def test_conv_chain_has_one_transpose_in_and_one_out(cnn_proto):
    # Conv -> batch norm -> ReLU -> MaxPool -> Conv -> ReLU -> AvgPool run in
    # NCHW between one Transpose in and one out: the inverse pairs between
    # them cancel (the batch norm's constants are re-laid to (C, 1, 1)).
    _, _, proto = cnn_proto
    ops = [n.op_type for n in proto.graph.node]
    windows = [n.op_type for n in proto.graph.node if n.op_type in WINDOW_OPS]
    assert windows == ["Conv", "MaxPool", "Conv", "AveragePool"]
    transposes = [n for n in proto.graph.node if n.op_type == "Transpose"]
    assert [attrs(n)["perm"] for n in transposes] == [[0, 3, 1, 2], [0, 2, 3, 1]]
    assert ops.index("Transpose") < ops.index("Conv")
    # The way out is after the last pool and before the flatten (NHWC order).
    last = len(ops) - 1 - ops[::-1].index("Transpose")
    assert ops.index("AveragePool") < last < ops.index("Reshape")


def test_explicit_pads_and_no_auto_pad(cnn_proto):
    _, _, proto = cnn_proto
    for n in proto.graph.node:
        assert "auto_pad" not in attrs(n), n.name
        if n.op_type in WINDOW_OPS:
            assert len(attrs(n)["pads"]) == 4, n.name
    # The two 3x3 'same' convolutions pad one pixel on every side.
    assert [attrs(n)["pads"] for n in proto.graph.node if n.op_type == "Conv"] == [[1, 1, 1, 1]] * 2
    (avg,) = [n for n in proto.graph.node if n.op_type == "AveragePool"]
    assert attrs(avg)["count_include_pad"] == 0


def test_kernel_is_permuted_to_out_in_kh_kw(cnn_proto):
    model, _, proto = cnn_proto
    weights = {t.name: onnx.numpy_helper.to_array(t) for t in proto.graph.initializer}
    conv = [n for n in proto.graph.node if n.op_type == "Conv"][1]
    w = weights[conv.input[1]]
    assert w.shape == (16, 8, 3, 3)
    # ONNX W[o, i, y, x] is EveryO's weight[y, x, i, o].
    np.testing.assert_array_equal(w[5, 2, 0, 1], model[4].weight.data[0, 1, 2, 5])


def test_batch_norm_uses_its_running_statistics_as_constants(cnn_proto):
    # Eval-mode batch norm traces as (x - mean) / sqrt(var + eps) * gamma + beta;
    # sqrt(var + eps) involves constants only and is folded into one constant.
    model, _, proto = cnn_proto
    ops = [n.op_type for n in proto.graph.node]
    assert "BatchNormalization" not in ops
    i = ops.index("Sub")
    assert ops[i : i + 4] == ["Sub", "Div", "Mul", "Add"]
    weights = {t.name: onnx.numpy_helper.to_array(t) for t in proto.graph.initializer}
    bn = model[1]
    std = [
        w for w in weights.values() if w.size == 8 and np.allclose(w.reshape(-1), np.sqrt(bn.running_var.data + bn.eps))
    ]
    assert std, "the folded sqrt(running_var + eps) is not among the constants"


def test_batch_axis_is_symbolic_and_other_axes_fixed(tmp_path):
    model = eo.Sequential(eo.Conv2D(1, 2, 3, seed=0), eo.Flatten(), eo.Linear(72, 3, seed=1))
    path = tmp_path / "m.onnx"
    # input_shape says batch 5; the graph must still take any batch size.
    eo.export_onnx(model, path, input_shape=(5, 8, 8, 1), output_name="scores", input_name="images")
    proto = onnx.load(str(path))
    for value, fixed in ((proto.graph.input[0], [8, 8, 1]), (proto.graph.output[0], [3])):
        dims = value.type.tensor_type.shape.dim
        assert dims[0].dim_param == "batch" and not dims[0].HasField("dim_value")
        assert [d.dim_value for d in dims[1:]] == fixed
    assert proto.graph.input[0].name == "images" and proto.graph.output[0].name == "scores"
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for batch in (1, 3, 64):
        x = random_batch((1, 8, 8, 1), batch)
        (out,) = session.run(["scores"], {"images": x})
        np.testing.assert_allclose(out, model(eo.tensor(x)).data, rtol=0, atol=ATOL)


def test_checker_full_check_opset_and_ir_version(cnn_proto):
    _, path, proto = cnn_proto
    onnx.checker.check_model(onnx.load(str(path)), full_check=True)
    assert DEFAULT_OPSET == 17
    assert [(o.domain, o.version) for o in proto.opset_import] == [("", 17)]
    # The lowest IR version that carries opset 17, so older runtimes load the file.
    assert proto.ir_version == 8
    assert proto.producer_name == "everyo"


def test_export_does_not_touch_the_model_and_exports_inference(tmp_path):
    model = randomize_norms(digit_cnn(), (1, 8, 8, 1))
    model.train()
    before = {k: v.copy() for k, v in model.state_dict().items()}
    path = tmp_path / "m.onnx"
    eo.export_onnx(model, path, input_shape=(1, 8, 8, 1))
    assert model.training and all(m.training for m in model.modules())
    after = model.state_dict()
    assert before.keys() == after.keys() and all(np.array_equal(before[k], after[k]) for k in before)
    x = random_batch((1, 8, 8, 1), 4)
    model.eval()
    np.testing.assert_allclose(eo.run_onnx(path, x), model(eo.tensor(x)).data, rtol=0, atol=ATOL)


def test_empty_sequential_and_trailing_dropout_still_name_the_output(tmp_path):
    for model in (eo.Sequential(), eo.Sequential(eo.Linear(3, 2, seed=0), eo.Dropout(0.3))):
        path = tmp_path / "m.onnx"
        eo.export_onnx(model, path, input_shape=(1, 3), output_name="y")
        proto = onnx.load(str(path))
        assert proto.graph.output[0].name == "y"
        x = random_batch((1, 3), 2)
        np.testing.assert_allclose(eo.run_onnx(path, x), model.eval()(eo.tensor(x)).data, rtol=0, atol=ATOL)
