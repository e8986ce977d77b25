"""The translation table: one rule per primitive op of core's op table.

A rule gets the :class:`~everyo.onnx.translate.Translator` ``t`` and the
recorded node; it reads its operands' ONNX names with ``t.name(value)``,
emits nodes with ``t.g`` and binds each recorded output with ``t.set``.
Shapes and dtypes come from the recorded values (EveryO computed them), so
rules never guess; anything a rule cannot express exactly is refused with
``t.refuse``.
"""

import numpy as np

from everyo.onnx import advanced_indexing, attention
from everyo.onnx.graph import INT64_MAX, TO_NCHW, TO_NHWC
from everyo.onnx.registry import RULES as RULES  # RULES re-exported: export.py and the tests read it here
from everyo.onnx.registry import rule
from everyo.onnx.symbolic import SymInt


def _out(node, k=0):
    return node.outputs[k]


def _operands(t, node, dtype=None):
    """ONNX names of every non-None input, cast to the output's dtype (ONNX
    binary ops need equal operand types; NumPy promoted them)."""
    dtype = dtype or _out(node).dtype
    return [t.name(v, dtype, position=i) for i, v in enumerate(node.inputs) if v is not None]


def _axes(axis, ndim):
    if axis is None:
        return list(range(ndim))
    if isinstance(axis, (int, np.integer)):
        axis = (axis,)
    return sorted(int(a) % ndim for a in axis)


# --- elementwise ------------------------------------------------------------------
_BINARY = {"add": "Add", "sub": "Sub", "mul": "Mul", "div": "Div"}
_UNARY = {
    "neg": "Neg",
    "exp": "Exp",
    "log": "Log",
    "sqrt": "Sqrt",
    "abs": "Abs",
    "tanh": "Tanh",
    "sigmoid": "Sigmoid",
    "relu": "Relu",
}


@rule(*_BINARY)
def binary(t, node):
    names = []
    for position, value in enumerate(node.inputs):
        other = node.inputs[1 - position]
        table = _leading_slice(t, node, position, value, other)
        names.append(table if table is not None else t.name(value, _out(node).dtype, position))
    t.set(_out(node), t.g.node(_BINARY[node.op], names))


def _leading_slice(t, node, position, value, other):
    """A constant that is ``table[:n]`` of a larger table, with ``n`` the length of
    the other operand's matching axis (PositionalEncoding adds ``table[:length]``):
    the whole table goes into the file and is sliced to the input's length in
    the graph. Only when ``n`` changes between the two traces; else None."""
    base = value.array.base if value.kind == "const" else None
    if base is None or not other.dynamic or not t.varies(node, position) or value.data.ndim == 0:
        return None
    n = value.shape[0]
    axis = other.data.ndim - value.data.ndim
    is_prefix = (
        isinstance(base, np.ndarray)
        and base.shape[1:] == value.shape[1:]
        and base.shape[0] >= n
        and value.array.__array_interface__["data"][0] == base.__array_interface__["data"][0]
        and value.array.strides == base.strides
    )
    if not is_prefix or axis < 0 or other.shape[axis] != n:
        return None
    table = t.g.constant(np.asarray(base, dtype=_out(node).dtype), (value.name or "table"))
    length = t.dim(t.name(other), axis)
    return t.g.node("Slice", [table, t.g.ints([0]), length, t.g.ints([0])])


@rule(*_UNARY)
def unary(t, node):
    t.set(_out(node), t.g.node(_UNARY[node.op], _operands(t, node)))


@rule("pow")
def pow_(t, node):
    base, exponent = node.inputs
    x = t.name(base, _out(node).dtype, 0)
    if exponent.kind == "const" and exponent.data.ndim == 0 and float(exponent.data) == 2.0:
        t.set(_out(node), t.g.node("Mul", [x, x]))  # core computes x * x, exactly
        return
    t.set(_out(node), t.g.node("Pow", [x, t.name(exponent, _out(node).dtype, 1)]))


@rule("clip")
def clip(t, node):
    x = _operands(t, node)[0]
    dtype = _out(node).dtype
    bounds = ["" if node.attrs.get(k) is None else t.g.scalar(node.attrs[k], dtype, k) for k in ("min", "max")]
    t.set(_out(node), t.g.node("Clip", [x] + bounds))


@rule("where")
def where(t, node):
    cond, a, b = node.inputs
    dtype = _out(node).dtype
    c = t.name(cond, np.bool_, 0)
    t.set(_out(node), t.g.node("Where", [c, t.name(a, dtype, 1), t.name(b, dtype, 2)]))


@rule("astype")
def astype(t, node):
    t.set(_out(node), t.g.cast(t.name(node.inputs[0]), _out(node).dtype))


@rule("dropout")
def dropout(t, node):
    if node.attrs.get("training") and node.attrs.get("p"):
        raise t.refuse(
            "dropout was called with training=True while tracing (the model is traced in eval mode; "
            "pass training=self.training so that the exported graph is the inference one)"
        )
    t.set(_out(node), t.g.node("Identity", [t.name(node.inputs[0])]))


# --- matmul, linear, convolution and pooling ------------------------------------------
@rule("matmul")
def matmul(t, node):
    fused = t.fused.get(id(_out(node)))  # the context of an attention given to ONNX's Attention op
    t.set(_out(node), fused if fused is not None else t.g.node("MatMul", _operands(t, node)))


@rule("linear")
def linear(t, node):
    x, w, b = node.inputs
    dtype = _out(node).dtype
    # MatMul broadcasts over any leading axes, like core's linear; Gemm takes rank 2 only.
    weight = t.name(w, dtype, 1)
    if node.attrs.get("transpose_weight"):  # a tied (out, in) table: one initializer, read through a Transpose
        weight = t.g.transpose(weight, (1, 0))
    y = t.g.node("MatMul", [t.name(x, dtype, 0), weight])
    if b is not None:
        y = t.g.node("Add", [y, t.name(b, dtype, 2)])
    t.set(_out(node), y)


def _pads(pads):
    (top, bottom), (left, right) = pads
    return [int(top), int(left), int(bottom), int(right)]  # ONNX: [x1_begin, x2_begin, x1_end, x2_end]


@rule("conv2d")
def conv2d(t, node):
    x, w, b = node.inputs
    a = node.attrs
    # EveryO kernels are (kh, kw, in, out); ONNX wants (out, in, kh, kw).
    if w.kind == "const":
        weight = t.g.constant(np.asarray(w.data, np.float32).transpose(3, 2, 0, 1), (w.name or "weight"))
    else:
        weight = t.g.transpose(t.name(w), (3, 2, 0, 1))
    inputs = [t.g.transpose(t.name(x), TO_NCHW), weight] + ([] if b is None else [t.name(b, np.float32, 2)])
    y = t.g.node(
        "Conv",
        inputs,
        kernel_shape=[int(k) for k in a["kernel_size"]],
        strides=[int(s) for s in a["stride"]],
        pads=_pads(a["pads"]),
        dilations=[int(d) for d in a.get("dilation", (1, 1))],
        group=int(a.get("groups", 1)),
    )
    t.set(_out(node), t.g.transpose(y, TO_NHWC))


def _pool(op_type, **extra):
    def convert(t, node):
        a = node.attrs
        y = t.g.node(
            op_type,
            [t.g.transpose(t.name(node.inputs[0]), TO_NCHW)],
            kernel_shape=[int(k) for k in a["pool_size"]],
            strides=[int(s) for s in a["stride"]],
            pads=_pads(a["pads"]),
            **extra,
        )
        t.set(_out(node), t.g.transpose(y, TO_NHWC))

    return convert


# Max pooling ignores padded cells (core pads with -inf).
rule("max_pool2d")(_pool("MaxPool"))


@rule("avg_pool2d")
def avg_pool2d(t, node):
    # Core's count_include_pad, resolved while tracing (None: Keras' rule for
    # 'same', PyTorch's for numeric padding), is ONNX's attribute of that name.
    _pool("AveragePool", count_include_pad=int(node.attrs["count_include_pad"]))(t, node)


# --- reductions and softmax ---------------------------------------------------------------
_REDUCE = {"sum": "ReduceSum", "mean": "ReduceMean", "max": "ReduceMax", "min": "ReduceMin"}


@rule(*_REDUCE)
def reduce(t, node):
    x = node.inputs[0]
    name = t.name(x, _out(node).dtype, 0)
    axes = _axes(node.attrs.get("axis"), x.data.ndim)
    if not axes:
        t.set(_out(node), t.g.node("Identity", [name]))
        return
    t.set(_out(node), t.g.reduce(_REDUCE[node.op], name, axes, node.attrs.get("keepdims", False)))


@rule("var")
def var(t, node):
    x = node.inputs[0]
    name = t.name(x, _out(node).dtype, 0)
    axes = _axes(node.attrs.get("axis"), x.data.ndim)
    keep, ddof = node.attrs.get("keepdims", False), node.attrs.get("ddof", 0)
    # Core: centered = x - mean(x); sum(centered ** 2) / (count - ddof).
    centered = t.g.node("Sub", [name, t.g.reduce("ReduceMean", name, axes, True)])
    square = t.g.node("Mul", [centered, centered])
    if ddof == 0:
        t.set(_out(node), t.g.reduce("ReduceMean", square, axes, keep))
        return
    count = int(np.prod([x.shape[a] for a in axes]))
    total = t.g.reduce("ReduceSum", square, axes, keep)
    t.set(_out(node), t.g.node("Div", [total, t.g.scalar(count - ddof, _out(node).dtype, "count")]))


@rule("softmax")
def softmax(t, node):
    x, blocked = node.inputs
    axis = int(node.attrs.get("axis", -1)) % x.data.ndim
    name = t.name(x, np.float32, 0)
    mask, causal_only = (None, False) if blocked is None else _blocked_mask(t, node, x, blocked)
    attention.fuse(t, node, mask)
    if (blocked is None or causal_only) and not _may_be_all_minus_inf(x):
        # ONNX's Softmax gives what core gives wherever a row keeps an entry
        # that is not -inf. The causal mask alone never blocks a row's first
        # entry, so under it (as without a mask) a row is all -inf only when
        # the scores themselves are -inf there, caught above for a constant
        # additive mask (ORT gives NaN there, core zeros).
        if mask is not None:
            name = t.g.node("Where", [mask, t.g.scalar(-np.inf, np.float32, "minus_inf"), name])
        t.set(_out(node), t.g.node("Softmax", [name], axis=axis))
        return
    # Core's masked softmax, step for step: blocked entries are -inf; a row
    # with every entry blocked is shifted by 0 (not -inf) and divided by 1, so
    # it gives zeros where ONNX's Softmax would give NaN.
    g = t.g
    data = name if mask is None else g.node("Where", [mask, g.scalar(-np.inf, np.float32, "minus_inf"), name])
    peak = g.reduce("ReduceMax", data, [axis], True)
    peak = g.node("Where", [g.node("IsInf", [peak]), g.scalar(0.0, np.float32, "zero"), peak])
    e = g.node("Exp", [g.node("Sub", [data, peak])])
    total = g.reduce("ReduceSum", e, [axis], True)
    safe = g.node(
        "Where",
        [g.node("Greater", [total, g.scalar(0.0, np.float32, "zero")]), total, g.scalar(1.0, np.float32, "one")],
    )
    t.set(_out(node), g.node("Div", [e, safe]))


def _may_be_all_minus_inf(x):
    """Whether softmax's input is ``scores + mask`` with a constant mask holding
    -inf (an additive attention mask), where a fully masked row must give
    zeros as in core, not ONNX Softmax's NaN."""
    producer = x.node
    if producer is None or producer.op not in ("add", "sub"):
        return False
    return any(
        v is not None and v.kind == "const" and v.dtype.kind == "f" and np.isinf(v.data).any() for v in producer.inputs
    )


def _blocked_mask(t, node, scores, blocked):
    """The boolean mask as ONNX, built from the graph's shapes where it is a
    causal mask and from the graph's boolean inputs where it is their padding
    mask, so it follows dynamic sequence lengths; anything else is a constant
    (and refused by the constant check if it varies between the traces).

    Returns ``(mask, causal_only)``; ``causal_only`` says the mask is the
    causal mask alone, which leaves every row's first entry unblocked.

    A mask that *is* a view of an input (a key padding mask alone) is that
    input. A combination (causal | padding) is a new array, recognised by
    value; a hypothesis counts only if it holds in both traces, which tells
    "padding" from "padding and causal" when one trace cannot (a fully
    padded example)."""
    if blocked.dynamic:
        return t.name(blocked, np.bool_, 1), False
    if any(blocked.array.base is inp.array for inp in t.tracer.inputs):
        return t.name(blocked, np.bool_, 1), False  # the input itself, with axes added (Translator._from_input)
    other = t.partner_node(node)
    chosen = None
    for hypothesis in _mask_hypotheses(t.tracer, scores, blocked):
        if other is None or hypothesis in _mask_hypotheses(t.partner, other.inputs[0], other.inputs[1]):
            chosen = hypothesis
            break
    if chosen is None:
        return t.name(blocked, np.bool_, 1), False
    k, with_causal = chosen
    rank = scores.data.ndim
    parts = [] if k is None else [t.g.unsqueeze(t.name(t.tracer.inputs[k]), list(range(1, rank - 1)))]
    if with_causal:
        # Lengths from the product's operands when scores = a @ b (so a fused
        # Attention node leaves the product dead), else from scores itself.
        product = scores.node if scores.node is not None and scores.node.op == "matmul" else None
        rows, cols = product.inputs if product is not None else (scores, scores)
        parts.append(_causal(t, t.name(rows), t.name(cols)))
    mask = parts[0]
    for p in parts[1:]:
        mask = t.g.node("Or", [mask, p])
    return mask, k is None


def _mask_hypotheses(tracer, scores, blocked):
    """``[(input index or None, with_causal)]`` that reproduce ``blocked`` exactly,
    most specific first."""
    full = np.broadcast_to(blocked.data, scores.shape)
    rank = scores.data.ndim
    if rank < 2:
        return []
    lq, lk = scores.shape[-2:]
    causal = np.triu(np.ones((lq, lk), dtype=bool), k=1)
    found = []
    for k, inp in enumerate(tracer.inputs):
        if inp.dtype == np.bool_ and inp.data.ndim == 2 and rank >= 3 and inp.shape == (scores.shape[0], lk):
            spread = inp.data.reshape((inp.shape[0],) + (1,) * (rank - 2) + (lk,))
            found += [
                (k, c)
                for c, expected in ((True, spread | causal), (False, spread))
                if np.array_equal(full, np.broadcast_to(expected, scores.shape))
            ]
    if np.array_equal(full, np.broadcast_to(causal, scores.shape)):
        found.append((None, True))
    return found


def _causal(t, rows, cols):
    """``key > query``: True above the diagonal of a (rows[-2], cols[-1]) grid, from runtime shapes."""
    g = t.g

    def positions(name, axis):
        n = g.node("Squeeze", [t.dim(name, axis), g.ints([0], "axes")])
        return g.node("Range", [g.scalar(0, np.int64, "start"), n, g.scalar(1, np.int64, "step")])

    q = g.unsqueeze(positions(rows, -2), [1])
    k = g.unsqueeze(positions(cols, -1), [0])
    return g.node("Less", [q, k])


@rule("log_softmax")
def log_softmax(t, node):
    x = node.inputs[0]
    axis = int(node.attrs.get("axis", -1)) % x.data.ndim
    t.set(_out(node), t.g.node("LogSoftmax", [t.name(x, np.float32, 0)], axis=axis))


# --- shapes and indexing -------------------------------------------------------------------
@rule("reshape", "flatten")
def reshape(t, node):
    x = node.inputs[0]
    given = node.attrs.get("shape", ())
    if any(isinstance(d, SymInt) for d in given):
        # Sizes taken from x.shape (reshape(B, T, -1)): computed in the graph as the code computes them.
        t.set(_out(node), t.g.node("Reshape", [t.name(x), t.sizes(given, "shape")]))
        return
    target = tuple(_out(node).shape)
    other = t.partner_node(node)
    other_target = tuple(other.outputs[0].shape) if other is not None else target
    other_in = other.inputs[0].shape if other is not None else x.shape
    dims, varying = [], []
    for i, (a, b) in enumerate(zip(target, other_target)):
        if i < x.data.ndim and a == x.shape[i] and b == other_in[i] and a != 0:
            dims.append(0)  # ONNX Reshape: 0 copies the input's size at this position
        elif a == b:
            dims.append(int(a))
        else:
            dims.append(int(a))
            varying.append(i)
    if len(varying) == 1:
        dims[varying[0]] = -1  # the one size that follows the dynamic axes is inferred
    t.set(_out(node), t.g.node("Reshape", [t.name(x), t.g.ints(dims, "shape")]))


@rule("transpose")
def transpose(t, node):
    t.set(_out(node), t.g.transpose(t.name(node.inputs[0]), node.attrs["axes"]))


@rule("concatenate")
def concatenate(t, node):
    axis = int(node.attrs.get("axis", 0)) % _out(node).data.ndim
    t.set(_out(node), t.g.node("Concat", _operands(t, node), axis=axis))


@rule("stack")
def stack(t, node):
    axis = int(node.attrs.get("axis", 0)) % _out(node).data.ndim
    parts = [t.g.unsqueeze(n, [axis]) for n in _operands(t, node)]
    t.set(_out(node), t.g.node("Concat", parts, axis=axis))


@rule("split")
def split(t, node):
    sizes = node.attrs["sizes"]
    outs = t.g.node(
        "Split", [t.name(node.inputs[0]), t.g.ints(sizes, "split")], outputs=len(sizes), axis=int(node.attrs["axis"])
    )
    for value, name in zip(node.outputs, [outs] if len(sizes) == 1 else outs):
        t.set(value, name)


@rule("getitem")
def getitem(t, node):
    x = node.inputs[0]
    index = node.attrs["index"]
    items = list(index) if isinstance(index, tuple) else [index]
    if any(advanced_indexing.is_advanced(i) for i in items):
        return advanced_indexing.translate(t, node, items)
    if any(i is Ellipsis for i in items):
        k = items.index(Ellipsis)
        fill = x.data.ndim - (len(items) - 1 - sum(i is None for i in items))
        items = items[:k] + [slice(None)] * fill + items[k + 1 :]
    name = t.name(x)
    starts, ends, axes, steps, ints, news = [], [], [], [], [], []
    axis = out_axis = 0
    for item in items:
        if item is None:
            news.append(out_axis)
            out_axis += 1
        elif isinstance(item, slice):
            if item != slice(None):
                step = 1 if item.step is None else item.step
                lo = item.start if item.start is not None else (0 if step > 0 else INT64_MAX)
                hi = item.stop if item.stop is not None else (INT64_MAX if step > 0 else -INT64_MAX)
                starts.append(lo), ends.append(hi), axes.append(axis), steps.append(step)
            axis += 1
            out_axis += 1
        else:
            ints.append((axis, item))
            axis += 1
    if axes:
        # Bounds taken from x.shape (x[:, :T], a causal mask's [:T, :T]) are SymInts: computed in the graph.
        name = t.g.node("Slice", [name, t.sizes(starts), t.sizes(ends), t.g.ints(axes), t.sizes(steps)])
    for axis, i in sorted(ints, reverse=True):  # from the last axis, so earlier positions stay put
        index = t.g.squeeze(t.size(i), [0]) if isinstance(i, SymInt) else t.g.scalar(int(i), np.int64, "index")
        name = t.g.node("Gather", [name, index], axis=axis)
    if news:
        name = t.g.unsqueeze(name, news)
    if name == t.name(x):
        name = t.g.node("Identity", [name])
    t.set(_out(node), name)


@rule("embedding")
def embedding(t, node):
    indices, weight = node.inputs
    t.set(_out(node), t.g.node("Gather", [t.name(weight, np.float32, 1), t.name(indices)], axis=0))


# The other rule modules, in their own files for size, register into the same table.
from everyo.onnx import indexing_rules, layer_rules, loss_rules, recurrent_rules, reduction_rules  # noqa: E402,F401
