"""ONNX export for EveryO models by tracing, verified against ONNX Runtime.

    eo.export_onnx(model, "model.onnx", input_shape=(1, 8, 8, 1), output_name="logits")
    eo.run_onnx("model.onnx", batch)
    eo.verify_onnx(model, "model.onnx", batch)
    fast = eo.onnx.compile(model, batch[:1])   # ONNX Runtime behind the model's call signature

Importing this package does not import onnx or onnxruntime: ``onnx_available``
must work without them, and each function imports what it needs.
"""

from everyo.onnx._version import __version__  # noqa: F401
from everyo.onnx.engine import CompiledModel, EveryOWeightsChangedError, compile
from everyo.onnx.export import DEFAULT_OPSET, MIN_OPSET, build_model, export_onnx, verify_onnx
from everyo.onnx.runtime import onnx_available, run_onnx
from everyo.onnx.verify import format_report

__all__ = [
    "export_onnx",
    "build_model",
    "run_onnx",
    "verify_onnx",
    "format_report",
    "compile",
    "CompiledModel",
    "EveryOWeightsChangedError",
    "onnx_available",
    "DEFAULT_OPSET",
    "MIN_OPSET",
]
