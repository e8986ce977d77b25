"""Checkpoints without pickle: ``eo.save`` / ``eo.load``.

The file is a NumPy ``.npz`` archive: every array is stored under a numbered
key, and a JSON manifest (stored as a uint8 array) records the nested
structure of dicts, lists, numbers, strings and None around them. Loading
uses ``allow_pickle=False``, so a file can never execute code. Writes go to a
temporary file in the same folder, are flushed to disk, then renamed over the
target, so a crash leaves either the old file or the new one, never half.
"""
import json
import os
import tempfile
import zipfile

import numpy as np

from everyo.errors import EveryOSerializationError
from everyo.half import is_bfloat16
from everyo.tensor import Tensor

_MAGIC = "everyo-checkpoint"
_VERSION = 1
_MANIFEST = "__everyo_manifest__"


def _encode(obj, arrays, where):
    if isinstance(obj, Tensor):
        obj = obj.data
    if isinstance(obj, np.ndarray):
        if obj.dtype.hasobject:
            raise EveryOSerializationError(f"eo.save: {where} is an object array, which cannot be saved without pickle")
        if is_bfloat16(obj.dtype):  # .npy cannot name ml_dtypes' type: keep the codes, say what they are
            arrays.append(obj.view(np.uint16))
            return {"t": "array", "i": len(arrays) - 1, "dtype": "bfloat16"}
        arrays.append(obj)
        return {"t": "array", "i": len(arrays) - 1}
    if isinstance(obj, np.generic):
        node = _encode(np.asarray(obj), arrays, where)
        node["scalar"] = True
        return node
    if obj is None or isinstance(obj, (bool, str)):
        return {"t": "value", "v": obj}
    if isinstance(obj, (int, float)):
        if isinstance(obj, float) and not np.isfinite(obj):
            return {"t": "float", "v": repr(obj)}
        return {"t": "value", "v": obj}
    if isinstance(obj, dict):
        for k in obj:
            if not isinstance(k, str):
                raise EveryOSerializationError(f"eo.save: {where} has a non-string key {k!r}; use string keys")
        return {"t": "dict", "items": [[k, _encode(v, arrays, f"{where}[{k!r}]")] for k, v in obj.items()]}
    if isinstance(obj, (list, tuple)):
        return {"t": type(obj).__name__, "items": [_encode(v, arrays, f"{where}[{i}]") for i, v in enumerate(obj)]}
    raise EveryOSerializationError(
        f"eo.save: {where} has type {type(obj).__name__}; checkpoints hold dicts, lists, tuples, "
        f"NumPy arrays, Tensors, numbers, strings and None"
    )


def _decode(node, arrays):
    kind = node["t"]
    if kind == "array":
        a = arrays[node["i"]]
        if node.get("dtype") == "bfloat16":
            a = a.view(_bfloat16())
        return a[()] if node.get("scalar") else a
    if kind == "value":
        return node["v"]
    if kind == "float":
        return float(node["v"])
    if kind == "dict":
        return {k: _decode(v, arrays) for k, v in node["items"]}
    if kind in ("list", "tuple"):
        items = [_decode(v, arrays) for v in node["items"]]
        return items if kind == "list" else tuple(items)
    raise ValueError(f"unknown node type {kind!r}")


def _bfloat16():
    try:
        import ml_dtypes  # only for a checkpoint that holds bfloat16 arrays
    except ImportError:
        raise EveryOSerializationError(
            "this checkpoint holds bfloat16 arrays; reading them needs the ml_dtypes package "
            "(pip install ml_dtypes, or everyo-amp)"
        ) from None
    return np.dtype(ml_dtypes.bfloat16)


def atomic_write(path, write):
    """Call ``write(file)`` on a temporary file beside ``path``, flush it to disk,
    then rename it over ``path``: readers see the old file or the complete new
    one, never a partial one, and a failure leaves no temporary behind.

    Shared by checkpoints and the ONNX exporter.
    """
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"cannot write {path!r}: folder {folder!r} does not exist")
    fd, tmp = tempfile.mkstemp(dir=folder, prefix="." + os.path.basename(path) + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def save(state, path):
    """Save ``state`` (e.g. ``{'model': model.state_dict(), 'optimizer': opt.state_dict()}``) atomically."""
    path = os.fspath(path)
    arrays = []
    tree = _encode(state, arrays, "state")
    manifest = json.dumps({"format": _MAGIC, "version": _VERSION, "tree": tree})
    payload = {f"a{i}": a for i, a in enumerate(arrays)}
    payload[_MANIFEST] = np.frombuffer(manifest.encode("utf-8"), dtype=np.uint8)
    atomic_write(path, lambda f: np.savez(f, **payload))


def load(path):
    """Load a checkpoint written by :func:`save`. Never unpickles.

    Raises:
        EveryOSerializationError: the file is missing, truncated, corrupt, or
            not an EveryO checkpoint.
    """
    path = os.fspath(path)
    try:
        with np.load(path, allow_pickle=False) as archive:
            if _MANIFEST not in archive.files:
                raise EveryOSerializationError(
                    f"{path} is a NumPy archive but not an EveryO checkpoint (no manifest); "
                    f"was it written by eo.save?"
                )
            meta = json.loads(archive[_MANIFEST].tobytes().decode("utf-8"))
            if meta.get("format") != _MAGIC:
                raise EveryOSerializationError(f"{path} is not an EveryO checkpoint")
            if meta.get("version") != _VERSION:
                raise EveryOSerializationError(
                    f"{path} is an EveryO checkpoint of format version {meta.get('version')}; "
                    f"this EveryO reads version {_VERSION}"
                )
            arrays = [archive[f"a{i}"] for i in range(len(archive.files) - 1)]
            return _decode(meta["tree"], arrays)
    except EveryOSerializationError:
        raise
    except FileNotFoundError:
        raise EveryOSerializationError(f"checkpoint {path} does not exist") from None
    except (zipfile.BadZipFile, ValueError, KeyError, OSError, EOFError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise EveryOSerializationError(
            f"cannot read checkpoint {path}: the file is truncated, corrupt or not an EveryO "
            f"checkpoint ({type(exc).__name__}: {exc})"
        ) from exc
