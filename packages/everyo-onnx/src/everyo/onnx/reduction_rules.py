"""Rules for core's further reductions: argmax/argmin, cumsum, prod, std,
logsumexp and norm, each following core's formula."""

import numpy as np

from everyo.onnx.registry import rule


def _rule(fn):
    return rule(fn.__name__)(fn)


def _axes(axis, ndim):
    if axis is None:
        return list(range(ndim))
    axis = [axis] if isinstance(axis, (int, np.integer)) else list(axis)
    return sorted(int(a) % ndim for a in axis)


def _input(t, node):
    return t.name(node.inputs[0], np.float32 if node.inputs[0].dtype.kind == "f" else None, 0)


def _arg(op_type):
    def convert(t, node):
        x = node.inputs[0]
        name, axis, keep = t.name(x), node.attrs.get("axis"), bool(node.attrs.get("keepdims", False))
        if axis is None:  # an index into the flattened tensor, as NumPy
            flat = t.g.node("Reshape", [name, t.g.ints([-1], "shape")])
            out = t.g.node(op_type, [flat], axis=0, keepdims=0)
            if keep:
                out = t.g.node("Reshape", [out, t.g.ints([1] * x.data.ndim, "shape")])
        else:
            out = t.g.node(op_type, [name], axis=int(axis) % x.data.ndim, keepdims=int(keep))
        t.set(node.outputs[0], out)  # ONNX's ArgMax takes the first index on ties, as NumPy

    return convert


rule("argmax")(_arg("ArgMax"))
rule("argmin")(_arg("ArgMin"))


@_rule
def cumsum(t, node):
    x = node.inputs[0]
    name, axis = _input(t, node), node.attrs.get("axis")
    if axis is None:
        name, axis = t.g.node("Reshape", [name, t.g.ints([-1], "shape")]), 0
    rank = x.data.ndim if node.attrs.get("axis") is not None else 1
    axis_name = t.g.scalar(int(axis) % rank, np.int64, "axis")
    t.set(node.outputs[0], t.g.node("CumSum", [name, axis_name]))


@_rule
def prod(t, node):
    x = node.inputs[0]
    axes = _axes(node.attrs.get("axis"), x.data.ndim)
    out = (
        t.g.reduce("ReduceProd", _input(t, node), axes, node.attrs.get("keepdims", False))
        if axes
        else t.g.node("Identity", [_input(t, node)])
    )
    t.set(node.outputs[0], out)


@_rule
def std(t, node):
    x = node.inputs[0]
    g, name = t.g, _input(t, node)
    axes = _axes(node.attrs.get("axis"), x.data.ndim)
    keep, ddof = node.attrs.get("keepdims", False), node.attrs.get("ddof", 0)
    centered = g.node("Sub", [name, g.reduce("ReduceMean", name, axes, True)])
    square = g.node("Mul", [centered, centered])
    count = int(np.prod([x.shape[a] for a in axes])) if axes else 1
    if ddof == 0:
        variance = g.reduce("ReduceMean", square, axes, keep)
    else:
        variance = g.node("Div", [g.reduce("ReduceSum", square, axes, keep), g.scalar(count - ddof, np.float32, "n")])
    t.set(node.outputs[0], g.node("Sqrt", [variance]))


@_rule
def logsumexp(t, node):
    # Core: shift by the maximum (by 0 where it is infinite), log of the sum, shift back.
    x = node.inputs[0]
    g, name = t.g, _input(t, node)
    axes = _axes(node.attrs.get("axis"), x.data.ndim)
    peak = g.reduce("ReduceMax", name, axes, True)
    peak = g.node("Where", [g.node("IsInf", [peak]), g.scalar(0.0, np.float32, "zero"), peak])
    total = g.reduce("ReduceSum", g.node("Exp", [g.node("Sub", [name, peak])]), axes, True)
    out = g.node("Add", [g.node("Log", [total]), peak])
    if not node.attrs.get("keepdims", False) and axes:
        out = g.squeeze(out, axes)
    t.set(node.outputs[0], out)


@_rule
def norm(t, node):
    x = node.inputs[0]
    g, name = t.g, _input(t, node)
    axes = _axes(node.attrs.get("axis"), x.data.ndim)
    keep = node.attrs.get("keepdims", False)
    p = node.attrs.get("ord", 2)
    p = 2 if p == "fro" else p
    if p == np.inf:
        out = g.reduce("ReduceMax", g.node("Abs", [name]), axes, keep)
    elif p == 1:
        out = g.reduce("ReduceSum", g.node("Abs", [name]), axes, keep)
    elif p == 2:
        out = g.node("Sqrt", [g.reduce("ReduceSum", g.node("Mul", [name, name]), axes, keep)])
    else:
        powered = g.node("Pow", [g.node("Abs", [name]), g.scalar(p, np.float32, "ord")])
        out = g.node("Pow", [g.reduce("ReduceSum", powered, axes, keep), g.scalar(1.0 / p, np.float32, "inv_ord")])
    t.set(node.outputs[0], out)
