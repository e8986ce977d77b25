"""Turn a recorded trace into ONNX nodes, one rule per recorded op.

The exporter traces the model twice: at the example's sizes and again with
every dynamic axis one larger (and fresh input data). The two traces must
record the same ops in the same order; the translation of one consults the
other ("the partner") wherever a recorded number could be a size: a reshape
target, a constant operand. What differs between the traces is either
expressed from the graph's own shapes (a reshape dimension becomes ``0`` or
``-1``, a slice of the positional table ends at the input's length) or
refused, naming the op and the user's line.
"""

import numpy as np

from everyo.errors import EveryOSerializationError
from everyo.onnx.graph import INT64_MAX, GraphBuilder
from everyo.onnx.symbolic import SymInt

SUPPORTED_DTYPES = frozenset(np.dtype(d) for d in (np.float32, np.int64, np.int32, np.bool_))


def _squeezed(shape):
    return tuple(d for d in shape if d != 1)


class Translator:
    """Holds the value -> ONNX name map while the rules run.

    Args:
        tracer: the trace to translate.
        partner: the second trace (same model, other sizes), or None.
        opset: target opset.
    """

    def __init__(self, tracer, partner, opset):
        self.tracer, self.partner = tracer, partner
        self.g = GraphBuilder(opset)
        self.node = None
        self._derived = set()  # constants that are views of a graph input
        self.fused = {}  # id(Value) -> ONNX name, for a value a fused node computes ahead of its own op
        self._sizes = {}  # structural key of a SymInt -> its 1-element int64 ONNX name
        for value in tracer.inputs:
            self.g.names[id(value)] = self.g.reserve(value.name)

    # --- pairing with the other trace -----------------------------------------------
    def partner_node(self, node):
        return None if self.partner is None else self.partner.nodes[node.index]

    def partner_input(self, node, position):
        other = self.partner_node(node)
        return None if other is None else other.inputs[position]

    def varies(self, node, position):
        """Whether input ``position`` of ``node`` differs (in shape or value) between the traces."""
        other = self.partner_input(node, position)
        mine = node.inputs[position]
        if other is None or mine is None:
            return False
        return mine.shape != other.shape or not np.array_equal(mine.data, other.data, equal_nan=True)

    # --- names -------------------------------------------------------------------------
    def set(self, value, name):
        self.g.names[id(value)] = name

    def name(self, value, dtype=None, position=None):
        """The ONNX name holding ``value``, cast to ``dtype`` if given.

        A constant becomes an initializer. ``position`` (the operand's place in
        the current node) lets a constant that differs between the two traces
        be recognised as a view of a graph input; otherwise it is refused."""
        key = id(value)
        if key not in self.g.names:
            if value.kind != "const":
                raise EveryOSerializationError(f"internal: {value!r} used before it was computed")
            self.g.names[key] = self._constant(value, position)
        name = self.g.names[key]
        if dtype is not None and np.dtype(dtype) != value.dtype:
            if value.kind == "const" and key not in self._derived:
                return self.g.constant(value.data.astype(dtype), (value.name or "const") + f"_{np.dtype(dtype).name}")
            return self.g.cast(name, dtype)
        return name

    def _constant(self, value, position):
        derived = self._from_input(value)
        if derived is not None:
            self._derived.add(id(value))
            return derived
        if position is not None and self.varies(self.node, position):
            raise self.refuse(
                f"its operand {position} ({value.name or 'a constant'} of shape {value.shape}) is not computed by "
                f"EveryO ops from the inputs, yet it differs between a trace at the example's sizes and one at "
                f"other sizes/data ({value.shape} vs {self.partner_input(self.node, position).shape}): a size or a "
                f"value made outside the graph (e.g. from x.data, x.shape or a comparison) was baked in. Compute "
                f"it with EveryO ops, or leave that axis out of dynamic_axes"
            )
        data = value.data
        if data.dtype == np.float64:
            data = data.astype(np.float32)  # NumPy float literals; float64 *results* are refused elsewhere
        return self.g.constant(data, value.name or "const")

    def _from_input(self, value):
        """A constant that is a graph input's array seen through ``.data``
        (possibly with axes of size 1 added, e.g. a key padding mask): the input
        itself, reshaped. None if it is not."""
        for inp in self.tracer.inputs:
            a = inp.array
            if value.array is a or (
                value.array.base is a
                and value.array.size == a.size
                and _squeezed(value.shape) == _squeezed(a.shape)
                and np.array_equal(value.data.reshape(a.shape), a)
            ):
                name = self.name(inp)
                if value.shape == inp.shape:
                    return name
                axes = _inserted_axes(inp.shape, value.shape)
                if axes is None:
                    return None
                return self.g.unsqueeze(name, axes)
        return None

    def refuse(self, why):
        where = self.node.describe() if self.node is not None else "the graph"
        return EveryOSerializationError(f"cannot export {where}: {why}. Nothing was written")

    # --- helpers the rules share ------------------------------------------------------------
    def dim(self, name, axis):
        """A 1-element int64 tensor holding ``Shape(name)[axis]``."""
        shape = self.g.node("Shape", [name])
        end = INT64_MAX if axis == -1 else axis + 1
        return self.g.node("Slice", [shape, self.g.ints([axis]), self.g.ints([end]), self.g.ints([0])])

    def size(self, x):
        """A 1-element int64 tensor holding the int or SymInt ``x``, computed in
        the graph from the shapes it came from (``Shape``, ``Slice``, arithmetic)."""
        if not isinstance(x, SymInt):
            return self.g.ints([int(x)], "size")
        key = _key(x)
        name = self._sizes.get(key)
        if name is not None:
            return name
        e = x.expr
        if e[0] == "dim":
            name = self.dim(self.name(e[1]), e[2])
        elif e[0] == "neg":
            name = self.g.node("Neg", [self.size(e[1])])
        else:
            a, b = self.size(e[1]), self.size(e[2])
            if e[0] in ("add", "sub", "mul"):
                name = self.g.node({"add": "Add", "sub": "Sub", "mul": "Mul"}[e[0]], [a, b])
            else:
                # ONNX's integer Mod (fmod=0) takes the divisor's sign, as Python's %; Div truncates,
                # but a - a % b is a multiple of b, so dividing it is exact: Python's //.
                mod = self.g.node("Mod", [a, b], fmod=0)
                name = mod if e[0] == "mod" else self.g.node("Div", [self.g.node("Sub", [a, mod]), b])
        self._sizes[key] = name
        return name

    def sizes(self, values, base="ints"):
        """A 1-D int64 tensor of ``values`` (ints and SymInts): an initializer
        when none is symbolic, else the ``Concat`` of their :meth:`size`."""
        if not any(isinstance(v, SymInt) for v in values):
            return self.g.ints([int(v) for v in values], base)
        return self.g.node("Concat", [self.size(v) for v in values], axis=0)

    def run(self, rules):
        for node in self.tracer.nodes:
            self.node = self.g.origin = node
            for out in node.outputs:
                if out.dtype not in SUPPORTED_DTYPES:
                    hint = " (call model.to('float32'))" if out.dtype.kind == "f" else ""
                    raise self.refuse(
                        f"it produces {out.dtype}; exported graphs compute in float32 with "
                        f"int32/int64/bool indices and masks{hint}"
                    )
            rule = rules.get(node.op)
            if rule is None:
                raise self.refuse(
                    f"there is no ONNX translation rule for '{node.op}' (the exporter translates: "
                    f"{', '.join(sorted(rules))}); compute it with those ops, or register a rule for it "
                    f"(everyo.onnx.registry.rule)"
                )
            rule(self, node)
            missing = [v for v in node.outputs if id(v) not in self.g.names]
            if missing:
                raise EveryOSerializationError(f"internal: rule for {node.op} left {len(missing)} output(s) unset")
        self.node = self.g.origin = None
        return self.g


def _key(x):
    if not isinstance(x, SymInt):
        return int(x)
    e = x.expr
    if e[0] == "dim":
        return ("dim", id(e[1]), e[2])
    return (e[0],) + tuple(_key(part) for part in e[1:])


def _inserted_axes(src, dst):
    """The axes of ``dst`` that are size-1 axes added to ``src`` (for an
    Unsqueeze, which keeps dynamic sizes dynamic), or None if ``dst`` is not
    ``src`` with ones inserted."""
    axes, i = [], 0
    for j, d in enumerate(dst):
        if i < len(src) and d == src[i] and len(dst) - j >= len(src) - i:
            i += 1
        elif d == 1:
            axes.append(j)
        else:
            return None
    return axes if i == len(src) else None
