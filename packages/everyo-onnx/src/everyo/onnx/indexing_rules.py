"""Rules for core's comparisons, extra elementwise ops, shape ops, indexing
(take_along_axis, masked_fill, one_hot, sort, topk) and einsum."""

from __future__ import annotations

import numpy as np

from everyo.onnx.registry import rule as _rule
from everyo.onnx.symbolic import SymInt

_COMPARE = {
    "equal": "Equal",
    "less": "Less",
    "less_equal": "LessOrEqual",
    "greater": "Greater",
    "greater_equal": "GreaterOrEqual",
    "not_equal": "Equal",
}


@_rule(*_COMPARE)
def compare(t, node):
    a, b = node.inputs
    dtype = np.result_type(a.dtype, b.dtype)  # NumPy compares in the promoted type
    out = t.g.node(_COMPARE[node.op], [t.name(a, dtype, 0), t.name(b, dtype, 1)])
    t.set(node.outputs[0], t.g.node("Not", [out]) if node.op == "not_equal" else out)


@_rule("maximum", "minimum")
def extreme(t, node):
    dtype = node.outputs[0].dtype
    names = [t.name(v, dtype, k) for k, v in enumerate(node.inputs)]
    t.set(node.outputs[0], t.g.node("Max" if node.op == "maximum" else "Min", names))


@_rule("sin", "cos", "clone")
def unary(t, node):
    op_type = {"sin": "Sin", "cos": "Cos", "clone": "Identity"}[node.op]
    t.set(node.outputs[0], t.g.node(op_type, [t.name(node.inputs[0])]))


@_rule("squeeze")
def squeeze(t, node):
    x = node.inputs[0]
    axis = node.attrs.get("axis")
    if axis is None:
        axes = [i for i, n in enumerate(x.shape) if n == 1]
    else:
        axes = sorted(int(a) % x.data.ndim for a in ([axis] if np.ndim(axis) == 0 else axis))
    name = t.name(x)
    t.set(node.outputs[0], t.g.squeeze(name, axes) if axes else t.g.node("Identity", [name]))


@_rule("expand_dims")
def expand_dims(t, node):
    axis = node.attrs["axis"]
    axis = [axis] if np.ndim(axis) == 0 else list(axis)
    rank = node.outputs[0].data.ndim
    t.set(node.outputs[0], t.g.unsqueeze(t.name(node.inputs[0]), sorted(int(a) % rank for a in axis)))


@_rule("moveaxis")
def moveaxis(t, node):
    x = node.inputs[0]
    n = x.data.ndim
    as_list = lambda v: [v] if np.ndim(v) == 0 else list(v)  # noqa: E731
    src = [int(a) % n for a in as_list(node.attrs["source"])]
    dst = [int(a) % n for a in as_list(node.attrs["destination"])]
    perm = [i for i in range(n) if i not in src]
    for d, s_ in sorted(zip(dst, src)):  # NumPy's moveaxis
        perm.insert(d, s_)
    t.set(node.outputs[0], t.g.transpose(t.name(x), perm))


def _broadcast_to_other(t, name, other, axis):
    """``name`` expanded against ``other``'s runtime shape on every axis but ``axis``."""
    one = t.g.node("Slice", [other, t.g.ints([0]), t.g.ints([1]), t.g.ints([axis])])
    return t.g.node("Expand", [name, t.g.node("Shape", [one])])


@_rule("take_along_axis")
def take_along_axis(t, node):
    a, indices = node.inputs
    axis = int(node.attrs["axis"]) % a.data.ndim
    out = node.outputs[0]
    data, index = t.name(a, out.dtype, 0), t.name(indices, np.int64, 1)
    # NumPy broadcasts the other axes; GatherElements does not, so both are
    # expanded from the runtime shapes (dynamic sizes stay dynamic).
    others = [i for i in range(a.data.ndim) if i != axis]
    if any(indices.shape[i] != out.shape[i] for i in others):
        index = _broadcast_to_other(t, index, data, axis)
    if any(a.shape[i] != out.shape[i] for i in others):
        data = _broadcast_to_other(t, data, index, axis)
    t.set(out, t.g.node("GatherElements", [data, index], axis=axis))


@_rule("masked_fill")
def masked_fill(t, node):
    a, mask = node.inputs
    value = node.attrs["value"]
    value = np.asarray(value.data if hasattr(value, "data") else value, dtype=a.dtype)
    t.set(node.outputs[0], t.g.node("Where", [t.name(mask, np.bool_, 1), t.g.constant(value, "fill"), t.name(a)]))


@_rule("one_hot")
def one_hot(t, node):
    (indices,) = node.inputs
    out = node.outputs[0]
    classes = t.g.constant(np.arange(out.shape[-1], dtype=np.int64), "classes")
    hit = t.g.node("Equal", [t.g.unsqueeze(t.name(indices, np.int64, 0), [indices.data.ndim]), classes])
    t.set(out, t.g.cast(hit, out.dtype))


@_rule("sort", "topk")
def sort(t, node):
    # ONNX TopK lists equal values lowest index first: core's ascending (stable)
    # order; for a descending sort of equal values core lists the highest index
    # first, so on ties the indices (not the values) can differ.
    x = node.inputs[0]
    axis = int(node.attrs.get("axis", -1)) % x.data.ndim
    name = t.name(x)
    if node.op == "sort":
        k, largest = t.dim(name, axis), int(bool(node.attrs.get("descending", False)))
    else:
        k, largest = t.g.ints([int(node.attrs["k"])], "k"), int(bool(node.attrs.get("largest", True)))
    values, indices = t.g.node("TopK", [name, k], outputs=2, axis=axis, largest=largest, sorted=1)
    t.set(node.outputs[0], values)
    t.set(node.outputs[1], indices)


@_rule("einsum")
def einsum(t, node):
    from everyo.contraction import _parse

    terms, output = _parse(node.attrs["subscripts"], node.inputs)
    dtype = node.outputs[0].dtype
    names = [t.name(v, dtype, k) for k, v in enumerate(node.inputs)]
    t.set(node.outputs[0], t.g.node("Einsum", names, equation=f"{','.join(terms)}->{output}"))


@_rule("arange")
def arange(t, node):
    # Recorded only when a bound is a traced size (eo.arange(T)); else folded to a constant.
    args = tuple(node.attrs["args"])
    start, stop, step = (0, args[0], 1) if len(args) == 1 else (args + (1,))[:3]
    dtype = node.outputs[0].dtype

    def scalar(v, what):
        if isinstance(v, SymInt):
            v = t.g.squeeze(t.size(v), [0])
            return v if dtype == np.int64 else t.g.cast(v, dtype)
        return t.g.scalar(v, dtype, what)

    t.set(node.outputs[0], t.g.node("Range", [scalar(start, "start"), scalar(stop, "limit"), scalar(step, "delta")]))


@_rule("zeros", "ones")
def filled(t, node):
    # Recorded only when a size is a traced one (eo.zeros(B, H)); else folded to a constant.
    shape = tuple(node.attrs["shape"])
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    out = node.outputs[0]
    from onnx import numpy_helper

    fill = numpy_helper.from_array(np.full((1,), 0 if node.op == "zeros" else 1, dtype=out.dtype))
    t.set(out, t.g.node("ConstantOfShape", [t.sizes(shape, "shape")], value=fill))


@_rule("size")
def size(t, node):
    # A traced size used as a number in arithmetic (x.sum(1) / x.shape[1]): computed from the shapes.
    out = node.outputs[0]
    value = t.g.squeeze(t.size(node.attrs["value"]), [0])
    t.set(out, value if out.dtype == np.int64 else t.g.cast(value, out.dtype))
