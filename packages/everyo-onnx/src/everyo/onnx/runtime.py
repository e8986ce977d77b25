"""Run an exported file in ONNX Runtime; report whether onnx is importable."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from everyo._typing import Array, TensorLike

INSTALL_HINT = "Install it with: pip install everyo-core[onnx]"


def onnx_available() -> bool:
    """True when the ``onnx`` package can be imported (export_onnx needs it)."""
    try:
        import onnx  # noqa: F401
    except ImportError:
        return False
    return True


def import_runtime(purpose="run_onnx"):
    """``import onnxruntime``, telling "not installed" apart from "installed but broken"."""
    try:
        import onnxruntime
    except ImportError as exc:
        from importlib import metadata

        try:
            version = metadata.version("onnxruntime")
        except metadata.PackageNotFoundError:
            raise ImportError(f"{purpose} needs onnxruntime, which is not installed. {INSTALL_HINT}") from exc
        raise ImportError(
            f"{purpose} needs onnxruntime: version {version} is installed but failed to import: {exc}. "
            f"onnxruntime >= 1.19 is needed under NumPy 2 (pip install -U 'onnxruntime>=1.19')"
        ) from exc
    return onnxruntime


_NUMPY_OF = {
    "tensor(float)": np.float32,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(bool)": np.bool_,
}


# One output: an array; several: a list of arrays. "| Any" (typeshed's way for a
# result only the file decides) so that callers need not narrow the union.
def run_onnx(path: str | os.PathLike[str], *inputs: TensorLike) -> Array | Any:
    """Run the ONNX file at ``path`` on ``inputs`` with ONNX Runtime (CPU).

    Args:
        path: the file.
        *inputs: one array or Tensor per graph input, in the graph's order.
            Floating input is cast to a float graph input's float32; integer
            and boolean inputs are passed as they are (token ids stay integers).

    Returns the output as a NumPy array, or a list of arrays if the graph has
    several outputs.

    Example (reads exported files, so not run as a doctest)::

        logits = eo.run_onnx("model.onnx", batch)
        tokens_out, state = eo.run_onnx("lm.onnx", ids, mask)
    """
    ort = import_runtime()
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"run_onnx: no ONNX file at {path!r}")
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    graph_inputs = session.get_inputs()
    if len(inputs) != len(graph_inputs):
        raise ValueError(
            f"run_onnx: {path!r} takes {len(graph_inputs)} input(s) {[i.name for i in graph_inputs]}, got {len(inputs)}"
        )
    feeds = {}
    for spec, x in zip(graph_inputs, inputs):
        array = np.asarray(getattr(x, "data", x))
        want = _NUMPY_OF.get(spec.type)
        if want is np.float32 and np.issubdtype(array.dtype, np.floating):
            array = array.astype(np.float32, copy=False)
        elif want is not None and array.dtype.kind in "iu" and np.dtype(want).kind == "i":
            array = array.astype(want, copy=False)
        feeds[spec.name] = array
    outputs = session.run(None, feeds)
    return outputs[0] if len(outputs) == 1 else outputs
