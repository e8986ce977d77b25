"""``getitem`` with NumPy's advanced indexing: integer lists and arrays on any
axis (constants, or Tensors computed from the graph's inputs), and boolean
masks that are constants.

The index is rewritten step by step into ONNX's terms:

1. a constant boolean mask over ``k`` axes becomes its ``k`` integer arrays
   (``np.nonzero``), as NumPy itself defines it; a mask computed from the
   input has a data-dependent number of elements and is refused;
2. ``...`` is expanded, and each ``None`` becomes an ``Unsqueeze`` of the
   data plus a full slice there (NumPy gives the same result);
3. the slices (negative steps included) become one ``Slice`` node;
4. the integer arrays, with plain integers counting as 0-d arrays (as in
   NumPy once any array is present), become a ``Gather`` when there is one,
   else a ``GatherND`` on the data with those axes moved to the front. The
   broadcast index dimensions then go where NumPy puts them: in place of the
   indexed axes when those are adjacent, first otherwise.

Negative indices stay negative: ``Gather`` and ``GatherND`` count them from
the end of the axis at run time, so ``x[:, [-1]]`` keeps meaning "the last
position" on a dynamic axis.
"""

from __future__ import annotations

import numpy as np

from everyo.onnx.graph import INT64_MAX
from everyo.onnx.symbolic import SymInt


def is_advanced(item):
    """Whether one item of an index makes it an advanced index."""
    return isinstance(item, (list, np.ndarray, bool, np.bool_)) or hasattr(item, "data")


def _partner_items(t, node):
    other = t.partner_node(node)
    if other is None:
        return None
    index = other.attrs["index"]
    return list(index) if isinstance(index, tuple) else [index]


def _resolve(t, node, position, item, partner):
    """``("const", ndarray)`` or ``("value", Value)`` for an advanced item."""
    if isinstance(item, (bool, np.bool_)):
        raise t.refuse(
            f"index item {position} is the Python bool {item!r}; a scalar boolean index has no ONNX "
            f"translation (use None to add an axis)"
        )
    if hasattr(item, "data"):  # a Tensor: traced (computed from the inputs) or a constant
        value = t.tracer.values.get(id(item)) or t.tracer.value_of(item)
        if value.dynamic:
            if value.dtype.kind == "b":
                raise t.refuse(
                    f"index item {position} is a boolean mask computed from the input (shape {value.shape}); "
                    f"the number of elements it selects depends on the data, so the result has no static "
                    f"shape. Keep every element and mask instead (eo.where(mask, x, 0), x.masked_fill(~mask, "
                    f"value)), or apply the mask outside forward()"
                )
            if value.dtype.kind not in "iu":
                raise t.refuse(f"index item {position} has dtype {value.dtype}; indices must be integers")
            return "value", value
        array = value.data
    else:
        array = np.asarray(item)
    other = None if partner is None or position >= len(partner) else partner[position]
    if other is not None:
        other = np.asarray(getattr(other, "data", other))
        if other.shape != array.shape or not np.array_equal(other, array):
            raise t.refuse(
                f"index item {position} is a constant array (shape {array.shape}) that differs between a "
                f"trace at the example's sizes/data and one at other sizes/data ({other.shape}): it was "
                f"computed outside the graph (from .data, .shape or NumPy) and would be baked in. Compute it "
                f"with EveryO ops from the input, or leave that axis out of dynamic_axes"
            )
    if array.dtype.kind not in "iub" or array.dtype == object:
        raise t.refuse(f"index item {position} has dtype {array.dtype}; indices must be integers or booleans")
    return "const", array


def _expand(t, node, items, ndim):
    """Items with masks split, ``...`` expanded and the list padded: a list
    of slices, ints, None and ``(kind, payload)`` pairs, one per axis of the
    data once the None axes are inserted."""
    partner = _partner_items(t, node)
    flat = []
    for position, item in enumerate(items):
        if not is_advanced(item):
            flat.append(item)
            continue
        kind, payload = _resolve(t, node, position, item, partner)
        if kind == "const" and payload.dtype.kind == "b":
            if payload.ndim == 0:
                raise t.refuse(f"index item {position} is a 0-d boolean array, which has no ONNX translation")
            flat.extend(("const", a) for a in np.nonzero(payload))
        else:
            flat.append((kind, payload))
    used = sum(1 for i in flat if i is not None and i is not Ellipsis)
    if Ellipsis in flat:
        k = flat.index(Ellipsis)
        flat = flat[:k] + [slice(None)] * (ndim - used) + flat[k + 1 :]
    return flat + [slice(None)] * (ndim - used)


def _index_name(t, item):
    kind, payload = item
    if kind == "int":  # a plain (or symbolic) integer: a 0-d index
        return t.g.squeeze(t.size(payload), [0])
    if kind == "const":
        return t.g.constant(np.asarray(payload, dtype=np.int64), "index")
    return t.name(payload, np.int64)


def translate(t, node, items):
    """Bind the output of a ``getitem`` node whose index has an advanced part."""
    x, out = node.inputs[0], node.outputs[0]
    flat = _expand(t, node, items, x.data.ndim)
    name = t.name(x)
    news = [k for k, item in enumerate(flat) if item is None]
    if news:
        name = t.g.unsqueeze(name, news)
        flat = [slice(None) if item is None else item for item in flat]
    starts, ends, axes, steps = [], [], [], []
    for axis, item in enumerate(flat):
        if isinstance(item, slice) and item != slice(None):
            step = 1 if item.step is None else item.step
            lo = item.start if item.start is not None else (0 if step > 0 else INT64_MAX)
            hi = item.stop if item.stop is not None else (INT64_MAX if step > 0 else -INT64_MAX)
            starts.append(lo), ends.append(hi), axes.append(axis), steps.append(step)
    if axes:
        # Bounds taken from x.shape (SymInts) are computed in the graph, as in basic indexing.
        name = t.g.node("Slice", [name, t.sizes(starts), t.sizes(ends), t.g.ints(axes), t.sizes(steps)])
    picked = [
        (axis, item if isinstance(item, tuple) else ("int", item))
        for axis, item in enumerate(flat)
        if not isinstance(item, slice)
    ]
    positions = [axis for axis, _ in picked]
    if len(picked) == 1:
        ((axis, item),) = picked
        t.set(out, t.g.node("Gather", [name, _index_name(t, item)], axis=axis))
        return
    shapes = [p.shape if k == "value" else np.shape(p) for _, (k, p) in picked]
    rank = len(np.broadcast_shapes(*shapes))
    if all(k == "const" or (k == "int" and not isinstance(p, SymInt)) for _, (k, p) in picked):
        arrays = np.broadcast_arrays(*[np.asarray(int(p) if k == "int" else p, dtype=np.int64) for _, (k, p) in picked])
        index = t.g.constant(np.stack(arrays, axis=-1), "index")
    else:
        names = [_index_name(t, item) for _, item in picked]
        # zeros of the broadcast shape (Sum has no int64 kernel: a chain of Adds)
        zeros = [t.g.node("Mul", [n, t.g.scalar(0, np.int64, "zero")]) for n in names]
        zero = zeros[0]
        for other in zeros[1:]:
            zero = t.g.node("Add", [zero, other])
        parts = [t.g.unsqueeze(t.g.node("Add", [n, zero]), [rank]) for n in names]
        index = t.g.node("Concat", parts, axis=-1)
    rest = [axis for axis in range(len(flat)) if axis not in positions]
    perm = positions + rest
    if perm != list(range(len(flat))):
        name = t.g.transpose(name, perm)
    name = t.g.node("GatherND", [name, index])
    adjacent = positions == list(range(positions[0], positions[0] + len(positions)))
    if adjacent and positions[0] > 0:
        first = positions[0]
        after = [rank + j for j in range(len(rest))]
        name = t.g.transpose(name, after[:first] + list(range(rank)) + after[first:])
    t.set(out, name)
