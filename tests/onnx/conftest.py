"""Fixtures for the ONNX tests (helpers live in onnx_agreement.py)."""

import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from everyo.onnx import MIN_OPSET


def _runtime_loads(opset):
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "probe",
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
