"""Run an exported file in ONNX Runtime; report whether onnx is importable."""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import numpy as np

from everyo.tensor import Tensor

if TYPE_CHECKING:
    from everyo._typing import Array

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
    "tensor(float)": np.dtype(np.float32),
    "tensor(int64)": np.dtype(np.int64),
    "tensor(int32)": np.dtype(np.int32),
    "tensor(bool)": np.dtype(np.bool_),
}


def as_feed(x, want):
    """``x`` as the array a graph input of dtype ``want`` takes (None:
    unknown): floating input cast to float32, integers to the input's integer
    type, anything else passed as it is (ONNX Runtime names a wrong type)."""
    array = x.data if isinstance(x, Tensor) else np.asarray(x)
    dtype = array.dtype
    if dtype is want or want is None:  # (NumPy's builtin dtypes are singletons)
        return array
    if (want.kind == "f" and dtype.kind == "f") or (want.kind == "i" and dtype.kind in "iu"):
        return array.astype(want)
    return array


def feeds(graph_inputs, leaves, who):
    """``{name: array}`` for a session's inputs from the flat ``leaves``."""
    if len(leaves) != len(graph_inputs):
        raise ValueError(
            f"{who} takes {len(graph_inputs)} input(s) {[i.name for i in graph_inputs]}, got {len(leaves)}"
        )
    return {spec.name: as_feed(x, _NUMPY_OF.get(spec.type)) for spec, x in zip(graph_inputs, leaves)}


def nesting_of(session):
    """The ``(inputs, outputs)`` nesting specs recorded in a session's file
    (:mod:`everyo.onnx.nesting`), or ``None`` each for files without them."""
    from everyo.onnx import nesting

    meta = session.get_modelmeta().custom_metadata_map
    return nesting.from_json(meta.get(nesting.INPUTS_KEY)), nesting.from_json(meta.get(nesting.OUTPUTS_KEY))


# Sessions run_onnx made, by absolute path: (file identity, session). A file
# is identified by (mtime_ns, size, inode): a rewrite (export_onnx replaces
# the file atomically, so the inode changes) makes a new session.
_SESSIONS: OrderedDict[str, tuple[tuple[int, int, int], Any]] = OrderedDict()
_SESSIONS_KEPT = 8
_SESSIONS_LOCK = threading.Lock()


def _session(ort, path):
    st = os.stat(path)
    key, identity = os.path.abspath(path), (st.st_mtime_ns, st.st_size, st.st_ino)
    with _SESSIONS_LOCK:
        entry = _SESSIONS.get(key)
        if entry is not None and entry[0] == identity:
            _SESSIONS.move_to_end(key)
            return entry[1]
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    with _SESSIONS_LOCK:
        _SESSIONS[key] = (identity, session)
        _SESSIONS.move_to_end(key)
        while len(_SESSIONS) > _SESSIONS_KEPT:
            _SESSIONS.popitem(last=False)
    return session


# One output: an array; several: a list of arrays. "| Any" (typeshed's way for a
# result only the file decides) so that callers need not narrow the union.
def run_onnx(path: str | os.PathLike[str], *inputs: Any) -> Array | Any:
    """Run the ONNX file at ``path`` on ``inputs`` with ONNX Runtime (CPU).

    Args:
        path: the file.
        *inputs: ``forward()``'s arguments, nested as the model was exported
            (``run_onnx(path, ids, (h0, c0))``), or one array or Tensor per
            graph input in the graph's order. Floating input is cast to a
            float graph input's float32; integer and boolean inputs are passed
            as they are (token ids stay integers).

    Returns what the model's ``forward`` returned, as NumPy arrays nested the
    same way (for files exported by EveryO, which record the nesting: a
    ``None`` output comes back as ``None``, a dict as a dict); for other
    files, the output array, or a list of arrays if the graph has several.

    The session is made once per file and reused while the file is
    unchanged (same modification time, size and inode); the 8 most recently
    used are kept.

    Example (reads exported files, so not run as a doctest)::

        logits = eo.run_onnx("model.onnx", batch)
        log_probs, (h, c) = eo.run_onnx("lm.onnx", ids, (h0, c0))
    """
    from everyo.onnx import nesting

    ort = import_runtime()
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"run_onnx: no ONNX file at {path!r}")
    session = _session(ort, path)
    in_spec, out_spec = nesting_of(session)
    leaves = list(inputs) if in_spec is None else nesting.call_inputs(in_spec, inputs, f"run_onnx({path!r})")
    outputs = session.run(None, feeds(session.get_inputs(), leaves, f"run_onnx: {path!r}"))
    if out_spec is not None:
        return nesting.unflatten(out_spec, iter(outputs))
    return outputs[0] if len(outputs) == 1 else outputs
