"""The ONNX graph being built from a trace: nodes, initializers, names.

Rules (``rules.py``) only append to one ``GraphBuilder``. Names are made from
counters, so two traces of the same model give node-for-node identical
graphs: that is how the dynamic-axes check compares them. Every ONNX node
remembers the recorded op it came from (``origins``), so a problem found in
the finished graph can still name the op and the user's source line.
"""

import numpy as np

# NHWC <-> NCHW permutations for the Transpose pair around Conv and the pools.
TO_NCHW = (0, 3, 1, 2)
TO_NHWC = (0, 2, 3, 1)

# Largest int64, for Slice ends that mean "to the end".
INT64_MAX = np.iinfo(np.int64).max

_ONNX_TYPES = {
    np.dtype(np.float32): 1,
    np.dtype(np.uint8): 2,
    np.dtype(np.int8): 3,
    np.dtype(np.int16): 5,
    np.dtype(np.int32): 6,
    np.dtype(np.int64): 7,
    np.dtype(np.bool_): 9,
    np.dtype(np.float16): 10,
    np.dtype(np.float64): 11,
    np.dtype(np.uint32): 12,
    np.dtype(np.uint64): 13,
}


def onnx_type(dtype):
    """The ``TensorProto`` element type of a NumPy dtype."""
    return _ONNX_TYPES[np.dtype(dtype)]


class GraphBuilder:
    """Collects ONNX nodes and initializers for one trace.

    Args:
        opset: the opset the graph is written for (rules pick node forms by it).
    """

    def __init__(self, opset):
        self.opset = opset
        self.nodes = []
        self.origins = []  # the recorded Node behind each ONNX node
        self.initializers = {}  # name -> array
        self.names = {}  # id(Value) -> ONNX value name
        self.layout_changed = set()  # names whose values a rewrite moved to another layout
        self._taken = set()
        self._count = 0
        self.origin = None  # the recorded Node whose rule is running

    # --- names ------------------------------------------------------------------
    def fresh(self, base):
        base = base.replace(" ", "_")
        name, k = base, 1
        while name in self._taken:
            k += 1
            name = f"{base}_{k}"
        self._taken.add(name)
        return name

    def reserve(self, name):
        self._taken.add(name)
        return name

    # --- initializers --------------------------------------------------------------
    def constant(self, array, base="const"):
        """An initializer holding ``array`` (its dtype kept); returns its name."""
        array = np.array(array, order="C")  # (np.ascontiguousarray would make a 0-d array 1-d)
        name = self.fresh(base)
        self.initializers[name] = array
        return name

    def ints(self, values, base="ints"):
        return self.constant(np.asarray(values, dtype=np.int64).reshape(-1), base)

    def scalar(self, value, dtype, base="scalar"):
        return self.constant(np.asarray(value, dtype=dtype), base)

    # --- nodes -------------------------------------------------------------------------
    def node(self, op_type, inputs, outputs=1, **attributes):
        """Append one node; returns its output name (or the list of names when
        ``outputs`` > 1). Empty-string inputs are ONNX's "omitted"."""
        from onnx import helper

        self._count += 1
        label = self.origin.op if self.origin is not None else "graph"
        stem = f"n{self._count}_{label}_{op_type}"
        names = [self.fresh(stem if outputs == 1 else f"{stem}_{k}") for k in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), names, name=stem, **attributes))
        self.origins.append(self.origin)
        return names[0] if outputs == 1 else names

    def transpose(self, value, perm):
        return self.node("Transpose", [value], perm=[int(p) for p in perm])

    def unsqueeze(self, value, axes):
        return self.node("Unsqueeze", [value, self.ints(axes, "axes")])

    def squeeze(self, value, axes):
        return self.node("Squeeze", [value, self.ints(axes, "axes")])

    def reduce(self, op_type, value, axes, keepdims):
        """A Reduce* node; ``axes`` moved from attribute to input in opset 18
        (13 for ReduceSum)."""
        axes = [int(a) for a in axes]
        keep = int(bool(keepdims))
        if op_type == "ReduceSum" or self.opset >= 18:
            return self.node(op_type, [value, self.ints(axes, "axes")], keepdims=keep)
        return self.node(op_type, [value], axes=axes, keepdims=keep)

    def cast(self, value, dtype):
        return self.node("Cast", [value], to=onnx_type(dtype))
