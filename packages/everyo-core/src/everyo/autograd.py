"""Define-by-run reverse-mode autodiff: grad mode and the backward pass.

Each op's output holds its parents and one closure that maps the output's
gradient to the parents' gradients (micrograd's idea). ``backward`` sorts the
graph once, iteratively (so a 1,000-step RNN cannot hit the recursion limit),
runs the closures in reverse, accumulates into leaves' ``.grad`` and frees the
graph as it goes (unless ``retain_graph=True``).

Hooks (PyTorch's names):

* ``Tensor.register_hook(fn)``: ``fn(grad)`` sees a tensor's gradient once
  it is complete for this pass and may return a replacement.
* ``Tensor.register_post_accumulate_grad_hook(fn)``: ``fn(tensor)`` runs once
  a leaf's ``.grad`` holds everything this pass adds to it. Leaves are reached
  only after every op that uses them, so the call comes as early as possible;
  a data-parallel wrapper starts communicating there, while the rest of the
  backward pass still runs.
* :func:`queue_callback`: from inside a backward pass, run ``fn()`` once that
  pass has finished, just before ``backward()`` returns.

Deferred gradients. A backward function may return, instead of an ndarray,
an object with ``shape``, ``dtype`` and ``materialize() -> ndarray``: a
gradient whose final array has not been built yet (a low-precision path may
hand over values already rounded to the low-precision type but still held in
a wider one, skipping a conversion down and back up). The engine passes such an object on unchanged to a backward
function marked ``accepts_deferred = True`` when it already has the
parent's dtype and shape, and calls ``materialize()`` everywhere else: for a
leaf's or a retained ``.grad``, a hook, and any other backward function. Two
gradients of one tensor are added by ``deferred.accumulate(other)`` when the
object has that method (``other`` is an ndarray or deferred gradient of the
same dtype and shape; the result may stay deferred), otherwise as
materialized arrays. The engine knows nothing else about it.

In-place changes. Every change to a tensor's values made through EveryO
takes a stamp from one process-wide clock into the tensor's ``_version``:
``t.data = a`` (and so ``t.data -= a``, as every optimizer step does),
``add_``, ``mul_``, ``copy_``, ``fill_``, ``zero_``. An op's output records the
clock when it is made (``_saved_at``), so before any gradient is computed,
``backward`` checks each node of the graph: an input (or the node's own
output) stamped later was changed after the op saved it, and
:class:`~everyo.errors.EveryOInPlaceError` names the op and the tensor. The
forward pass pays one attribute store per op; backward one comparison per
node, and a loop over the inputs only when something was changed since.
EveryO treats every input of an op as saved, except for ops whose gradient
needs no input value (add, sub, neg, sum, mean, concatenate, stack: they
make new arrays, so nothing downstream can see a change through them), where
a changed input is let through; PyTorch lets more through (e.g. the bias of a
linear layer). View ops (reshape, transpose, indexing) are never let
through: their check is what catches a change to a tensor whose view a
later op saved (tied weights).
Writes into the ndarray itself. While a recorded op holds a leaf that
requires grad (a Parameter, an input made with ``requires_grad=True``), that
leaf's array is read-only: ``p.data[...] = 0``, ``p.data -= lr * g``,
``np.add(p.data, 1, out=p.data)`` and ``p.add_(1)`` fail at once, at the
writing line, with NumPy's ``ValueError: ... read-only``. ``backward()``
frees the graph and makes the arrays writable again (so optimizer steps and
``p.data -= lr * p.grad`` after it work), as does dropping the graph
unused (an inference pass without ``no_grad``). With ``retain_graph=True`` the
arrays stay read-only until the graph is dropped. Costs one
``weakref.finalize`` per op that reads such a leaf (a few microseconds).
Not seen: writes into intermediate results' arrays and into inputs that do not
require grad, writes through a view taken before the forward pass, and
in-place changes through another tensor that is a NumPy view of the saved
one (e.g. the output of ``reshape``) -- NumPy offers no hook on writes; these
give gradients computed from the new values. To find such a write, run the
forward and backward passes inside :class:`detect_inplace_writes`, which
keeps a copy of every op's inputs and output and compares (a debugging aid:
it costs a copy of every activation).
"""

from __future__ import annotations

import functools
import itertools
import threading
import weakref
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import numpy as np

from everyo import _buffers, _passes, dispatch
from everyo.casting import convert
from everyo.errors import EveryOInPlaceError

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from types import TracebackType

    from everyo._typing import AnyTensor, Array, TensorLike

    _F = TypeVar("_F", bound=Callable[..., Any])

_state = threading.local()

# The clock of in-place changes (see the module docstring). next() on a
# count is atomic, so two threads never hand out the same stamp.
_clock = itertools.count(1)
latest_version = 0


def bump_version(tensor: AnyTensor) -> None:
    """Record that ``tensor``'s values were just changed in place."""
    global latest_version
    latest_version = tensor._version = next(_clock)
    tracer = dispatch.get_tracer()
    if tracer is not None and hasattr(tracer, "on_write"):
        tracer.on_write(tensor)  # e.g. the ONNX exporter names the line that wrote a weight


# id(op output) -> (a weak reference to it, copies of its own and its inputs'
# values), while detect_inplace_writes is on (process-wide, for debugging).
snapshots: dict[int, Any] | None = None


class detect_inplace_writes:
    """Context manager for debugging: also catch writes straight into the
    arrays that the version check cannot see (``t.data[...] = 0``,
    ``np.add(..., out=t.data)``, through a NumPy view). Ops recorded inside
    keep a copy of their inputs and output; backward inside compares them with
    the current values and raises :class:`~everyo.errors.EveryOInPlaceError`
    on a difference. Wrap both the forward pass and ``backward()``. Costs a
    copy of every op's operands while on; process-wide.

    Examples:
        >>> model, x = eo.nn.Linear(3, 2), eo.ones(4, 3)
        >>> with eo.autograd.detect_inplace_writes():
        ...     loss = model(x).sum()
        ...     loss.backward()
    """

    def __enter__(self) -> detect_inplace_writes:
        global snapshots
        self._prev = snapshots
        if snapshots is None:
            snapshots = {}
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> Literal[False]:
        global snapshots
        snapshots = self._prev
        return False


# Leaves' arrays made read-only while the graph holds them (see the module docstring):
# id(array) -> [array, number of live nodes holding it]; id(node) -> its finalizer.
_locked: dict[int, list[Any]] = {}
_lock_handles: dict[int, Any] = {}
_lock_mutex = threading.RLock()  # reentrant: a finalizer (_unlock) may run during a garbage collection inside the lock


_reads_inputs: dict[Any, bool] = {}  # a backward closure's code -> whether its op reads its inputs' values


def lock_saved_leaves(out: AnyTensor, parents: Sequence[AnyTensor], backward: Any) -> None:
    """Make the arrays of ``parents`` that are leaves requiring grad read-only
    until ``out``'s node is freed by backward or garbage-collected (not for the
    ops whose gradient reads no input value: a change cannot alter it)."""
    code = getattr(backward, "__code__", backward)
    reads = _reads_inputs.get(code)
    if reads is None:
        reads = _reads_inputs[code] = (
            f"{getattr(backward, '__module__', '')}.{_op_name(backward)}" not in _READS_NO_INPUT
        )
    if not reads:
        return
    arrays = [p._data for p in parents if p.requires_grad and p._backward is None]
    with _lock_mutex:
        arrays = [a for a in arrays if id(a) in _locked or a.flags.writeable]
        if not arrays:
            return
        for a in arrays:
            entry = _locked.get(id(a))
            if entry is None:
                _locked[id(a)] = [a, 1]
                a.flags.writeable = False
            else:
                entry[1] += 1
        _lock_handles[id(out)] = weakref.finalize(out, _unlock, id(out), arrays)


def _unlock(key: int, arrays: list[Any]) -> None:
    with _lock_mutex:
        _lock_handles.pop(key, None)
        for a in arrays:
            entry = _locked.get(id(a))
            if entry is None:
                continue
            entry[1] -= 1
            if entry[1] == 0:
                del _locked[id(a)]
                a.flags.writeable = True


def held_by_graph(tensor: AnyTensor) -> bool:
    """Whether ``tensor``'s array is read-only because a recorded op holds it for backward."""
    return id(tensor._data) in _locked and not tensor._data.flags.writeable


def _unlock_node(node: AnyTensor) -> None:
    handle = _lock_handles.get(id(node))
    if handle is not None:
        handle()  # runs _unlock once; the finalizer is then dead


def snapshot(out: AnyTensor) -> None:
    """Keep copies of an op's output and inputs (called by ``Tensor._from_op`` while
    :class:`detect_inplace_writes` is on)."""
    assert snapshots is not None
    snapshots[id(out)] = (weakref.ref(out), [np.array(t._data, copy=True) for t in (out, *out._parents)])


def is_grad_enabled() -> bool:
    """Whether operations on this thread record the graph (``False`` inside ``eo.no_grad()``)."""
    return getattr(_state, "enabled", True)


class _GradMode:
    def __init__(self, enabled: bool) -> None:
        self._enabled = enabled

    def __enter__(self) -> _GradMode:
        self._prev = is_grad_enabled()
        _state.enabled = self._enabled
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> Literal[False]:
        _state.enabled = self._prev
        return False

    def __call__(self, fn: _F) -> _F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with type(self)():  # type: ignore[call-arg]  # the subclasses take no arguments
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]  # functools.wraps keeps fn's signature


class no_grad(_GradMode):
    """Context manager / decorator: ops inside record no graph.

    Examples:
        >>> w = eo.tensor([1.0], requires_grad=True)
        >>> with eo.no_grad():
        ...     y = w * 2.0
        >>> y.requires_grad
        False
    """

    def __init__(self) -> None:
        super().__init__(False)


class enable_grad(_GradMode):
    """Context manager / decorator: ops inside record a graph (inside ``no_grad`` too)."""

    def __init__(self) -> None:
        super().__init__(True)


# --- hooks --------------------------------------------------------------------
class RemovableHandle:
    """Returned by the ``register_*hook`` methods; ``remove()`` unregisters the hook."""

    __slots__ = ("_hooks", "_fn")

    def __init__(self, hooks: list[Any], fn: Callable[..., Any]) -> None:
        self._hooks, self._fn = hooks, fn

    def remove(self) -> None:
        """Unregister the hook (a second call does nothing)."""
        try:
            self._hooks.remove(self._fn)
        except ValueError:
            pass  # already removed

    def __enter__(self) -> RemovableHandle:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> Literal[False]:
        self.remove()
        return False


def queue_callback(fn: Callable[[], object]) -> None:
    """Run ``fn()`` once the backward pass now running has finished.

    Only callable from inside a backward pass (from a hook, typically); the
    callbacks run in the order queued, after the last gradient is accumulated
    and before ``backward()`` returns. A callback may queue further callbacks.

    Examples:
        >>> x = eo.tensor([1.0, 2.0], requires_grad=True)
        >>> done = []
        >>> _ = x.register_hook(lambda g: eo.autograd.queue_callback(lambda: done.append(x.grad.copy())))
        >>> (x * x).sum().backward()
        >>> done[0]
        array([2., 4.], dtype=float32)
    """
    stack = getattr(_state, "callbacks", None)
    if not stack:
        raise RuntimeError("queue_callback() can only be called during a backward pass (e.g. from a hook)")
    stack[-1].append(fn)


# --- the backward pass ------------------------------------------------------------
def _dependencies(roots):
    """For every node reachable from ``roots`` that takes part in autograd, how
    many uses of it (edges from its consumers in this graph) must deliver their
    gradient before its own gradient is complete."""
    count, stack = {}, []
    for root in roots:
        if id(root) not in count:
            count[id(root)] = 0
            stack.append(root)
    while stack:
        node = stack.pop()
        if node._backward is not None and node._saved_at != latest_version:
            _check_unchanged(node)
        if snapshots and id(node) in snapshots:
            _compare_snapshot(node)
        for parent in node._parents:
            if parent.requires_grad:
                key = id(parent)
                if key in count:
                    count[key] += 1
                else:
                    count[key] = 1
                    stack.append(parent)
    return count


_ARRAYS = (np.ndarray, np.generic)


def materialize(g: Any) -> Any:
    """A gradient as an ndarray (a deferred gradient is built now)."""
    return g if isinstance(g, _ARRAYS) else g.materialize()


# The sum of two gradient arrays of a dtype whose NumPy loop is slow (one converting each
# element) but has a faster route giving the same bits, registered by the module that knows
# it (everyo.low_precision): dtype -> add(a, b), which may return a deferred gradient.
array_sums: dict[Any, Callable[[Any, Any], Any]] = {}


class _Zero:
    """The type of :data:`ZERO`."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "everyo.autograd.ZERO"


ZERO = _Zero()
"""A backward's gradient for a parent that must run although it gets nothing from this use
(a multi-output op's relay, see :func:`everyo.sequence_ops.multi_output`): the parent runs,
with a zero gradient if nothing else reaches it, and nothing is added to what other uses
give it. Adding an actual zero array instead costs two full-size sums per split (zero +
zero, then + the real gradient) and turns the real gradient's -0.0 into +0.0."""


def _add(a, b):
    """The sum of two gradients of one tensor (same dtype and shape)."""
    if not isinstance(a, _ARRAYS) and hasattr(a, "accumulate"):
        return a.accumulate(b)
    if not isinstance(b, _ARRAYS) and hasattr(b, "accumulate"):
        return b.accumulate(a)  # addition commutes, bit for bit
    a, b = materialize(a), materialize(b)
    if type(a) is np.ndarray and type(b) is np.ndarray and a.shape == b.shape and a.dtype == b.dtype:
        add = array_sums.get(a.dtype)
        if add is not None:
            return add(a, b)
        if a.dtype.kind == "f":  # into a recycled buffer (everyo._buffers): the same sum, no fresh pages
            return _passes.run(np.add, (a, b), _buffers.empty(a.shape, a.dtype))
    return a + b


def _as_grad(grad, like):
    # The gradient of a tensor always has the tensor's own dtype and shape:
    # a low-precision operand gets a gradient of its own dtype even when its consumer ran in
    # float32 (and vice versa). This is what makes casts honest.
    if not isinstance(grad, _ARRAYS):
        if grad.dtype == like.dtype and grad.shape == like.shape:
            return grad  # deferred, already in the right dtype and shape
        grad = grad.materialize()
    if grad.dtype != like.dtype:
        grad = convert(grad, like.dtype)
    if grad.shape != like.shape:
        grad = np.broadcast_to(grad, like.shape)
    return grad


def _array_of(value):
    # A Tensor's array; an ndarray as it is (its own .data is a raw buffer,
    # which arrays of extension dtypes such as ml_dtypes' cannot even export).
    return value if isinstance(value, _ARRAYS) else getattr(value, "data", value)


def _seed(root, grad):
    if not root.requires_grad:
        raise RuntimeError(
            "backward() called on a tensor that does not require grad "
            "(was it computed under eo.no_grad(), or from inputs without requires_grad?)"
        )
    if grad is None:
        if root.data.size != 1:
            raise RuntimeError(
                f"backward() without an explicit gradient needs a scalar output; got shape "
                f"{root.data.shape}. Reduce it first (e.g. loss.mean()) or pass grad=."
            )
        return np.ones_like(root.data)
    grad = np.asarray(_array_of(grad))
    if grad.shape != root.data.shape:
        raise ValueError(f"backward(grad=) has shape {grad.shape}, expected {root.data.shape}")
    return _as_grad(grad, root.data)


def _run(roots, seeds, retain_graph, capture=None):
    """The engine. Without ``capture`` it accumulates into leaves' ``.grad``;
    with ``capture`` (a dict id(tensor) -> slot) it only fills the slots."""
    grads = {}
    for root, g in zip(roots, seeds):
        key = id(root)
        grads[key] = g if key not in grads else materialize(grads[key]) + g
    pending = _dependencies(roots)  # also checks every node for in-place changes
    checked_at = latest_version
    # A node runs once every use of it has delivered its gradient (Kahn's
    # order). Ready nodes are a stack, so a leaf runs -- and its
    # post-accumulate hooks fire -- as soon as its last use is done, not at
    # the end of the pass: that is what lets communication overlap backward.
    ready = [root for root in reversed(roots) if pending[id(root)] == 0]
    results = {} if capture is not None else None
    stack = getattr(_state, "callbacks", None)
    if stack is None:
        stack = _state.callbacks = []
    stack.append([])
    try:
        while ready:
            node = ready.pop()
            g = grads.pop(id(node), None)
            if g is None:  # no use delivered a gradient: nor will this node
                _release(node._parents, pending, ready)
                continue
            if g is ZERO:  # only "run anyway" markers came: the node's gradient is zero
                g = np.broadcast_to(np.zeros((), node.data.dtype), node.data.shape)
            if node._hooks:
                g = materialize(g)
                for hook in list(node._hooks):
                    replaced = hook(g)
                    if replaced is not None:
                        g = _as_grad(np.asarray(_array_of(replaced)), node.data)
            if capture is not None and id(node) in capture:
                results[id(node)] = materialize(g)
            if node._backward is None:  # a leaf
                if capture is None:
                    _accumulate_leaf(node, materialize(g))
                continue
            if node._retain and capture is None:
                g = materialize(g)
                _accumulate_leaf(node, g)
            elif not isinstance(g, _ARRAYS) and not getattr(node._backward, "accepts_deferred", False):
                g = g.materialize()
            if latest_version != checked_at and node._saved_at != latest_version:
                _check_unchanged(node)  # a hook changed something during this pass
            parent_grads = node._backward(g)
            parents = node._parents
            if not retain_graph:
                # Free the graph as we go: activations saved by the closure go now.
                node._backward = _freed
                node._parents = ()
                if _lock_handles:
                    _unlock_node(node)
                if snapshots:
                    snapshots.pop(id(node), None)
            del node
            for parent, pg in zip(parents, parent_grads):
                if not parent.requires_grad:
                    continue
                key = id(parent)
                if pg is ZERO:  # run the parent, but add nothing to what it receives
                    grads.setdefault(key, ZERO)
                elif pg is not None:
                    pg = _as_grad(pg, parent.data)
                    prev = grads.get(key)
                    grads[key] = pg if prev is None or prev is ZERO else _add(prev, pg)
                pending[key] -= 1
                if pending[key] == 0:
                    ready.append(parent)
        callbacks = stack[-1]
        while callbacks:
            callbacks.pop(0)()
    finally:
        stack.pop()
    return results


def _release(parents, pending, ready):
    for parent in parents:
        if parent.requires_grad:
            key = id(parent)
            pending[key] -= 1
            if pending[key] == 0:
                ready.append(parent)


def backward(root: AnyTensor, grad: TensorLike | None = None, retain_graph: bool = False) -> None:
    """Accumulate d(root)/d(leaf) into every leaf's ``.grad`` (see ``Tensor.backward``)."""
    _run([root], [_seed(root, grad)], retain_graph)


def grad(
    outputs: AnyTensor | Sequence[AnyTensor],
    inputs: AnyTensor | Sequence[AnyTensor],
    grad_outputs: TensorLike | Sequence[TensorLike | None] | None = None,
    retain_graph: bool = False,
    allow_unused: bool = False,
) -> tuple[Array | None, ...]:
    """Gradients of ``outputs`` with respect to ``inputs``, returned, not accumulated.

    Args:
        outputs: a Tensor or a sequence of Tensors (scalars, unless
            ``grad_outputs`` gives their gradients).
        inputs: a Tensor or a sequence of Tensors that ``outputs`` depend on
            (leaves or intermediate results).
        grad_outputs: optional gradients of ``outputs`` (same shapes).
        retain_graph: keep the graph for another backward pass.
        allow_unused: return ``None`` for an input the outputs do not depend
            on, instead of raising.

    Returns a tuple of arrays, one per input. No ``.grad`` is changed.

    Examples:
        >>> x = eo.tensor([1.0, 2.0], requires_grad=True)
        >>> (dx,) = eo.grad((x * x).sum(), x)
        >>> dx
        array([2., 4.], dtype=float32)
    """
    tensor_type = dispatch._tensor_type()  # tensor.py binds it (it imports this module)

    outputs = [outputs] if isinstance(outputs, tensor_type) else list(outputs)  # type: ignore[arg-type]  # a sequence
    inputs = [inputs] if isinstance(inputs, tensor_type) else list(inputs)  # type: ignore[arg-type]  # a sequence
    given: list[Any]
    if grad_outputs is None:
        given = [None] * len(outputs)
    elif isinstance(grad_outputs, (tensor_type, np.ndarray)):
        given = [grad_outputs]
    else:
        given = list(grad_outputs)  # type: ignore[arg-type]  # a sequence of gradients
    grad_outputs = given
    if len(grad_outputs) != len(outputs):
        raise ValueError(f"grad: {len(outputs)} outputs but {len(grad_outputs)} grad_outputs")
    for i, t in enumerate(inputs):
        if not isinstance(t, tensor_type) or not t.requires_grad:
            raise ValueError(f"grad: input {i} does not require grad, so it has no gradient")
    seeds = [_seed(o, g) for o, g in zip(outputs, grad_outputs)]
    found = _run(outputs, seeds, retain_graph, capture={id(t): i for i, t in enumerate(inputs)})
    result = []
    for i, t in enumerate(inputs):
        g = found.get(id(t))
        if g is None and not allow_unused:
            raise ValueError(
                f"grad: input {i} (shape {t.data.shape}) is not used by the outputs; pass allow_unused=True"
            )
        result.append(None if g is None else np.array(g, dtype=t.data.dtype, copy=True))
    return tuple(result)


def _freed(grad):
    raise RuntimeError(
        "Trying to backward through part of a graph a second time: its saved "
        "values were freed by the first backward(). Recompute the forward pass, or "
        "pass retain_graph=True to the first backward()."
    )


def _accumulate_leaf(node, g):
    if node.grad is None:
        # Own the array: ``g`` may alias another node's gradient or a broadcast view.
        dt = node.data.dtype
        if type(g) is np.ndarray and g.dtype == dt and dt.kind == "f":
            node.grad = _buffers.copy_of(g)  # a recycled buffer (everyo._buffers)
        else:
            node.grad = np.array(g, dtype=dt, copy=True)
    else:
        node.grad = node.grad + g
    if node._post_hooks:
        for hook in list(node._post_hooks):
            hook(node)


# --- in-place change detection ------------------------------------------------------
# Ops whose backward reads no input value and whose output is a new array (not a
# view): a changed input does not change their gradient. Keyed by the backward
# closure's qualified name, looked up only when a change was found.
_READS_NO_INPUT = frozenset(
    f"everyo.functional.{name}" for name in ("add", "sub", "neg", "sum", "mean", "concatenate", "stack")
)


def _op_name(backward):
    """``linear`` for the closure ``functional.linear.<locals>.backward``."""
    qualname = getattr(backward, "__qualname__", type(backward).__name__)
    return qualname.split(".<locals>")[0]


def _describe(t):
    kind = type(t).__name__
    if t._backward is not None:
        kind = f"an intermediate {kind} (the output of {_op_name(t._backward)})"
    elif t.requires_grad:
        kind = f"a {kind}" if kind == "Parameter" else f"a leaf {kind} that requires grad"
    else:
        kind = f"a {kind} that does not require grad"
    return f"{kind} of shape {t._data.shape}, {t._data.dtype}"


def _check_unchanged(node):
    at = node._saved_at
    backward = node._backward
    if backward is _freed:
        return  # its own error says more
    op = _op_name(backward)
    if node._version > at:
        raise EveryOInPlaceError(
            f"backward through {op}: its output ({_describe(node)}) was changed in place after {op} computed "
            f"it, and {op}'s gradient is computed from its saved values. Recompute the forward pass after "
            f"changing values, or change a copy (eo.tensor(t.data.copy()))."
        )
    if f"{getattr(backward, '__module__', '')}.{op}" in _READS_NO_INPUT:
        return
    for i, parent in enumerate(node._parents):
        if parent._version > at:
            raise EveryOInPlaceError(
                f"backward through {op}: its input {i} ({_describe(parent)}) was changed in place after {op} "
                f"saved it for backward -- by an optimizer step, a `.data` assignment or an in-place method "
                f"(add_, mul_, copy_, fill_, zero_) between the forward pass and backward(). The gradient "
                f"would be computed from the new values. Call optimizer.step() after backward(), recompute "
                f"the forward pass after changing values, or change a copy (eo.tensor(t.data.copy()))."
            )


def _compare_snapshot(node):
    ref, saved = snapshots[id(node)]
    if ref() is not node or node._backward is _freed:
        return
    op = _op_name(node._backward)
    reads_inputs = f"{getattr(node._backward, '__module__', '')}.{op}" not in _READS_NO_INPUT
    for k, (t, copy) in enumerate(zip((node, *node._parents), saved)):
        if k and not reads_inputs:
            break
        now = t._data
        same = now.shape == copy.shape and np.array_equal(
            now, copy, equal_nan=bool(now.dtype.kind in "fc" and copy.dtype.kind in "fc")
        )
        if not same:
            what = "its output" if k == 0 else f"its input {k - 1}"
            raise EveryOInPlaceError(
                f"backward through {op}: {what} ({_describe(t)}) was written into directly after {op} saved it "
                f"(e.g. t.data[...] = ..., or np.<ufunc>(..., out=t.data)): its values differ from the saved "
                f"copy (seen by eo.autograd.detect_inplace_writes). Change values only between backward() and "
                f"the next forward pass, or change a copy."
            )


def _recording_snapshots() -> bool:
    return snapshots is not None


dispatch.bind_snapshot_check(_recording_snapshots)
