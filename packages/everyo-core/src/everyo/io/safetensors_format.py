"""``.safetensors`` files through the optional ``safetensors`` package.

safetensors holds a flat mapping of names to arrays, and text metadata. A
nested state dict (``{'model': {...}, 'ema': {...}}``) is flattened with
dotted keys (``model.0.weight``), which is how PyTorch and Hugging Face name
weights; the nesting itself is recorded in the metadata under
``everyo.tree``, so ``eo.load`` gives back exactly the dicts that were saved
(a file written elsewhere loads as a flat dict). Only arrays can be stored:
other values (numbers, strings, None, lists) are refused, not squeezed into
text metadata, so nothing comes back with a different type; save those in an
``.npz`` checkpoint. bfloat16 arrays are written as safetensors' ``BF16``
without core importing ml_dtypes.
"""

import json
import math
import os
import struct

import numpy as np

from everyo.errors import EveryOSerializationError
from everyo.io import manifest
from everyo.io.atomic import atomic_write
from everyo.tensor import Tensor

TREE_KEY = "everyo.tree"
# safetensors dtype code <-> NumPy dtype name (bfloat16: stored as its uint16 bits here).
_CODES = {
    "BOOL": "bool",
    "U8": "uint8",
    "I8": "int8",
    "U16": "uint16",
    "I16": "int16",
    "U32": "uint32",
    "I32": "int32",
    "U64": "uint64",
    "I64": "int64",
    "F16": "float16",
    "F32": "float32",
    "F64": "float64",
    "C64": "complex64",
    "BF16": manifest.BFLOAT16,
}
_INSTALL_HINT = "install it with: pip install everyo-core[safetensors]"


def _package(path, doing):
    try:
        import safetensors
    except ImportError:
        raise EveryOSerializationError(
            f"{doing} {path} needs the safetensors package, which is not installed; {_INSTALL_HINT}"
        ) from None
    return safetensors


# --- saving ---------------------------------------------------------------------
def _flatten(state, prefix, flat, where, depth):
    """Fill ``flat`` (dotted name -> array) and return the tree of names."""
    if depth > manifest.MAX_DEPTH:
        raise EveryOSerializationError(f"eo.save: {where} is nested more than {manifest.MAX_DEPTH} levels deep")
    tree = {}
    for key, value in state.items():
        if not isinstance(key, str):
            raise EveryOSerializationError(f"eo.save: {where} has a non-string key {key!r}; use string keys")
        name = f"{prefix}.{key}" if prefix else key
        inner = f"{where}[{key!r}]"
        if isinstance(value, dict):
            tree[key] = _flatten(value, name, flat, inner, depth + 1)
            continue
        if isinstance(value, Tensor):
            value = value.data
        if not isinstance(value, np.ndarray):
            raise EveryOSerializationError(
                f"eo.save: {inner} has type {type(value).__name__}; a .safetensors file holds only arrays "
                f"(nested dicts of arrays or Tensors). Save other values in an .npz checkpoint"
            )
        if name in flat:
            raise EveryOSerializationError(
                f"eo.save: two entries flatten to the same safetensors name {name!r}; rename one of them"
            )
        flat[name] = value
        tree[key] = name
    return tree


def _spec(safetensors, name, array, keep_alive):
    dtype_str, array = manifest.storable(array, f"state entry {name!r}")
    if dtype_str == manifest.BFLOAT16:
        code = "bfloat16"
    elif array.dtype.name in _CODES.values():
        code = array.dtype.name
    else:
        raise EveryOSerializationError(
            f"eo.save: entry {name!r} has dtype {array.dtype}, which safetensors cannot hold; "
            f"it holds {', '.join(sorted(set(_CODES.values())))}"
        )
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    if not array.flags.c_contiguous:
        array = array.copy(order="C")  # (np.ascontiguousarray would turn a 0-d array into 1-d)
    keep_alive.append(array)
    return safetensors.TensorSpec(dtype=code, shape=array.shape, data_ptr=array.ctypes.data, data_len=array.nbytes)


def write(state, path):
    if not isinstance(state, dict):
        raise EveryOSerializationError(
            f"eo.save: a .safetensors file holds a dict of arrays; got {type(state).__name__}"
        )
    flat = {}
    tree = _flatten(state, "", flat, "state", 0)
    safetensors = _package(os.fspath(path), "saving")
    keep_alive = []
    specs = {name: _spec(safetensors, name, array, keep_alive) for name, array in flat.items()}
    data = bytes(safetensors.serialize(specs, metadata={TREE_KEY: json.dumps(tree)}))
    atomic_write(path, lambda f: f.write(data))


# --- loading --------------------------------------------------------------------
def read_flat(path):
    """``(tensors, metadata)``: name -> array in file order, and the text metadata (or {})."""
    path = os.fspath(path)
    safetensors = _package(path, "loading")

    def fail(what):
        raise EveryOSerializationError(f"cannot load safetensors file {path}: {what}")

    if not os.path.exists(path):
        raise EveryOSerializationError(f"safetensors file {path} does not exist")
    try:
        # safe_open checks the header against the file: offsets contiguous, sizes equal to
        # dtype x shape, the whole file covered. Reading then needs no trust in it.
        with safetensors.safe_open(path, framework="numpy") as handle:
            metadata = handle.metadata() or {}
    except Exception as exc:  # the Rust parser raises SafetensorError, or OSError/ValueError through PyO3
        fail(f"the file is truncated, corrupt or not a safetensors file ({type(exc).__name__}: {exc})")
    tensors = {}
    try:
        with open(path, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
            for name, info in header.items():
                if name != "__metadata__":
                    tensors[name] = _read_tensor(f, 8 + length, name, info, fail, path)
    except (OSError, ValueError, struct.error) as exc:  # the file changed since it was checked
        fail(f"the file changed while it was read ({type(exc).__name__}: {exc})")
    return tensors, metadata


def _read_tensor(f, base, name, info, fail, path):
    code, shape, (start, end) = info["dtype"], info["shape"], info["data_offsets"]
    if code not in _CODES:
        fail(f"tensor {name!r} has dtype {code}, which EveryO does not read")
    stored = manifest.storage_dtype(_CODES[code])
    count = math.prod(shape)
    if end - start != count * stored.itemsize:
        fail(f"tensor {name!r} has {end - start} bytes for shape {shape} of {code}")
    f.seek(base + start)
    array = np.fromfile(f, dtype=stored, count=count)
    if array.size != count:
        fail(f"tensor {name!r} ends early (truncated)")
    array = array.reshape(shape)
    return _bfloat16(array, path) if code == "BF16" else array


def _bfloat16(bits, path):
    try:
        import ml_dtypes
    except ImportError:
        raise EveryOSerializationError(
            f"safetensors file {path} holds bfloat16 tensors, which need the ml_dtypes package to load; "
            f"install it with: pip install everyo-core[amp]"
        ) from None
    return bits.view(ml_dtypes.bfloat16)


def read(path):
    tensors, metadata = read_flat(path)
    if TREE_KEY not in metadata:
        return tensors

    def fail(what):
        raise EveryOSerializationError(f"cannot load safetensors file {path}: its {TREE_KEY} metadata {what}")

    try:
        tree = json.loads(metadata[TREE_KEY])
    except (ValueError, RecursionError):
        fail("is not valid JSON")
    used = set()
    state = _unflatten(tree, tensors, used, fail, 0)
    if used != set(tensors):
        fail(f"does not mention tensors {sorted(set(tensors) - used)}")
    return state


def _unflatten(tree, tensors, used, fail, depth):
    if not isinstance(tree, dict) or depth > manifest.MAX_DEPTH:
        fail("is malformed (not a dict of dicts and names, or nested too deeply)")
    out = {}
    for key, value in tree.items():
        if isinstance(value, str):
            if value not in tensors or value in used:
                fail(f"names tensor {value!r}, which the file does not hold or which it names twice")
            used.add(value)
            out[key] = tensors[value]
        else:
            out[key] = _unflatten(value, tensors, used, fail, depth + 1)
    return out
