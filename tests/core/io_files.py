"""Helpers for the checkpoint tests: build archives by hand (with lying
manifests, odd members, compression) and compare loaded states exactly."""

import io
import json
import math
import zipfile

import numpy as np

MANIFEST = "__everyo_manifest__.npy"


def npy_bytes(array):
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.asanyarray(array), allow_pickle=False)
    return buf.getvalue()


def manifest_array(meta):
    raw = meta if isinstance(meta, bytes) else json.dumps(meta).encode()
    return np.frombuffer(raw, dtype=np.uint8)


def archive(meta, members, compression=zipfile.ZIP_STORED):
    """Zip bytes with the manifest ``meta`` (dict or raw bytes) and ``members``
    (name -> array, or name -> raw bytes)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=compression) as z:
        if meta is not None:
            z.writestr(MANIFEST, npy_bytes(manifest_array(meta)))
        for name, value in members.items():
            z.writestr(name, value if isinstance(value, bytes) else npy_bytes(value))
    return buf.getvalue()


def meta(tree, version=2):
    return {"format": "everyo-checkpoint", "version": version, "tree": tree}


def array_node(i, array, **extra):
    array = np.asarray(array)
    return {"t": "array", "i": i, "dtype": array.dtype.str, "shape": list(array.shape), **extra}


def same(a, b):
    """Exact equality of loaded states: types, key order, dtypes, shapes, bits."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, (np.ndarray, np.generic)):
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return a == b
