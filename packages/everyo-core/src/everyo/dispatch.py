"""The op table: every primitive op, its precision category, and the hooks
that add-ons install around it (a precision policy, a tracer).

A *primitive* is a function that computes its output with NumPy and hands
``Tensor._from_op`` the closure mapping the output gradient to its inputs'
gradients (its backward sits beside its forward). Each one is registered
where it is defined::

    @dispatch.primitive("exp", FLOAT32, kind="elementwise")
    def exp(a): ...

and listed in :data:`OPS` (name -> :class:`OpDef`). The wrapper the
decorator builds does three things:

1. routes the Tensor operands through the **precision policy** for the op's
   category (``everyo.amp`` installs one; see below);
2. calls the forward;
3. only while a **tracer** is set, reports the call:
   ``tracer.record(name, inputs, outputs, attrs)``.

Categories (what the policy is asked to do with the operands):

``LOW_PRECISION``  matmul, the fused linear ``x @ W + b``, conv2d (with bias).
``FLOAT32``        reductions (sum, mean, var), exp, log, pow, softmax,
                   log_softmax and every loss.
``None``           runs in its inputs' dtype (mixed float16/float32 binary
                   ops promote to the wider type, as NumPy does). The
                   normalisation op (``normalize``) is one of these: it
                   computes its statistics in float32 itself and returns
                   its input's type.

Kinds (what the op is, so a policy or a tracer can treat a family alike):
see :data:`KINDS`.

Policy: an object with ``cast_inputs(category, tensors) -> tuple of
tensors``. Tracer: an object with ``record(name, inputs, outputs, attrs)``
and ``on_python_value(tensor, kind)``; ``inputs`` are the op's operands in
signature order after the policy's casts (Python scalars and arrays wrapped
as constant Tensors, ``None`` kept), ``outputs`` a tuple of Tensors,
``attrs`` every other argument by name (with defaults filled in and some
resolved, e.g. conv padding as explicit ``pads``). An op may hand back an
input unchanged (``astype`` to the same dtype, ``dropout`` in eval mode):
its output is then that same Tensor (an identity). Only the outermost
primitive is recorded: calls a primitive makes inside itself (``flatten``
calling ``reshape``), and ops the tracer runs inside ``record``, are not.
A tracer may also have ``on_write(tensor)``: called (from
``everyo.autograd.bump_version``) when a Tensor's values are changed in place
through EveryO (``t.data = a``, ``t.data += a``, ``add_`` ...), so an exporter
can name the line that wrote a weight. ``on_python_value`` is called before a Tensor becomes a Python value
(``bool``, ``int``, ``float``, ``index``, ``item``, ``tolist``) outside any
primitive, so a tracer can refuse data-dependent control flow.

Both hooks live in ContextVars, so they are local to a thread and to a
``contextvars`` context. With neither set, a primitive costs one Python call
and one or two ``ContextVar.get`` more than its forward.
"""

from __future__ import annotations

import functools
import inspect
from contextvars import ContextVar, Token
from typing import TYPE_CHECKING, Any

import numpy as np

from everyo.axes import torch_spelling

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import ParamSpec, TypeVar

    from everyo._typing import AnyTensor

    _P = ParamSpec("_P")
    _R = TypeVar("_R")

__all__ = [
    "LOW_PRECISION",
    "FLOAT32",
    "KINDS",
    "OpDef",
    "OPS",
    "primitive",
    "get_policy",
    "set_policy",
    "reset_policy",
    "apply",
    "get_tracer",
    "set_tracer",
    "reset_tracer",
    "inside_primitive",
    "python_value",
]

LOW_PRECISION = "lowp"
FLOAT32 = "float32"

KINDS = frozenset(
    {
        "elementwise",  # one output element from the same element of each (broadcast) input
        "compare",  # elementwise, boolean result, no gradient
        "reduction",  # reduces axes (sum, mean, max, softmax's normaliser ...)
        "shape",  # moves elements without arithmetic (reshape, transpose, split ...)
        "indexing",  # picks elements by index (getitem, gather, embedding ...)
        "matmul",  # products that run on BLAS (matmul, linear, einsum)
        "conv",  # convolutions
        "pool",  # windowed reductions
        "resize",  # spatial up-sampling (nearest repeats, bilinear interpolates)
        "cast",  # dtype conversion
        "random",  # draws random numbers (dropout)
        "loss",  # fused losses (always float32 or wider)
        "fused",  # several steps in one node (rnn/lstm/gru scans, normalize)
        "creation",  # makes a tensor from sizes alone, no tensor operands (arange)
    }
)

# float16/bfloat16 operands of these kinds compute in float32 and round once
# (:mod:`everyo.low_precision`), forward and backward; the ops named in
# _OWN_16BIT_PATH do that themselves, faster (ReLU selects on the 16-bit codes).
FLOAT32_COMPUTE_KINDS = frozenset({"elementwise", "reduction", "random"})
_OWN_16BIT_PATH = frozenset({"relu"})
# Ops of those kinds whose backward reads no operand value (only shapes, or
# arrays it saved itself): their operands' float32 copies are not rebuilt.
# Unary ops whose backward uses their own float32 output: on 16-bit operands
# they keep none, and run their float32 forward again in backward (cheap,
# and the same values), so backward holds 16-bit arrays only.
_RECOMPUTED = frozenset({"tanh", "sigmoid", "sqrt", "exp"})
_READS_NO_OPERAND = frozenset(
    {"add", "sub", "neg", "sum", "mean", "exp", "sqrt", "tanh", "sigmoid", "dropout", "softmax", "log_softmax"}
)
# Binary ops whose backward reads an operand's value only for the *other*
# operand's gradient (d(a*b)/da = b): with 16-bit operands, an operand's float32
# copy is rebuilt for backward only when another operand needs a gradient (for
# ``0.5 * x`` it is not: x's gradient is ``0.5 * g``).
_READS_OTHER_OPERAND = frozenset({"mul"})

_policy: ContextVar[Any] = ContextVar("everyo_precision_policy", default=None)
_tracer: ContextVar[Any] = ContextVar("everyo_tracer", default=None)
_depth: ContextVar[int] = ContextVar("everyo_primitive_depth", default=0)  # only maintained while tracing

OPS: dict[str, OpDef] = {}
# What the floors above hand down. This module imports none of them (they
# import it): each binds its piece here when it is imported, and
# ``import everyo`` imports them all before any op runs (tests/core/test_ground_floor.py
# asserts the ground floor's imports).
_Tensor: Any = None  # everyo.tensor.Tensor: tensor.py binds it
_float32_route: Any = None  # (low_precision_operands, call_in_float32): everyo.low_precision binds it
_snapshots_on: Any = None  # () -> bool, "detect_inplace_writes is recording": everyo.autograd binds it


def bind_tensor(cls: type) -> None:
    """Called once by :mod:`everyo.tensor`: the Tensor class that op outputs
    and wrapped operands are made of."""
    global _Tensor
    _Tensor = cls


def bind_float32_route(needs_route: Callable[..., bool], call: Callable[..., Any]) -> None:
    """Called once by :mod:`everyo.low_precision`: how ops of the
    ``FLOAT32_COMPUTE_KINDS`` run on float16/bfloat16 operands (compute in
    float32, round once)."""
    global _float32_route
    _float32_route = (needs_route, call)


def bind_snapshot_check(recording: Callable[[], bool]) -> None:
    """Called once by :mod:`everyo.autograd`: whether
    ``detect_inplace_writes`` is recording input snapshots."""
    global _snapshots_on
    _snapshots_on = recording


# --- the precision policy ---------------------------------------------------------
def get_policy() -> Any:
    """The precision policy in force here, or ``None``."""
    return _policy.get()


def set_policy(policy: Any) -> Token[Any]:
    """Install ``policy`` (or ``None``); returns a token for :func:`reset_policy`."""
    return _policy.set(policy)


def reset_policy(token: Token[Any]) -> None:
    """Restore the policy that :func:`set_policy` replaced."""
    _policy.reset(token)


def apply(category: str | None, *tensors: AnyTensor) -> tuple[AnyTensor, ...]:
    """Route operands through the policy (identity when none is set).

    Primitives get this from their decorator; kept for code outside core's
    op table that wants the same treatment."""
    policy = _policy.get()
    if policy is None:
        return tensors
    return tuple(policy.cast_inputs(category, tensors))


# --- the tracer -------------------------------------------------------------------
def get_tracer() -> Any:
    """The tracer in force here, or ``None``."""
    return _tracer.get()


def set_tracer(tracer: Any) -> Token[Any]:
    """Install ``tracer`` (or ``None``); returns a token for :func:`reset_tracer`."""
    return _tracer.set(tracer)


def reset_tracer(token: Token[Any]) -> None:
    """Restore the tracer that :func:`set_tracer` replaced."""
    _tracer.reset(token)


def inside_primitive() -> bool:
    """Whether a traced primitive is running here (its inner calls are not recorded)."""
    return bool(_depth.get())


def python_value(tensor: AnyTensor, kind: str) -> None:
    """Called by Tensor before it turns into a Python value (``kind`` is
    'bool', 'int', 'float', 'index', 'item' or 'tolist')."""
    tracer = _tracer.get()
    if tracer is not None and not _depth.get():
        tracer.on_python_value(tensor, kind)


# --- the table --------------------------------------------------------------------
class OpDef:
    """One primitive op.

    Attributes:
        name: unique name in :data:`OPS` (the tracer's node type).
        category: ``LOW_PRECISION``, ``FLOAT32`` or ``None`` (inputs' dtype).
        kind: one of :data:`KINDS`.
        inputs: the names of the Tensor operands, in signature order; a name
            starting with ``*`` is a sequence of Tensors (``concatenate``).
        differentiable: whether the op passes gradients to float operands.
        forward: the undecorated function; ``function`` the public wrapper;
            ``run`` what the wrapper calls: ``forward``, or for the kinds in
            :data:`FLOAT32_COMPUTE_KINDS` ``forward`` with 16-bit operands
            computed in float32.
        signature: ``inspect.Signature`` of ``forward``.
    """

    __slots__ = (
        "name",
        "category",
        "kind",
        "inputs",
        "differentiable",
        "forward",
        "function",
        "signature",
        "resolve",
        "_slots",
        "run",
    )

    def __init__(
        self,
        name: str,
        category: str | None,
        kind: str,
        inputs: tuple[str, ...] | list[str],
        differentiable: bool,
        forward: Callable[..., Any],
        resolve: Callable[..., Any] | None,
    ) -> None:
        self.name, self.category, self.kind = name, category, kind
        self.inputs, self.differentiable = tuple(inputs), bool(differentiable)
        self.forward, self.resolve = forward, resolve
        self.function: Callable[..., Any] | None = None
        self.signature = inspect.signature(forward)
        params = self.signature.parameters
        positional = [
            p.name for p in params.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
        ]
        slots: list[
            tuple[str, int | None, str]
        ] = []  # (parameter, its position or None, "one" | "sequence" | "varargs")
        for spec in self.inputs:
            pname = spec.lstrip("*")
            if pname not in params:
                raise TypeError(f"primitive {name!r}: operand {pname!r} is not a parameter of {forward.__qualname__}")
            mode = (
                "one"
                if not spec.startswith("*")
                else ("varargs" if params[pname].kind is params[pname].VAR_POSITIONAL else "sequence")
            )
            slots.append((pname, positional.index(pname) if pname in positional else None, mode))
        self._slots = tuple(slots)
        self.run: Callable[..., Any] = forward

    def __repr__(self) -> str:
        return f"OpDef({self.name!r}, category={self.category!r}, kind={self.kind!r}, inputs={self.inputs})"


def primitive(
    name: str,
    category: str | None = None,
    *,
    kind: str,
    inputs: tuple[str, ...] | list[str] | None = None,
    differentiable: bool = True,
    resolve: Callable[..., Any] | None = None,
) -> Callable[[Callable[_P, _R]], Callable[_P, _R]]:
    """Register the decorated function as the primitive op ``name``.

    Args:
        name: its name in :data:`OPS`.
        category: ``LOW_PRECISION``, ``FLOAT32`` or ``None``.
        kind: one of :data:`KINDS`.
        inputs: names of the Tensor operands (default: the first parameter);
            ``"*tensors"`` marks a sequence of Tensors.
        differentiable: ``False`` for ops with integer or boolean results.
        resolve: optional ``resolve(inputs, attrs) -> attrs``, called only
            while tracing, to make attributes explicit (e.g. conv pads).

    Example (registers the op process-wide, so not run as a doctest)::

        @primitive("twice", kind="elementwise")
        def twice(a):
            return Tensor._from_op(a.data * 2, (a,), lambda g: (g * 2,))
    """
    if kind not in KINDS:
        raise ValueError(f"primitive {name!r}: kind must be one of {sorted(KINDS)}, got {kind!r}")
    if category not in (None, LOW_PRECISION, FLOAT32):
        raise ValueError(f"primitive {name!r}: unknown category {category!r}")

    def register(forward: Callable[_P, _R]) -> Callable[_P, _R]:
        if name in OPS:
            raise ValueError(f"primitive {name!r} is already registered by {OPS[name].forward.__module__}")
        operands = inputs if inputs is not None else (next(iter(inspect.signature(forward).parameters)),)
        op = OpDef(name, category, kind, operands, differentiable, forward, resolve)
        if kind in FLOAT32_COMPUTE_KINDS and name not in _OWN_16BIT_PATH:
            op.run = _in_float32(op)
        run = op.run
        # PyTorch's dim=/keepdim= spellings (everyo.axes.torch_spelling), for ops taking axis=.
        spelled = "axis" in op.signature.parameters

        if category is None:

            @functools.wraps(forward)
            def function(*args: Any, **kwargs: Any) -> Any:
                if spelled and kwargs and ("dim" in kwargs or "keepdim" in kwargs):
                    kwargs = torch_spelling(name, kwargs)
                tracer = _tracer.get()
                if tracer is None:
                    return run(*args, **kwargs)
                return _traced(op, tracer, args, kwargs)
        else:
            drops_casts = category == FLOAT32 and name in _READS_NO_OPERAND

            @functools.wraps(forward)
            def function(*args: Any, **kwargs: Any) -> Any:
                if spelled and kwargs and ("dim" in kwargs or "keepdim" in kwargs):
                    kwargs = torch_spelling(name, kwargs)
                tracer = _tracer.get()
                if tracer is None:
                    policy = _policy.get()
                    if policy is None:
                        return run(*args, **kwargs)
                    cast_args, cast_kwargs = _cast_operands(op, policy, args, kwargs)
                    out = run(*cast_args, **cast_kwargs)
                    if drops_casts:
                        _drop_cast_copies(args, kwargs, cast_args, cast_kwargs, out)
                    return out
                return _traced(op, tracer, args, kwargs)

        function.op = op  # type: ignore[attr-defined]  # the OpDef, reachable from the public function
        op.function = function
        OPS[name] = op
        return function  # functools.wraps keeps forward's signature

    return register


# --- what the wrapper does beyond the call ----------------------------------------------
def _in_float32(op):
    """``op.forward``, but with float16/bfloat16 operands computed in float32
    and rounded once (everyo.low_precision); anything else goes straight through."""
    forward, slots = op.forward, op._slots
    reads_operands = "others" if op.name in _READS_OTHER_OPERAND else op.name not in _READS_NO_OPERAND
    passes_gradient = op.name in ("add", "sub", "neg")
    recompute = op.name in _RECOMPUTED

    def run(*args, **kwargs):
        route = _float32_route
        if route is None:
            raise RuntimeError("everyo.low_precision is not imported: import everyo before running an op")
        if route[0](slots, args, kwargs):
            return route[1](forward, slots, args, kwargs, reads_operands, passes_gradient, recompute)
        return forward(*args, **kwargs)

    return run


def _drop_cast_copies(args, kwargs, cast_args, cast_kwargs, out):
    """After an op whose backward reads no operand value: the copies the policy
    cast for it (float16 activations made float32 for softmax) are needed by
    nothing but the graph's bookkeeping, which only reads their dtype and
    shape. Swap their arrays for zero-byte placeholders so the graph does not
    keep a float32 copy of the activations alive until backward."""
    if _snapshots_on is not None and _snapshots_on():
        return  # detect_inplace_writes compares every input with its snapshot: keep them
    Tensor = _tensor_type()
    outs = out if isinstance(out, (list, tuple)) else (out,)
    pairs = list(zip(args, cast_args)) + [(kwargs[k], cast_kwargs[k]) for k in kwargs if k in cast_kwargs]
    for given, cast in pairs:
        if (
            cast is not given
            and isinstance(cast, Tensor)
            and cast._backward is not None
            and isinstance(given, Tensor)
            and len(cast._parents) == 1
            and cast._parents[0] is given
            and not any(o is cast for o in outs)
        ):
            cast._data = np.broadcast_to(np.zeros((), cast._data.dtype), cast._data.shape)


def _tensor_type() -> type[AnyTensor]:
    return _Tensor  # bound by tensor.py


def _is_python_scalar(v):
    return isinstance(v, (bool, int, float, complex))


def _cast_operands(op, policy, args, kwargs):
    """Hand the op's operands to ``policy.cast_inputs`` in one call and put the
    results back where they came from. Floating arrays are wrapped first (the
    cast is a graph node); ``None``, Python scalars (weakly typed) and
    integer or boolean arrays are left alone."""
    Tensor = _tensor_type()
    args = list(args)
    places = []
    for pname, index, mode in op._slots:
        if mode == "varargs":
            places.extend((args, i) for i in range(index, len(args)))
            continue
        if index is not None and index < len(args):
            where, key = args, index
        elif pname in kwargs:
            where, key = kwargs, pname
        else:
            continue
        if mode == "sequence":  # cast the items of a fresh list, not the caller's
            where[key] = items = list(where[key])
            places.extend((items, i) for i in range(len(items)))
        else:
            places.append((where, key))
    found, values = [], []
    for where, key in places:
        value = where[key]
        if value is None or _is_python_scalar(value):
            continue
        if not isinstance(value, Tensor):
            value = np.asarray(value)
            if value.dtype.kind != "f":
                continue  # masks, indices: not numbers to round; the body takes them as given
            value = Tensor(value)
        found.append((where, key))
        values.append(value)
    if values:
        for (where, key), value in zip(found, policy.cast_inputs(op.category, tuple(values))):
            where[key] = value
    return args, kwargs


def _constant(value, like, tracer=None):
    """A non-Tensor operand as the constant Tensor the op's body makes of it.

    A number of a subclass of int or float (a tracer's symbolic size, such as
    ``x.shape[1]``) is shown to the tracer's optional ``scalar_operand(number,
    tensor)``, so that it can record where the number came from."""
    Tensor = _tensor_type()
    if isinstance(value, Tensor) or value is None:
        return value
    if _is_python_scalar(value) and like is not None:
        out = Tensor(np.asarray(value, dtype=np.result_type(like.data.dtype, _plain(value))))
        if type(value) not in (bool, int, float, complex) and hasattr(tracer, "scalar_operand"):
            tracer.scalar_operand(value, out)
        return out
    return Tensor(value)


def _traced(op, tracer, args, kwargs):
    if op.category is not None:
        policy = _policy.get()
        if policy is not None:
            # Cast at the caller's depth: an outermost op's casts are recorded
            # as astype nodes feeding it, so the recorded graph is connected.
            args, kwargs = _cast_operands(op, policy, args, kwargs)
    if _depth.get():
        return op.run(*args, **kwargs)  # inside another primitive: not recorded
    token = _depth.set(1)
    try:
        # The tracer may hand user code symbolic sizes (int subclasses, for x.shape); the op computes
        # with plain ints (NumPy takes an int subclass as a strong int64: float32 * it would be float64)
        # and the tracer is told the numbers as given.
        out = op.run(*_plain(args), **{k: _plain(v) for k, v in kwargs.items()})
        inputs, attrs = _describe(op, args, kwargs, tracer)
        outputs = tuple(out) if isinstance(out, (list, tuple)) else (out,)
        tracer.record(op.name, inputs, outputs, attrs)
    finally:
        _depth.reset(token)
    return out


def _plain(x):
    """``x`` with every int of a subclass of int (bool aside) made a plain int,
    inside tuples, lists and slices."""
    kind = type(x)
    if kind is int or kind is bool or kind is float or x is None:
        return x
    if isinstance(x, int) and not isinstance(x, bool):
        return int(x)
    if kind is tuple or kind is list:
        return kind(_plain(v) for v in x)
    if kind is slice:
        return slice(_plain(x.start), _plain(x.stop), _plain(x.step))
    return x


def _describe(op, args, kwargs, tracer=None):
    """(inputs, attrs) of one call, as the tracer contract defines them."""
    Tensor = _tensor_type()
    bound = op.signature.bind(*args, **kwargs)
    bound.apply_defaults()
    arguments = dict(bound.arguments)
    operand_names = [pname for pname, _, _ in op._slots]
    given = [arguments.get(p, ()) for p in operand_names]
    flat = [t for v in given for t in (v if isinstance(v, (list, tuple)) else (v,))]
    tensors = [t for t in flat if isinstance(t, Tensor)]
    like = next((t for t in tensors if t.data.dtype.kind == "f"), tensors[0] if tensors else None)
    inputs = []
    for (_pname, _, mode), value in zip(op._slots, given):
        if mode != "one":
            inputs.extend(_constant(v, like, tracer) for v in value)
        else:
            inputs.append(_constant(value, like, tracer))
    attrs = {k: v for k, v in arguments.items() if k not in operand_names}
    for pname, param in op.signature.parameters.items():
        if param.kind is param.VAR_KEYWORD and pname in attrs:
            attrs.update(attrs.pop(pname))
    if op.resolve is not None:
        attrs = op.resolve(tuple(inputs), attrs)
    return tuple(inputs), attrs
