"""Record a model's forward pass as a graph of primitive ops.

Core calls ``Tracer.record(name, inputs, outputs, attrs)`` after every
outermost primitive while the tracer is installed (``everyo.dispatch``'s op
table). Each Tensor seen becomes a :class:`Value`:

- an **input**: one of the example inputs the model was called with;
- a **node output**: produced by a recorded op that depends on an input;
- a **constant**: anything else (parameters, buffers, literals, and every op
  computed only from constants, folded here into its recorded value).

Every node keeps the user's source line that led to it (the first frame
outside the ``everyo`` package), so a refusal can say where the op came from.
"""

import os
import sys

import numpy as np

import everyo
from everyo import dispatch
from everyo.errors import EveryOSerializationError
from everyo.tensor import Tensor

# Every folder of the everyo namespace (core and the add-ons): frames from
# these files are library code, not the user's.
_LIBRARY_DIRS = tuple(os.path.normcase(os.path.abspath(p)) + os.sep for p in everyo.__path__)


def user_line():
    """``file:line in function`` of the innermost caller outside the everyo
    package, plus the core layer it is inside (``in LSTM.forward``) if any."""
    frame = sys._getframe(1)
    layer = None
    while frame is not None:
        filename = os.path.normcase(os.path.abspath(frame.f_code.co_filename))
        if not filename.startswith(_LIBRARY_DIRS):
            where = f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"
            return where + (f" (inside {layer})" if layer else "")
        if layer is None and frame.f_code.co_name == "forward":
            owner = frame.f_locals.get("self")
            if owner is not None:
                layer = f"{type(owner).__name__}.forward"
        frame = frame.f_back
    return "<unknown>"


class Value:
    """One Tensor as the graph sees it."""

    __slots__ = ("kind", "node", "index", "name", "data", "array", "tensor")

    def __init__(self, kind, tensor, node=None, index=0, name=None):
        self.kind = kind  # "input", "node" or "const"
        self.tensor = tensor  # kept alive so its id() cannot be reused during the trace
        self.node, self.index = node, index
        self.name = name  # parameter/buffer name for constants, graph name for inputs
        self.array = tensor.data  # the array object seen (its .base shows slices of a bigger table)
        self.data = np.array(tensor.data, copy=True)  # the recorded value

    @property
    def dynamic(self):
        return self.kind != "const"

    @property
    def shape(self):
        return self.data.shape

    @property
    def dtype(self):
        return self.data.dtype

    def __repr__(self):
        return f"Value({self.kind}, {self.name or ''}{self.data.shape}, {self.data.dtype})"


class Node:
    """One recorded primitive call."""

    __slots__ = ("index", "op", "inputs", "outputs", "attrs", "line")

    def __init__(self, index, op, inputs, attrs, line):
        self.index, self.op, self.inputs, self.attrs, self.line = index, op, inputs, attrs, line
        self.outputs = []

    def describe(self):
        return f"op '{self.op}' (node {self.index}) at {self.line}"

    def __repr__(self):
        return f"Node({self.index}, {self.op})"


class Tracer:
    """The recorder core's op table reports to (see ``everyo.dispatch``).

    Args:
        names: ``{id(tensor): name}`` for the model's parameters and buffers,
            so their constants keep readable names.
    """

    def __init__(self, names=None):
        self.names = dict(names or {})
        self.values = {}  # id(tensor) -> Value
        self.nodes = []
        self.inputs = []  # Values, in the model's argument order
        self.consumers = {}  # id(Value) -> [(node, position)]

    # --- building ----------------------------------------------------------------
    def add_input(self, tensor, name):
        value = Value("input", tensor, name=name)
        self.values[id(tensor)] = value
        self.inputs.append(value)
        return value

    def value_of(self, tensor):
        """The Value for ``tensor``, made a constant if it was never seen."""
        value = self.values.get(id(tensor))
        if value is None:
            value = Value("const", tensor, name=self.names.get(id(tensor)))
            self.values[id(tensor)] = value
        return value

    def record(self, name, inputs, outputs, attrs):
        ins = [None if t is None else self.value_of(t) for t in inputs]
        dynamic = any(v is not None and v.dynamic for v in ins)
        # An op that hands back its own input (dropout in eval mode, astype to
        # the same dtype) adds nothing to the graph.
        if all(id(t) in self.values for t in outputs):
            return
        if not dynamic:
            # Computed from constants only: folded into the recorded result.
            for t in outputs:
                self.value_of(t)
            return
        node = Node(len(self.nodes), name, ins, dict(attrs), user_line())
        for k, t in enumerate(outputs):
            if id(t) in self.values:  # an input passed through as one of several outputs
                value = self.values[id(t)]
            else:
                value = Value("node", t, node=node, index=k)
                self.values[id(t)] = value
            node.outputs.append(value)
        for position, v in enumerate(ins):
            if v is not None:
                self.consumers.setdefault(id(v), []).append((node, position))
        self.nodes.append(node)

    def on_python_value(self, tensor, kind):
        value = self.values.get(id(tensor))
        if value is None or not value.dynamic:
            return  # a constant's value is the same in every run
        origin = value.node.describe() if value.node is not None else f"graph input '{value.name}'"
        raise EveryOSerializationError(
            f"cannot export: the model converts a traced tensor to a Python {kind} at {user_line()} "
            f"(the tensor comes from {origin}). Its value depends on the input, so a fixed graph cannot "
            f"follow it (data-dependent control flow); compute with EveryO ops instead (e.g. eo.where), "
            f"or move the decision out of forward(). Nothing was written"
        )

    # --- checks after the forward pass ---------------------------------------------
    def changed_in_place(self):
        """``(value, consumer)`` for the first Tensor whose ``.data`` changed
        after the tracer saw it, or None."""
        for value in self.values.values():
            t = value.tensor
            if t.data is not value.array or not np.array_equal(t.data, value.data, equal_nan=True):
                users = self.consumers.get(id(value))
                return value, (users[0][0] if users else value.node)
        return None

    def consumers_of(self, value):
        return self.consumers.get(id(value), [])


def trace(model, inputs, input_names, names):
    """Run ``model(*inputs)`` under a fresh tracer, in eval mode, with autograd
    and any autocast policy off. Returns ``(tracer, outputs)`` where outputs is
    the flat list of output Tensors. The model's modes are restored."""
    tracer = Tracer(names)
    tensors = [x if isinstance(x, Tensor) else Tensor(x) for x in inputs]
    for t, name in zip(tensors, input_names):
        tracer.add_input(t, name)
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    policy_token = dispatch.set_policy(None)
    tracer_token = dispatch.set_tracer(tracer)
    try:
        with everyo.no_grad():
            result = model(*tensors)
    finally:
        dispatch.reset_tracer(tracer_token)
        dispatch.reset_policy(policy_token)
        for m, mode in modes:
            object.__setattr__(m, "training", mode)
    return tracer, flatten_outputs(result)


def flatten_outputs(result):
    """A model's return value (a Tensor, or nested tuples/lists of them) as a flat list."""
    if isinstance(result, Tensor):
        return [result]
    if isinstance(result, (tuple, list)):
        return [t for item in result for t in flatten_outputs(item)]
    raise EveryOSerializationError(
        f"cannot export: forward() returned a {type(result).__name__}; the exporter needs a Tensor or "
        f"a (nested) tuple or list of Tensors"
    )
