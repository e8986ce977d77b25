"""Shared helpers for the ONNX tests: every agreement check runs the exported
file in ONNX Runtime (through the public eo.run_onnx) and compares it with
EveryO's own eval-mode forward pass on the same random batch."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import everyo as eo
from everyo.onnx import MIN_OPSET

BATCHES = (1, 7)
ATOL = 1e-5


def random_batch(input_shape, batch, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((batch,) + tuple(input_shape[1:])).astype(np.float32)


def randomize_norms(model, input_shape, seed=0, steps=3):
    """Give normalisation layers random affine parameters and trained running
    statistics, so the export is checked on something other than the identity.

    Batch norm statistics come from a few train-mode passes over shifted,
    scaled data (mean ~1.5, std ~2): running_mean and running_var then differ
    clearly from their initial 0 and 1.
    """
    rng = np.random.default_rng(seed)
    for m in model.modules():
        if isinstance(m, (eo.BatchNorm1D, eo.BatchNorm2D, eo.LayerNorm)) and m.weight is not None:
            m.weight.data = (1 + 0.5 * rng.standard_normal(m.weight.shape)).astype(np.float32)
            m.bias.data = (0.5 * rng.standard_normal(m.bias.shape)).astype(np.float32)
    if any(isinstance(m, (eo.BatchNorm1D, eo.BatchNorm2D)) for m in model.modules()):
        model.train()
        with eo.no_grad():
            for i in range(steps):
                model(eo.tensor(1.5 + 2 * random_batch(input_shape, 16, seed=100 + i)))
    model.eval()
    return model


def assert_agrees(model, input_shape, path, *, opset=None, batches=BATCHES, seed=0):
    """Export ``model`` and check ONNX Runtime against EveryO at each batch size."""
    model.eval()
    eo.export_onnx(model, path, input_shape=input_shape, opset=opset)
    for batch in batches:
        x = random_batch(input_shape, batch, seed=seed + batch)
        with eo.no_grad():
            expected = np.asarray(model(eo.tensor(x)).data)
        actual = eo.run_onnx(path, x)
        assert actual.shape == expected.shape, (batch, actual.shape, expected.shape)
        np.testing.assert_allclose(actual, expected, rtol=0, atol=ATOL, err_msg=f"batch {batch}")
    return onnx.load(str(path))


def _runtime_loads(opset):
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "probe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    ids = [helper.make_opsetid("", opset)]
    model = helper.make_model(graph, opset_imports=ids, ir_version=helper.find_min_ir_version_for(ids))
    try:
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception:
        return False
    return True


@pytest.fixture(scope="session")
def newest_runtime_opset():
    """The newest opset the installed ONNX Runtime loads, found with a one-node
    probe graph (independent of the exporter, so an exporter bug at that
    opset cannot lower it)."""
    for opset in range(onnx.defs.onnx_opset_version(), MIN_OPSET - 1, -1):
        if _runtime_loads(opset):
            return opset
    pytest.fail(f"onnxruntime {ort.__version__} loads no opset >= {MIN_OPSET}")
