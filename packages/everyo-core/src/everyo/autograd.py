"""Define-by-run reverse-mode autodiff: grad mode and the backward pass.

Each op's output holds its parents and one closure that maps the output's
gradient to the parents' gradients (micrograd's idea). ``backward`` sorts the
graph once, iteratively (so a 1,000-step RNN cannot hit the recursion limit),
runs the closures in reverse, accumulates into leaves' ``.grad`` and frees the
graph as it goes.
"""
import threading

import numpy as np

from everyo.half import Rounded, _convert, _materialize

_state = threading.local()


def is_grad_enabled():
    return getattr(_state, "enabled", True)


class _GradMode:
    def __init__(self, enabled):
        self._enabled = enabled

    def __enter__(self):
        self._prev = is_grad_enabled()
        _state.enabled = self._enabled
        return self

    def __exit__(self, *exc):
        _state.enabled = self._prev
        return False

    def __call__(self, fn):
        import functools

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with type(self)():
                return fn(*args, **kwargs)

        return wrapper


class no_grad(_GradMode):
    """Context manager / decorator: ops inside record no graph.

    >>> with eo.no_grad():
    ...     y = model(x)          # y.requires_grad is False
    """

    def __init__(self):
        super().__init__(False)


class enable_grad(_GradMode):
    def __init__(self):
        super().__init__(True)


def _topological_order(root):
    """Nodes reachable from ``root`` that take part in autograd, parents first."""
    order, visited = [], set()
    stack = [(root, False)]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            order.append(node)
            continue
        if id(node) in visited:
            continue
        visited.add(id(node))
        stack.append((node, True))
        if node._parents:
            for parent in node._parents:
                if parent.requires_grad and id(parent) not in visited:
                    stack.append((parent, False))
    return order


def _as_grad(grad, like):
    # The gradient of a tensor always has the tensor's own dtype and shape:
    # a float16 operand gets a float16 gradient even when its consumer ran in
    # float32 (and vice versa). This is what makes casts honest.
    if isinstance(grad, Rounded):  # float16 values, kept in float32 for the next op
        if like.dtype == np.float16 and grad.shape == like.shape:
            return grad
        grad = grad.half()
    if grad.dtype != like.dtype:
        grad = _convert(grad, like.dtype)
    if grad.shape != like.shape:
        grad = np.broadcast_to(grad, like.shape)
    return grad


def backward(root, grad=None):
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
        grad = np.ones_like(root.data)
    else:
        grad = np.asarray(getattr(grad, "data", grad))
        if grad.shape != root.data.shape:
            raise ValueError(f"backward(grad=) has shape {grad.shape}, expected {root.data.shape}")
    order = _topological_order(root)
    grads = {id(root): _as_grad(grad, root.data)}
    while order:
        # Popping (rather than iterating) drops our reference to each node as
        # soon as it is done, so activations are freed during the backward
        # pass instead of all at once at the end (fewer fresh pages to fault in).
        node = order.pop()
        g = grads.pop(id(node), None)
        if g is None:
            continue
        if node._backward is None:  # a leaf
            _accumulate_leaf(node, _materialize(g))
            continue
        if node._retain:
            g = _materialize(g)
            _accumulate_leaf(node, g)
        elif isinstance(g, Rounded) and not getattr(node._backward, "takes_rounded", False):
            g = g.half()
        parent_grads = node._backward(g)
        parents = node._parents
        # Free the graph as we go: activations saved by the closure go now.
        node._backward = _freed
        node._parents = ()
        for parent, pg in zip(parents, parent_grads):
            if pg is None or not parent.requires_grad:
                continue
            pg = _as_grad(pg, parent.data)
            key = id(parent)
            prev = grads.get(key)
            grads[key] = pg if prev is None else _materialize(prev) + _materialize(pg)


def _freed(grad):
    raise RuntimeError(
        "Trying to backward through part of a graph a second time: its saved "
        "values were freed by the first backward(). Recompute the forward pass."
    )


def _accumulate_leaf(node, g):
    if node.grad is None:
        # Own the array: ``g`` may alias another node's gradient or a broadcast view.
        node.grad = np.array(g, dtype=node.data.dtype, copy=True)
    else:
        node.grad = node.grad + g
