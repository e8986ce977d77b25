"""Example inputs, dynamic axes, and the check that the exporter's claims hold.

A graph with a symbolic ``batch`` or ``seq`` axis claims to compute the model
at every size. The exporter checks that claim: it traces again with every
dynamic axis one larger (and with fresh random data, so a value baked into
the graph shows up too), and refuses when the two traces record different
ops or translate to different ONNX graphs, naming the first op that differs.
"""

import operator
from collections.abc import Mapping, Sequence

import numpy as np

from everyo.errors import EveryOSerializationError
from everyo.onnx import nesting
from everyo.tensor import Tensor


def _as_shape(input_shape):
    if isinstance(input_shape, (str, bytes)) or not isinstance(input_shape, Sequence):
        return None
    try:
        return tuple(None if d is None else operator.index(d) for d in input_shape)
    except TypeError:
        return None


def _as_array(x, k):
    a = np.asarray(x.data if isinstance(x, Tensor) else x)
    if a.dtype == np.float64:
        return a.astype(np.float32)  # the graph is float32; NumPy's default float is not
    if a.dtype.kind in "fV" and a.dtype != np.float32:
        extra = " (bfloat16 to float32 is exact)" if a.dtype.name == "bfloat16" else ""
        raise EveryOSerializationError(
            f"example input {k} has dtype {a.dtype.name}; the exporter traces float32 graphs: pass it as "
            f"float32 (x.astype('float32')){extra}. Nothing was written"
        )
    if a.dtype.kind not in "fiub":
        raise TypeError(f"example input {k} has dtype {a.dtype}; give float32, integer or boolean arrays")
    return a


def example_arrays(input_shape, example_input):
    """The example inputs as a list of NumPy arrays."""
    if (input_shape is None) == (example_input is None):
        raise ValueError(
            "give exactly one of input_shape=(batch, ...) (a float32 example is made from it) or "
            "example_input= (an array or Tensor, or a tuple of them)" + ("" if input_shape is None else "; got both")
        )
    if input_shape is not None:
        shape = _as_shape(input_shape)
        batch_ok = shape is not None and len(shape) >= 2 and (shape[0] is None or shape[0] > 0)
        if not batch_ok or not all(d is not None and d > 0 for d in shape[1:]):
            raise ValueError(
                f"input_shape must be (batch, ...) with positive integer sizes, e.g. (1, 8, 8, 1) for an "
                f"8x8 one-channel NHWC image; got {input_shape!r}. The batch size is exported symbolic "
                f"whatever its value"
            )
        shape = (1 if shape[0] is None else shape[0],) + shape[1:]
        return [np.random.default_rng(0).standard_normal(shape).astype(np.float32)]
    items, _ = nesting.example_inputs(example_input)  # nested tuples/lists/dicts flattened, never stacked
    return [_as_array(x, k) for k, x in enumerate(items)]


def normalize_axes(dynamic_axes, input_names, arrays):
    """``{name: {axis: dim_name}}``; the default makes axis 0 of every input ``batch``."""
    if dynamic_axes is None:
        return {n: {0: "batch"} for n, a in zip(input_names, arrays) if a.ndim >= 1}
    if not isinstance(dynamic_axes, Mapping):
        raise TypeError(f"dynamic_axes must be a dict like {{'input': {{0: 'batch'}}}}, got {dynamic_axes!r}")
    ranks = dict(zip(input_names, (a.ndim for a in arrays)))
    out = {}
    for name, spec in dynamic_axes.items():
        if isinstance(spec, (list, tuple)):
            spec = {int(a): f"{name}_dim{int(a)}" for a in spec}
        if not isinstance(spec, Mapping):
            raise TypeError(f"dynamic_axes[{name!r}] must be a dict {{axis: name}} or a list of axes, got {spec!r}")
        axes = {}
        for axis, dim in spec.items():
            axis = operator.index(axis)
            if name in ranks:
                if not -ranks[name] <= axis < ranks[name]:
                    raise ValueError(f"dynamic_axes[{name!r}] names axis {axis}, but that input has rank {ranks[name]}")
                axis %= ranks[name]
            axes[axis] = str(dim)
        out[name] = axes
    return out


def _sizes(axes, input_names, arrays):
    sizes = {}
    for name, a in zip(input_names, arrays):
        for axis, dim in axes.get(name, {}).items():
            n = a.shape[axis]
            if sizes.setdefault(dim, n) != n:
                raise ValueError(
                    f"dynamic axis '{dim}' has size {sizes[dim]} in one input and {n} in {name!r}; "
                    f"axes sharing a name must have the same size"
                )
    return sizes


def integer_ranges(tracer):
    """``{input name: (low, high)}``, inclusive, for every integer input: the
    rows it can index where the trace shows it used as an index (an embedding's
    ids, ``table[ids]``), else from 0 (or the example's minimum, if negative)
    to the example's maximum: ids below a valid id are valid, and an example
    of equal ids still gets varied ones."""
    ranges = {}
    for value in tracer.inputs:
        a = value.data
        if a.dtype.kind not in "iu" or not a.size:
            continue
        bounds = [
            n for n in (_indexed_size(node, position, value) for node, position in tracer.consumers_of(value)) if n
        ]
        ranges[value.name] = (0, min(bounds) - 1) if bounds else (min(0, int(a.min())), int(a.max()))
    return ranges


def _indexed_size(node, position, value):
    """The length of the axis ``node`` indexes with ``value``, or None."""
    if node.op == "embedding" and position == 0:
        return node.inputs[1].shape[0]
    if node.op == "getitem" and position is None:
        index = node.attrs.get("index")
        items = list(index) if isinstance(index, tuple) else [index]
        axis = 0
        for item in items:
            if item is value.tensor:
                return node.inputs[0].shape[axis] if axis < node.inputs[0].data.ndim else None
            if item is Ellipsis:
                return None
            if item is not None:
                axis += 1
    return None


def random_like(a, shape, rng, bounds=None):
    """Fresh data of ``shape`` like ``a``: floats with its mean and spread,
    integers uniform in ``bounds`` (inclusive), random booleans."""
    if a.dtype == np.bool_:
        return rng.random(shape) < 0.3
    if a.dtype.kind in "iu":
        low, high = bounds if bounds is not None else ((int(a.min()), int(a.max())) if a.size else (0, 0))
        return rng.integers(low, high + 1, size=shape).astype(a.dtype)
    spread = float(a.std()) if a.size > 1 and a.std() > 0 else 1.0
    return (rng.standard_normal(shape) * spread + float(a.mean() if a.size else 0)).astype(a.dtype)


def second_example(arrays, axes, input_names=None, ranges=None, shrink=False):
    """Inputs for the check trace: every dynamic axis one larger (``shrink``:
    one smaller where it is at least 2), fresh data (:func:`random_like`,
    integers within ``ranges``)."""
    names = input_names or list(axes)
    rng = np.random.default_rng(12345)
    sizes = _sizes(axes, names, arrays)
    ranges = ranges or {}
    out = []
    for name, a in zip(names, arrays):
        shape = list(a.shape)
        for axis, dim in axes.get(name, {}).items():
            shape[axis] = sizes[dim] - 1 if shrink and sizes[dim] >= 2 else sizes[dim] + 1
        out.append(random_like(a, shape, rng, ranges.get(name)))
    return out


def third_example(arrays, input_names, ranges, seed=2024):
    """Fresh data at the example's own sizes (``verify``'s second random input)."""
    rng = np.random.default_rng(seed)
    return [random_like(a, a.shape, rng, ranges.get(name)) for name, a in zip(input_names, arrays)]


def same_decisions(first, second, arrays, arrays2):
    """Refuse Python control flow on a size that changes with the dynamic
    axes (the user's ``if``, ``while``, ``and`` on a SymBool), naming its line;
    return the asserts on such sizes (the guards), from the first trace."""
    guards = []
    for a, b in zip(first.decisions, second.decisions):
        if a.line != b.line:
            break  # the code went another way from here: same_ops names where
        if a.operands == b.operands:
            continue  # on sizes that did not change (a static axis)
        if a.is_assert:
            guards.append(a)
            continue
        raise EveryOSerializationError(
            f"cannot export with these dynamic axes: the model takes a Python decision on a size that changes "
            f"with them at {a.line} ({a.condition.text()}: {_operands(a)} at input sizes {[x.shape for x in arrays]}, "
            f"{_operands(b)} at {[x.shape for x in arrays2]}); a graph cannot follow Python control flow. Compute "
            f"with whole-tensor ops (eo.where, slicing by the size), write a check as an assert (it becomes a guard "
            f"of the exported graph), or leave that axis out of dynamic_axes. Nothing was written"
        )
    return guards


def _operands(decision):
    return " vs ".join(str(v) for v in decision.operands)


def _wiring(node):
    return tuple(
        None if v is None else (v.kind, v.node.index if v.node is not None else None, v.index)
        for v in list(node.inputs) + node.deps
    )


def _sizes_text(arrays, arrays2):
    return f"{[a.shape for a in arrays]} and {[b.shape for b in arrays2]}"


def same_ops(first, second, arrays, arrays2):
    """Refuse when the two traces record different ops (a Python loop over a
    dynamic axis, a branch on a size)."""
    for a, b in zip(first.nodes, second.nodes):
        if a.op != b.op or _wiring(a) != _wiring(b):
            raise EveryOSerializationError(
                f"cannot export with these dynamic axes: the model records different ops at input sizes "
                f"{_sizes_text(arrays, arrays2)}: {a.describe()} became {b.describe()} (a Python loop or branch "
                f"on a size, e.g. over the sequence). Leave that axis out of dynamic_axes, or compute with whole-"
                f"tensor ops. Nothing was written"
            )
    if len(first.nodes) != len(second.nodes):
        longer = first if len(first.nodes) > len(second.nodes) else second
        extra = longer.nodes[min(len(first.nodes), len(second.nodes))]
        raise EveryOSerializationError(
            f"cannot export with these dynamic axes: the model records {len(first.nodes)} ops at input sizes "
            f"{[a.shape for a in arrays]} but {len(second.nodes)} at {[b.shape for b in arrays2]}, from "
            f"{extra.describe()} on (a Python loop over a dynamic axis). Leave that axis out of dynamic_axes. "
            f"Nothing was written"
        )


def same_graph(g, g2, arrays, arrays2):
    """Refuse when the two traces translate to different ONNX graphs (a size
    baked into a reshape or a constant)."""
    for k, (a, b) in enumerate(zip(g.nodes, g2.nodes)):
        same = a.SerializeToString() == b.SerializeToString() and all(
            (x in g.initializers) == (x in g2.initializers)
            and (
                x not in g.initializers
                or (
                    g.initializers[x].shape == g2.initializers[x].shape
                    and np.array_equal(g.initializers[x], g2.initializers[x])
                )
            )
            for x in a.input
        )
        if not same:
            origin = g.origins[k] or g2.origins[k]
            where = origin.describe() if origin is not None else f"ONNX node {a.name}"
            detail = ""
            for x in a.input:
                u, v = g.initializers.get(x), g2.initializers.get(x)
                if u is not None and v is not None and not (u.shape == v.shape and np.array_equal(u, v)):
                    small = u.size <= 8 and v.size <= 8
                    detail = (
                        f"; its constant input '{x}' is {u.tolist() if small else u.shape} vs "
                        f"{v.tolist() if small else v.shape}"
                    )
                    break
            if [x.shape for x in arrays] == [y.shape for y in arrays2]:
                raise EveryOSerializationError(
                    f"cannot export: {where} translates differently for two inputs of the same sizes "
                    f"{[x.shape for x in arrays]} with different data ({a.op_type} node {a.name}{detail}): a value "
                    f"computed from the input's data outside EveryO ops (x.data, NumPy, .tolist()) is baked into "
                    f"it. Compute it with EveryO ops. Nothing was written"
                )
            raise EveryOSerializationError(
                f"cannot export with these dynamic axes: {where} translates differently at input sizes "
                f"{_sizes_text(arrays, arrays2)} ({a.op_type} node {a.name}{detail}): a size taken from the traced "
                f"arrays (x.data.shape, len(x), a Python int) or a value computed outside EveryO ops is baked into "
                f"it. Take sizes from x.shape (the graph follows them), use -1 in reshapes, or leave that axis out of "
                f"dynamic_axes. Nothing was written"
            )
    if len(g.nodes) != len(g2.nodes):
        raise EveryOSerializationError(
            f"cannot export with these dynamic axes: the graph has {len(g.nodes)} nodes at input sizes "
            f"{[a.shape for a in arrays]} and {len(g2.nodes)} at {[b.shape for b in arrays2]}. Nothing was written"
        )


def dims(shape, axis_names):
    return [axis_names.get(i, int(d)) for i, d in enumerate(shape)]


def output_dims(shape, shape2, name, axes, input_names, arrays, arrays2):
    """An output's dims: symbolic where it changed with the inputs (named after
    the input axis it follows) or where dynamic_axes says so."""
    declared = axes.get(name, {})
    out = []
    for i, (a, b) in enumerate(zip(shape, shape2)):
        if i in declared:
            out.append(declared[i])
        elif a == b:
            out.append(int(a))
        else:
            follow = [
                dim
                for n, x, y in zip(input_names, arrays, arrays2)
                for j, dim in axes.get(n, {}).items()
                if x.shape[j] == a and y.shape[j] == b
            ]
            out.append(follow[0] if follow else f"{name}_dim{i}")
    return out
