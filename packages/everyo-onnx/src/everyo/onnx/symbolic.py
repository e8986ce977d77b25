"""Symbolic sizes while tracing: ``x.shape`` that the graph can follow.

While the exporter traces, every Tensor computed from a graph input is a
:class:`TracedTensor`: the tracer switches its class when it records it and
switches it back when the trace ends, so eager code never sees one and pays
nothing. Its ``shape`` gives :class:`SymInt` entries on the axes that can
change size (every axis of an intermediate, the ``dynamic_axes`` of an
input). A SymInt *is* the Python int of the traced size (NumPy, ``range``
and slicing take it as one) and also remembers where it came from, so that

- arithmetic on it (``+ - * // %``, negation) gives SymInts;
- an op called with SymInts among its arguments (``reshape(B, T, -1)``,
  ``x[:, :T]``, ``eo.arange(T)``) is recorded with them, and its rule
  computes those numbers in the graph (``Shape``/``Slice``/``Add``/``Range``)
  instead of writing the traced ones in;
- a comparison gives a :class:`SymBool`, whose truth value, taken by the
  user's code, is noted: by an ``assert`` as a **guard** (a condition on the
  input sizes the graph needs, kept in the exported file), by anything else
  (``if``, ``while``, ``and``) as a **decision**. After the two traces the
  exporter refuses a decision whose operands changed with the dynamic axes,
  naming the line (see :func:`everyo.onnx.dynamic.same_decisions`).

``len(x)`` cannot be followed: Python's ``len()`` always returns a plain
int. Write ``x.shape[0]``.
"""

from __future__ import annotations

import dis
import linecache
import operator
import os
import sys

from everyo import dispatch
from everyo.tensor import Tensor

_LIBRARY_DIRS: tuple[str, ...] = ()


def _library_dirs():
    global _LIBRARY_DIRS
    if not _LIBRARY_DIRS:
        import everyo

        _LIBRARY_DIRS = tuple(os.path.normcase(os.path.abspath(p)) + os.sep for p in everyo.__path__)
    return _LIBRARY_DIRS


def _is_library(frame):
    return os.path.normcase(os.path.abspath(frame.f_code.co_filename)).startswith(_library_dirs())


# --- sizes ---------------------------------------------------------------------------------
_ARITHMETIC = {
    "add": ("+", operator.add),
    "sub": ("-", operator.sub),
    "mul": ("*", operator.mul),
    "floordiv": ("//", operator.floordiv),
    "mod": ("%", operator.mod),
}
_COMPARISONS = {
    "lt": ("<", operator.lt),
    "le": ("<=", operator.le),
    "gt": (">", operator.gt),
    "ge": (">=", operator.ge),
    "eq": ("==", operator.eq),
    "ne": ("!=", operator.ne),
}


class SymInt(int):
    """A traced size: the int it was in this trace, plus how it is computed.

    ``expr`` is ``("dim", value, axis)`` (axis ``axis`` of the traced
    ``value``), ``(op, a, b)`` for ``op`` in add, sub, mul, floordiv, mod
    (``a``, ``b`` SymInts or ints), or ``("neg", a)``.
    """

    expr: tuple

    def __new__(cls, concrete, expr):
        self = super().__new__(cls, concrete)
        self.expr = expr
        return self

    __hash__ = int.__hash__

    def __repr__(self):
        return f"SymInt({int(self)}, {describe(self)})"

    def __neg__(self):
        return SymInt(-int(self), ("neg", self))

    def __pos__(self):
        return self


def _arithmetic(name):
    _, fn = _ARITHMETIC[name]

    def forward(self, other):
        if not isinstance(other, int) or isinstance(other, bool):
            return fn(int(self), other)  # floats, arrays: an ordinary number from here on
        return SymInt(fn(int(self), int(other)), (name, self, other))

    def reflected(self, other):
        if not isinstance(other, int) or isinstance(other, bool):
            return fn(other, int(self))
        return SymInt(fn(int(other), int(self)), (name, other, self))

    return forward, reflected


def _comparison(name):
    _, fn = _COMPARISONS[name]

    def compare(self, other):
        if not isinstance(other, int) or isinstance(other, bool):
            return fn(int(self), other)
        return SymBool(name, self, other)

    return compare


for _name in _ARITHMETIC:
    _forward, _reflected = _arithmetic(_name)
    setattr(SymInt, f"__{_name}__", _forward)
    setattr(SymInt, f"__r{_name}__", _reflected)
for _name in _COMPARISONS:
    setattr(SymInt, f"__{_name}__", _comparison(_name))
del _name, _forward, _reflected


def concrete(x):
    """``x`` with every SymInt replaced by its plain int (tuples, lists and slices looked into)."""
    if isinstance(x, SymInt):
        return int(x)
    if isinstance(x, (tuple, list)):
        return type(x)(concrete(v) for v in x)
    if isinstance(x, slice):
        return slice(concrete(x.start), concrete(x.stop), concrete(x.step))
    return x


def describe(x, dim_name=None):
    """A SymInt as text: ``x.shape[1]``-like leaves (or the dynamic axis names
    ``dim_name(value, axis)`` gives), operators in between."""
    if not isinstance(x, SymInt):
        return str(x)
    e = x.expr
    if e[0] == "dim":
        value, axis = e[1], e[2]
        name = dim_name(value, axis) if dim_name is not None else (value.axes or {}).get(axis)
        return name or f"{value.name or 'shape'}[{axis}]"
    if e[0] == "neg":
        return f"-{describe(e[1], dim_name)}"
    return f"({describe(e[1], dim_name)} {_ARITHMETIC[e[0]][0]} {describe(e[2], dim_name)})"


def leaves(x):
    """The ``(value, axis)`` leaves a SymInt is computed from."""
    if not isinstance(x, SymInt):
        return []
    e = x.expr
    if e[0] == "dim":
        return [(e[1], e[2])]
    return [leaf for part in e[1:] for leaf in leaves(part)]


# --- truth values ---------------------------------------------------------------------------
_ASSERT_JUMPS = frozenset({"POP_JUMP_IF_TRUE", "POP_JUMP_FORWARD_IF_TRUE", "POP_JUMP_BACKWARD_IF_TRUE"})
_instructions: dict = {}


def _in_assert(frame):
    """Whether ``frame`` is taking a truth value for an ``assert`` statement:
    the jump-if-true right after it skips a ``LOAD_ASSERTION_ERROR``, or (for
    asserts another tool rewrote, as pytest does in test files) the source
    line is an assert."""
    code = frame.f_code
    if linecache.getline(code.co_filename, frame.f_lineno).lstrip().startswith("assert "):
        return True
    ins = _instructions.get(code)
    if ins is None:
        ins = _instructions[code] = list(dis.get_instructions(code))
    k = next((j for j, i in enumerate(ins) if i.offset == frame.f_lasti), None)
    if k is None:
        return False
    window = ins[k : k + 4]
    return any(a.opname in _ASSERT_JUMPS and b.opname == "LOAD_ASSERTION_ERROR" for a, b in zip(window, window[1:]))


class SymBool:
    """The result of comparing a SymInt; its truth value is noted by the tracer."""

    __slots__ = ("op", "left", "right", "value")

    def __init__(self, op, left, right):
        self.op, self.left, self.right = op, left, right
        self.value = _COMPARISONS[op][1](int(left), int(right))

    def text(self, dim_name=None):
        return f"{describe(self.left, dim_name)} {_COMPARISONS[self.op][0]} {describe(self.right, dim_name)}"

    def __repr__(self):
        return f"SymBool({self.text()} is {self.value})"

    def __bool__(self):
        frame = sys._getframe(1)
        tracer = dispatch.get_tracer()
        if tracer is None or _is_library(frame) or not hasattr(tracer, "on_decision"):
            return self.value
        where = f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"
        return tracer.on_decision(self, where, _in_assert(frame))


# --- the traced tensor ---------------------------------------------------------------------
class TracedTensor(Tensor):
    """The class a Tensor has while a tracer records it (see the module docstring)."""

    __slots__ = ()

    @property
    def shape(self):
        """The shape, with SymInt entries on the axes that can change size."""
        tracer = dispatch.get_tracer()
        if tracer is None or dispatch.inside_primitive():
            return self.data.shape
        return tracer.symbolic_shape(self)

    def __len__(self):
        tracer = dispatch.get_tracer()
        if tracer is not None and hasattr(tracer, "on_len") and not dispatch.inside_primitive():
            frame = sys._getframe(1)
            if not _is_library(frame):
                tracer.on_len(self, f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}")
        return len(self.data)


def attach(tensor):
    """Make ``tensor`` a TracedTensor (only a plain Tensor; Parameter and other subclasses stay)."""
    if type(tensor) is Tensor:
        tensor.__class__ = TracedTensor


def detach(tensor):
    if type(tensor) is TracedTensor:
        tensor.__class__ = Tensor


def symbolic_parts(x, found):
    """Append to ``found`` every SymInt and Tensor inside an op's attribute
    ``x`` (tuples, lists, slices and dicts looked into)."""
    if isinstance(x, (SymInt, Tensor)):
        found.append(x)
    elif isinstance(x, (tuple, list)):
        for v in x:
            symbolic_parts(v, found)
    elif isinstance(x, slice):
        symbolic_parts((x.start, x.stop, x.step), found)
    elif isinstance(x, dict):
        symbolic_parts(list(x.values()), found)
    return found
