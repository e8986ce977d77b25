"""Run an exported file in ONNX Runtime; report whether onnx is importable."""
import os

import numpy as np

INSTALL_HINT = "Install it with: pip install everyo-core[onnx]"


def onnx_available():
    """True when the ``onnx`` package can be imported (export_onnx needs it)."""
    try:
        import onnx  # noqa: F401
    except ImportError:
        return False
    return True


def run_onnx(path, batch):
    """Run the ONNX file at ``path`` on ``batch`` with ONNX Runtime (CPU).

    ``batch`` is a NumPy array or an EveryO Tensor; floating input is cast to
    the graph's input type (float32). Returns the output as a NumPy array, or
    a list of arrays if the graph has several outputs.
    """
    try:
        import onnxruntime as ort
    except ImportError as exc:
        raise ImportError(f"run_onnx needs onnxruntime, which is not installed. {INSTALL_HINT}") from exc
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"run_onnx: no ONNX file at {path!r}")
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    inputs = session.get_inputs()
    if len(inputs) != 1:
        raise ValueError(f"run_onnx feeds one input; {path!r} has {len(inputs)}: {[i.name for i in inputs]}")
    array = np.asarray(getattr(batch, "data", batch))
    if inputs[0].type == "tensor(float)" and np.issubdtype(array.dtype, np.floating):
        array = array.astype(np.float32, copy=False)
    outputs = session.run(None, {inputs[0].name: array})
    return outputs[0] if len(outputs) == 1 else outputs
