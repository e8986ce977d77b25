"""Nested inputs and outputs, as ``torch.onnx.export`` takes them.

An ONNX graph has a flat list of inputs and of outputs; a model's
``forward(ids, (h0, c0))`` takes, and may return, tuples, lists and dicts
of Tensors. The exporter flattens them in order (a dict by sorted key) and
records the nesting as a *spec*, a small JSON value kept in the file's
metadata (``everyo.inputs``, ``everyo.outputs``), so that ``run_onnx`` and
the compiled callable take and return the same nesting:

- ``0``: one Tensor (the next leaf);
- ``null``: ``None`` (an output ``None`` is dropped from the graph and put back);
- ``{"tuple": [...]}``, ``{"list": [...]}``: a tuple or list of specs;
- ``{"dict": [[key, spec], ...]}``: a dict with string keys, by sorted key.

A tuple (at any depth) is always a container. A list is a container when
its items are Tensors, arrays or containers; a list of numbers (or of lists
of numbers) is one array.
Nothing is ever stacked: ``(ids, (h0, c0))`` is three graph inputs.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import numpy as np

from everyo.errors import EveryOSerializationError
from everyo.onnx.symbolic import SymInt
from everyo.tensor import Tensor

LEAF = 0
INPUTS_KEY = "everyo.inputs"
OUTPUTS_KEY = "everyo.outputs"


def _is_container_list(obj):
    """A list holding Tensors, arrays, tuples, dicts or such lists; a list of
    numbers (or of lists of numbers) is one array."""
    return isinstance(obj, list) and any(
        isinstance(i, (Tensor, np.ndarray, tuple, Mapping)) or _is_container_list(i) for i in obj
    )


def flatten(obj, leaves, what="example_input", where=""):
    """Append ``obj``'s leaves to ``leaves`` in order; return its spec.
    ``None`` is kept as ``null``; any other non-container is a leaf."""
    if isinstance(obj, tuple) or _is_container_list(obj):
        kind = "tuple" if isinstance(obj, tuple) else "list"
        return {kind: [flatten(item, leaves, what, f"{where}[{k}]") for k, item in enumerate(obj)]}
    if isinstance(obj, Mapping):
        if not all(isinstance(k, str) for k in obj):
            raise TypeError(f"{what}{where} is a dict with keys {list(obj)!r}; only string keys can be flattened")
        return {"dict": [[k, flatten(obj[k], leaves, what, f"{where}[{k!r}]")] for k in sorted(obj)]}
    if obj is None:
        return None
    leaves.append(obj)
    return LEAF


def unflatten(spec, leaves):
    """The nesting ``spec`` describes, filled from the iterator ``leaves``."""
    if spec is None:
        return None
    if spec == LEAF:
        return next(leaves)
    if "tuple" in spec:
        return tuple(unflatten(s, leaves) for s in spec["tuple"])
    if "list" in spec:
        return [unflatten(s, leaves) for s in spec["list"]]
    return {k: unflatten(s, leaves) for k, s in spec["dict"]}


def count(spec):
    """How many leaves ``spec`` holds."""
    if spec is None:
        return 0
    if spec == LEAF:
        return 1
    parts = spec.get("tuple", spec.get("list"))
    return sum(count(s) for s in (parts if parts is not None else [s for _, s in spec["dict"]]))


def describe(spec):
    """``spec`` written like the Python value, with ``T`` for a Tensor: ``(T, (T, T))``."""
    if spec is None:
        return "None"
    if spec == LEAF:
        return "T"
    if "tuple" in spec:
        parts = [describe(s) for s in spec["tuple"]]
        return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"
    if "list" in spec:
        return "[" + ", ".join(describe(s) for s in spec["list"]) + "]"
    return "{" + ", ".join(f"{k!r}: {describe(s)}" for k, s in spec["dict"]) + "}"


def example_inputs(example_input):
    """``(leaves, spec)`` of an export's ``example_input``: a tuple is the
    model's arguments; anything else is its one argument."""
    if isinstance(example_input, list) and _is_container_list(example_input):
        raise TypeError(
            f"example_input is a list of {len(example_input)} items; pass a tuple, one item per argument of "
            f"forward() (e.g. (ids, (h0, c0))), or ([a, b],) for one argument that is a list"
        )
    args = example_input if isinstance(example_input, tuple) else (example_input,)
    leaves = []
    spec = flatten(args, leaves)
    return leaves, spec


def call_inputs(spec, args, who):
    """The leaves of ``args`` (a call's positional arguments) in graph order,
    checked against the exported nesting ``spec``; the flat list of leaves is
    accepted too."""
    leaves = []
    try:
        got = flatten(tuple(args), leaves, who)
    except TypeError:
        got = None
    if got == spec or (spec is not None and len(args) == count(spec) and got == {"tuple": [LEAF] * len(args)}):
        return leaves
    raise ValueError(
        f"{who} takes {count(spec)} input(s): the model was exported with arguments {describe(spec)} (T: a "
        f"Tensor or array), got "
        f"{describe(got) if got is not None else 'values that cannot be flattened'}; pass them nested the same "
        f"way (or as {count(spec)} flat arrays in order)"
    )


def outputs(result):
    """``(tensors, spec)`` of a forward pass's result: Tensors in order, a
    dict by sorted key, ``None`` dropped (kept in the spec)."""
    leaves = []
    spec = flatten(result, leaves, "forward()'s result")
    for k, leaf in enumerate(leaves):
        if not isinstance(leaf, Tensor):
            kind = "size (an int from x.shape)" if isinstance(leaf, SymInt) else type(leaf).__name__
            raise EveryOSerializationError(
                f"cannot export: forward() returned a {kind} (output {k} in order, result "
                f"{describe(spec)}); the exporter needs Tensors, nested in tuples, lists or dicts (None is "
                f"dropped). Return it as a Tensor, or leave it out"
            )
    if not leaves:
        raise EveryOSerializationError(
            f"cannot export: forward() returned no Tensor (result {describe(spec)}); a graph needs an output"
        )
    return leaves, spec


def to_json(spec):
    return json.dumps(spec, separators=(",", ":"))


def from_json(text):
    return None if text is None else json.loads(text)
