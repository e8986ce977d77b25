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

An op whose *attributes* hold a traced Tensor (``table[idx]`` with ``idx``
an input) or a traced size (a :class:`~everyo.onnx.symbolic.SymInt`, as in
``x[:, :T]``) depends on the input too: it is recorded, with those as its
``deps``, never folded. While tracing, every recorded Tensor is a
:class:`~everyo.onnx.symbolic.TracedTensor` (symbolic ``shape``); the
classes are switched back when the trace ends.
"""

import os
import sys

import numpy as np

import everyo
from everyo import dispatch
from everyo.errors import EveryOSerializationError
from everyo.onnx import nesting, symbolic
from everyo.onnx.symbolic import SymInt
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

    __slots__ = ("kind", "node", "index", "name", "data", "array", "tensor", "axes", "sym_shape")

    def __init__(self, kind, tensor, node=None, index=0, name=None):
        self.kind = kind  # "input", "node" or "const"
        self.axes = None  # an input's dynamic axes, {axis: name} (None: every axis may change size)
        self.sym_shape = None  # the shape with SymInts, made on first use
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

    __slots__ = ("index", "op", "inputs", "outputs", "attrs", "line", "deps")

    def __init__(self, index, op, inputs, attrs, line, deps=()):
        self.index, self.op, self.inputs, self.attrs, self.line = index, op, inputs, attrs, line
        self.outputs = []
        self.deps = list(deps)  # traced Values its attributes use (an index tensor, the leaves of a SymInt)

    def describe(self):
        return f"op '{self.op}' (node {self.index}) at {self.line}"

    def __repr__(self):
        return f"Node({self.index}, {self.op})"


class Decision:
    """A truth value the user's code took of a comparison of sizes."""

    __slots__ = ("condition", "line", "is_assert", "operands", "value")

    def __init__(self, condition, line, is_assert):
        self.condition, self.line, self.is_assert = condition, line, is_assert
        self.operands = (int(condition.left), int(condition.right))
        self.value = condition.value


class GuardFailed(Exception):
    """Raised by a check trace whose sizes break one of the model's asserts."""

    def __init__(self, decision):
        super().__init__(f"assert {decision.condition.text()} fails at {decision.line}")
        self.decision = decision


class Tracer:
    """The recorder core's op table reports to (see ``everyo.dispatch``).

    Args:
        names: ``{id(tensor): name}`` for the model's parameters and buffers,
            so their constants keep readable names.
        check: True for the exporter's check trace (other sizes): an
            ``assert`` on sizes that fails there raises :class:`GuardFailed`,
            so the exporter can pick other sizes.
    """

    def __init__(self, names=None, check=False):
        self.names = dict(names or {})
        self.check = check
        self.values = {}  # id(tensor) -> Value
        self.nodes = []
        self.inputs = []  # Values, in the model's argument order
        self.consumers = {}  # id(Value) -> [(node, position)]
        self.decisions = []  # Decision, in the order the code took them
        self.len_lines = []  # where the user's code took len() of a tensor whose first axis may change
        self.output_spec = None  # the nesting of forward()'s result (everyo.onnx.nesting)
        self.writes = {}  # id(tensor) -> (tensor, the user's line of its first in-place change while tracing)

    # --- building ----------------------------------------------------------------
    def add_input(self, tensor, name, axes=None):
        value = Value("input", tensor, name=name)
        value.axes = None if axes is None else dict(axes)
        self.values[id(tensor)] = value
        self.inputs.append(value)
        symbolic.attach(tensor)
        return value

    def value_of(self, tensor):
        """The Value for ``tensor``, made a constant if it was never seen."""
        value = self.values.get(id(tensor))
        if value is None:
            value = Value("const", tensor, name=self.names.get(id(tensor)))
            self.values[id(tensor)] = value
        return value

    def _deps(self, attrs):
        """The traced Values an op's attributes use (index tensors, SymInt leaves)."""
        deps = []
        for part in symbolic.symbolic_parts(list(attrs.values()), []):
            found = [leaf for leaf, _ in symbolic.leaves(part)] if isinstance(part, SymInt) else [self.value_of(part)]
            deps.extend(v for v in found if v.dynamic and all(v is not d for d in deps))
        return deps

    def record(self, name, inputs, outputs, attrs):
        ins = [None if t is None else self.value_of(t) for t in inputs]
        deps = self._deps(attrs)
        dynamic = bool(deps) or any(v is not None and v.dynamic for v in ins)
        # An op that hands back its own input (dropout in eval mode, astype to
        # the same dtype) adds nothing to the graph.
        if all(id(t) in self.values for t in outputs):
            return
        if not dynamic:
            # Computed from constants only: folded into the recorded result.
            for t in outputs:
                self.value_of(t)
            return
        node = Node(len(self.nodes), name, ins, dict(attrs), user_line(), deps)
        for k, t in enumerate(outputs):
            if id(t) in self.values:  # an input passed through as one of several outputs
                value = self.values[id(t)]
            else:
                value = Value("node", t, node=node, index=k)
                self.values[id(t)] = value
                symbolic.attach(t)
            node.outputs.append(value)
        for position, v in enumerate(ins):
            if v is not None:
                self.consumers.setdefault(id(v), []).append((node, position))
        for v in deps:
            self.consumers.setdefault(id(v), []).append((node, None))
        self.nodes.append(node)

    def scalar_operand(self, number, tensor):
        """Core wrapped ``number``, a Python number operand, as the constant
        ``tensor``; a traced size (``x / x.shape[1]``) is recorded as a
        ``size`` node computing it from the shapes, so it is not a constant."""
        if not isinstance(number, SymInt):
            return
        deps = []
        for leaf, _ in symbolic.leaves(number):
            if all(leaf is not d for d in deps):
                deps.append(leaf)
        node = Node(len(self.nodes), "size", [], {"value": number}, user_line(), deps)
        value = Value("node", tensor, node=node)
        self.values[id(tensor)] = value
        node.outputs.append(value)
        for v in deps:
            self.consumers.setdefault(id(v), []).append((node, None))
        self.nodes.append(node)

    def symbolic_shape(self, tensor):
        """``tensor.shape`` with a SymInt on every axis that may change size."""
        value = self.values.get(id(tensor))
        if value is None or not value.dynamic:
            return tensor.data.shape
        if value.sym_shape is None or len(value.sym_shape) != value.data.ndim:
            value.sym_shape = tuple(
                SymInt(n, ("dim", value, axis)) if value.axes is None or axis in value.axes else int(n)
                for axis, n in enumerate(value.data.shape)
            )
        return value.sym_shape

    def on_len(self, tensor, line):
        """The user's code takes ``len(tensor)``: a plain int, which the graph cannot follow."""
        value = self.values.get(id(tensor))
        if value is not None and value.dynamic and (value.axes is None or 0 in value.axes):
            if line not in self.len_lines:
                self.len_lines.append(line)

    def on_decision(self, condition, line, is_assert):
        """The user's code takes the truth value of a comparison of sizes."""
        decision = Decision(condition, line, is_assert)
        self.decisions.append(decision)
        if is_assert and not decision.value and self.check:
            raise GuardFailed(decision)
        return decision.value

    def on_write(self, tensor):
        self.writes.setdefault(id(tensor), (tensor, user_line()))

    def written_at(self, tensor):
        """The user's line that first changed ``tensor`` in place during the trace, or None."""
        entry = self.writes.get(id(tensor))
        return entry[1] if entry is not None and entry[0] is tensor else None

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


def trace(model, inputs, input_names, names, axes=None, tracer=None, spec=None):
    """Run ``model(*args)`` under a fresh tracer, in eval mode, with autograd
    and any autocast policy off; ``args`` are the flat ``inputs`` nested as
    ``spec`` says (:mod:`everyo.onnx.nesting`; default: one argument each).
    Returns ``(tracer, outputs)`` where outputs is the flat list of output
    Tensors (``tracer.output_spec`` holds their nesting). The model's modes
    are restored.

    ``axes`` is ``{input name: {axis: dim name}}`` (the dynamic axes; an
    input's other axes keep plain int sizes); ``tracer`` a fresh Tracer to use
    (the caller keeps what it recorded even when the forward pass raises)."""
    tracer = Tracer(names) if tracer is None else tracer
    tensors = [x if isinstance(x, Tensor) else Tensor(x) for x in inputs]
    args = tuple(tensors) if spec is None else nesting.unflatten(spec, iter(tensors))
    for t, name in zip(tensors, input_names):
        tracer.add_input(t, name, None if axes is None else axes.get(name, {}))
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    policy_token = dispatch.set_policy(None)
    tracer_token = dispatch.set_tracer(tracer)
    try:
        with everyo.no_grad():
            result = model(*args)
    finally:
        dispatch.reset_tracer(tracer_token)
        dispatch.reset_policy(policy_token)
        for value in tracer.values.values():
            symbolic.detach(value.tensor)
        for m, mode in modes:
            object.__setattr__(m, "training", mode)
    try:
        outputs, tracer.output_spec = nesting.outputs(result)
    except EveryOSerializationError as exc:
        hint = " (forward() returned None: does it end with a return statement?)" if result is None else ""
        raise EveryOSerializationError(f"{exc}{hint}; forward is {_forward_at(model)}") from None
    return tracer, outputs


def _forward_at(model):
    """``Class.forward at file:line`` of the model's forward method."""
    forward = getattr(type(model), "forward", None)
    code = getattr(forward, "__code__", None)
    if code is None:
        return f"{type(model).__name__}.forward"
    return f"{type(model).__name__}.forward at {code.co_filename}:{code.co_firstlineno}"


def eager_outputs(model, inputs, spec=None):
    """``model(*args)`` run by EveryO itself (no tracer), in eval mode with
    autograd and autocast off, as the flat list of output arrays; modes
    restored. ``args`` are the flat ``inputs`` nested as ``spec`` says."""
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    policy_token = dispatch.set_policy(None)
    tensors = [Tensor(x) for x in inputs]
    args = tuple(tensors) if spec is None else nesting.unflatten(spec, iter(tensors))
    try:
        with everyo.no_grad():
            result = model(*args)
    finally:
        dispatch.reset_policy(policy_token)
        for m, mode in modes:
            object.__setattr__(m, "training", mode)
    return [np.asarray(t.data) for t in nesting.outputs(result)[0]]
