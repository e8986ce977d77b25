"""The checkpoint manifest: the JSON tree of dicts, lists, tuples, numbers,
strings and None that holds a state's structure, with every array replaced by
a node naming its archive member, dtype and shape.

Saving builds the tree (:func:`encode`); loading checks every field of it
before anything is read (:func:`parse`) and then puts the arrays back in
(:func:`decode`). A manifest is data from a file, so nothing in it is trusted:
types, nesting depth, array indices and sizes are all validated, and any
problem is an :class:`~everyo.errors.EveryOSerializationError`.
"""

import json
import math
import re

import numpy as np

from everyo.errors import EveryOSerializationError
from everyo.tensor import Tensor

MAGIC = "everyo-checkpoint"
VERSION = 2  # 2 records each array's dtype and shape; version 1 (EveryO 0.1) is still read
MAX_DEPTH = 64  # nesting of dicts/lists; state dicts use about 5
MAX_NDIM = 64  # NumPy's own limit
MAX_ARRAY_BYTES = 1 << 46  # 64 TiB: anything larger is a lie, whatever the file says
BFLOAT16 = "bfloat16"
# NumPy dtype strings a checkpoint may hold: bool, ints, floats, complex, bytes, unicode.
_DTYPE_RE = re.compile(r"[<>|][biufcSU][1-9][0-9]{0,5}")
_FLOAT_WORDS = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}


# --- saving ---------------------------------------------------------------------
def storable(array, where):
    """The dtype string for the manifest and the array to write for ``array``.

    bfloat16 (``ml_dtypes.bfloat16``, recognised by name: core does not import
    ml_dtypes) is written as its raw uint16 bits.
    """
    if isinstance(array, np.ma.MaskedArray):
        raise EveryOSerializationError(
            f"eo.save: {where} is a masked array; checkpoints do not store masks, and saving only the "
            f"data would lose it silently. Save the parts, e.g. {{'data': a.filled(0), 'mask': np.ma.getmaskarray(a)}}"
        )
    array = np.asarray(array)
    dtype = array.dtype
    if dtype.kind == "V" and dtype.name == BFLOAT16 and dtype.itemsize == 2:
        return BFLOAT16, array.view(np.uint16)
    if dtype.hasobject:
        raise EveryOSerializationError(f"eo.save: {where} is an object array, which cannot be saved without pickle")
    if dtype.byteorder == "=":
        dtype = dtype.newbyteorder("<" if np.little_endian else ">")
    if not _DTYPE_RE.fullmatch(dtype.str):
        raise EveryOSerializationError(
            f"eo.save: {where} has dtype {array.dtype} ({dtype.str}); checkpoints hold bool, integer, "
            f"floating, complex, bytes and str arrays and bfloat16; convert it (e.g. a.astype('float32'))"
        )
    return dtype.str, array


def encode(obj, arrays, where, depth=0):
    """The manifest node for ``obj``; arrays to write are appended to ``arrays``."""
    if depth > MAX_DEPTH:
        raise EveryOSerializationError(
            f"eo.save: {where} is nested more than {MAX_DEPTH} levels deep; checkpoints allow at most {MAX_DEPTH}"
        )
    if isinstance(obj, Tensor):
        obj = obj.data
    if isinstance(obj, (np.ndarray, np.generic)):
        dtype, array = storable(obj, where)
        arrays.append(array)
        node = {"t": "array", "i": len(arrays) - 1, "dtype": dtype, "shape": list(array.shape)}
        if isinstance(obj, np.generic):
            node["scalar"] = True
        return node
    if obj is None or isinstance(obj, (bool, str)):
        return {"t": "value", "v": obj}
    if isinstance(obj, (int, float)):
        if isinstance(obj, float) and not math.isfinite(obj):
            return {"t": "float", "v": repr(obj)}
        return {"t": "value", "v": obj}
    if isinstance(obj, dict):
        for k in obj:
            if not isinstance(k, str):
                raise EveryOSerializationError(f"eo.save: {where} has a non-string key {k!r}; use string keys")
        return {"t": "dict", "items": [[k, encode(v, arrays, f"{where}[{k!r}]", depth + 1)] for k, v in obj.items()]}
    if isinstance(obj, (list, tuple)):
        kind = "tuple" if isinstance(obj, tuple) else "list"
        return {"t": kind, "items": [encode(v, arrays, f"{where}[{i}]", depth + 1) for i, v in enumerate(obj)]}
    raise EveryOSerializationError(
        f"eo.save: {where} has type {type(obj).__name__}; checkpoints hold dicts, lists, tuples, "
        f"NumPy arrays, Tensors, numbers, strings and None"
    )


def dumps(tree):
    try:
        return json.dumps({"format": MAGIC, "version": VERSION, "tree": tree}, allow_nan=False).encode("utf-8")
    except ValueError as exc:  # e.g. an int of more than 4300 digits
        raise EveryOSerializationError(f"eo.save: a value cannot be written to the manifest: {exc}") from None


# --- loading --------------------------------------------------------------------
class ArraySpec:
    """What the manifest says about one array: member index, dtype, shape (None in version 1)."""

    __slots__ = ("index", "dtype", "shape", "scalar", "value")

    def __init__(self, index, dtype, shape, scalar):
        self.index, self.dtype, self.shape, self.scalar, self.value = index, dtype, shape, scalar, None

    @property
    def nbytes(self):
        return math.prod(self.shape) * storage_dtype(self.dtype).itemsize


def storage_dtype(dtype_str):
    """The NumPy dtype an array with manifest dtype ``dtype_str`` is stored as."""
    return np.dtype("<u2") if dtype_str == BFLOAT16 else np.dtype(dtype_str)


def check_dtype_string(value, fail, where):
    if not isinstance(value, str) or not (value == BFLOAT16 or _DTYPE_RE.fullmatch(value)):
        fail(f"{where} has dtype {value!r}, which is not a dtype EveryO checkpoints hold")
    return value


def check_shape(value, fail, where):
    if not isinstance(value, (list, tuple)) or len(value) > MAX_NDIM:
        fail(f"{where} has shape {value!r}; a shape is a list of at most {MAX_NDIM} sizes")
    for n in value:
        if type(n) is not int or n < 0:
            fail(f"{where} has shape {value!r}; sizes must be non-negative integers")
    return tuple(value)


def _refuse_constant(word):
    # eo.save writes NaN and infinities as "float" nodes, never as JSON's non-standard constants.
    raise ValueError(f"non-standard JSON constant {word}")


def parse(raw, fail):
    """Validate the manifest bytes; returns ``(version, tree, specs)`` where
    ``specs`` lists the :class:`ArraySpec` of every array, by member index.
    ``fail(message)`` raises the caller's error."""
    try:
        meta = json.loads(raw.decode("utf-8"), parse_constant=_refuse_constant)
    except RecursionError:
        fail("the manifest is nested too deeply")
    except (UnicodeDecodeError, ValueError) as exc:
        fail(f"the manifest is not valid JSON ({exc})")
    if not isinstance(meta, dict) or meta.get("format") != MAGIC:
        fail("the manifest is not an EveryO manifest")
    version = meta.get("version")
    if type(version) is not int or version not in (1, VERSION):
        fail(f"it is an EveryO checkpoint of format version {version!r}; this EveryO reads versions 1 and {VERSION}")
    if set(meta) != {"format", "version", "tree"}:
        fail(f"the manifest has unexpected fields {sorted(set(meta) - {'format', 'version', 'tree'})}")
    specs = {}
    _check_node(meta["tree"], version, specs, fail, "state", 0)
    if sorted(specs) != list(range(len(specs))):
        fail(f"the manifest's array indices {sorted(specs)} are not 0..{len(specs) - 1}")
    return version, meta["tree"], [specs[i] for i in range(len(specs))]


def _check_node(node, version, specs, fail, where, depth):
    if depth > MAX_DEPTH:
        fail(f"the manifest nests more than {MAX_DEPTH} levels deep (at {where})")
    if not isinstance(node, dict) or not isinstance(node.get("t"), str):
        fail(f"the manifest entry for {where} is not a node")
    kind, keys = node["t"], set(node)
    if kind == "array":
        allowed = {"t", "i", "scalar"} | ({"dtype", "shape"} if version >= 2 else set())
        required = allowed - {"scalar"}
        if not required <= keys <= allowed:
            fail(f"the manifest's array node for {where} has fields {sorted(keys)}; expected {sorted(required)}")
        index, scalar = node["i"], node.get("scalar", False)
        if type(index) is not int or index < 0 or type(scalar) is not bool:
            fail(f"the manifest's array node for {where} has a bad index {index!r} or scalar flag {scalar!r}")
        if index in specs:
            fail(f"the manifest uses array {index} twice (again at {where})")
        dtype = shape = None
        if version >= 2:
            dtype = check_dtype_string(node["dtype"], fail, where)
            shape = check_shape(node["shape"], fail, where)
            if scalar and shape:
                fail(f"the manifest marks {where} as a scalar but gives shape {list(shape)}")
            spec = ArraySpec(index, dtype, shape, scalar)
            if spec.nbytes > MAX_ARRAY_BYTES:
                fail(f"{where} declares {spec.nbytes} bytes, more than any checkpoint can hold")
        specs[index] = ArraySpec(index, dtype, shape, scalar)
    elif kind == "value":
        if keys != {"t", "v"} or type(node["v"]) not in (type(None), bool, int, float, str):
            fail(f"the manifest's value node for {where} is malformed")
    elif kind == "float":
        if keys != {"t", "v"} or not isinstance(node["v"], str) or node["v"] not in _FLOAT_WORDS:
            fail(f"the manifest's float node for {where} is malformed")
    elif kind in ("dict", "list", "tuple"):
        items = node.get("items")
        if keys != {"t", "items"} or not isinstance(items, list):
            fail(f"the manifest's {kind} node for {where} is malformed")
        if kind == "dict":
            seen = set()
            for item in items:
                if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)) or item[0] in seen:
                    fail(f"the manifest's dict node for {where} has a malformed or repeated key")
                seen.add(item[0])
                _check_node(item[1], version, specs, fail, f"{where}[{item[0]!r}]", depth + 1)
        else:
            for i, item in enumerate(items):
                _check_node(item, version, specs, fail, f"{where}[{i}]", depth + 1)
    else:
        fail(f"the manifest entry for {where} has unknown type {kind!r}")


def decode(node, specs):
    """The state described by a tree that :func:`parse` accepted, arrays filled in."""
    kind = node["t"]
    if kind == "array":
        spec = specs[node["i"]]
        return spec.value[()] if spec.scalar else spec.value
    if kind == "value":
        return node["v"]
    if kind == "float":
        return _FLOAT_WORDS[node["v"]]
    if kind == "dict":
        return {k: decode(v, specs) for k, v in node["items"]}
    items = [decode(v, specs) for v in node["items"]]
    return items if kind == "list" else tuple(items)
