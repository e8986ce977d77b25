"""``autocast``: run matmul and conv2d in float16, keep the sensitive ops in float32.

Core knows op *categories* (:mod:`everyo.dispatch`); this module decides what
they mean by installing a precision policy in core's ContextVar:

- ``'lowp'`` (matmul, the fused linear, conv2d): every floating operand goes
  through ``Tensor.astype('float16')``, a differentiable cast. Its backward
  casts the incoming float16 gradient back to the operand's own dtype, so a
  float32 parameter keeps a float32 gradient while activations, and the
  gradients flowing through them, really are float16.
- ``'float32'`` (reductions, exp, log, pow, softmax, log_softmax,
  normalisation statistics, losses): float16 operands are cast up, because
  summing thousands of values or exponentiating one is where 16 bits runs
  out of range.
- every other op follows its inputs.

Because the policy lives in a ``contextvars.ContextVar``, autocast is local to
a thread and to a context: turning it on in one thread never changes another.
"""
import functools

import numpy as np

from everyo import dispatch

__all__ = ["autocast", "is_autocast_enabled", "Float16Policy"]

_FLOAT16 = np.dtype(np.float16)
_FLOAT32 = np.dtype(np.float32)


class Float16Policy:
    """The precision policy ``autocast(True)`` installs (stateless, shared)."""

    def cast_inputs(self, category, tensors):
        if category == dispatch.LOW_PRECISION:
            return tuple(_cast_floating(t, _FLOAT16) for t in tensors)
        if category == dispatch.FLOAT32:
            return tuple(t.astype(_FLOAT32) if t.data.dtype == _FLOAT16 else t for t in tensors)
        return tensors  # a category this version does not know: leave it alone

    def __repr__(self):
        return "Float16Policy()"


def _cast_floating(t, dtype):
    # Integer and boolean operands (indices, masks) are not numbers to round.
    if t.data.dtype.kind == "f" and t.data.dtype != dtype:
        return t.astype(dtype)
    return t


_FLOAT16_POLICY = Float16Policy()


def is_autocast_enabled():
    """Whether matmul/conv2d run in float16 here (in this thread and context)."""
    return isinstance(dispatch.get_policy(), Float16Policy)


class autocast:
    """Mixed precision for the ops inside: matmul and conv2d in float16.

    Args:
        enabled: ``False`` makes a float32 island (no policy) inside an
            autocast block; ``True`` (default) turns float16 on.

    Works as a context manager and as a decorator, and nests: leaving a block
    restores whatever was in force before it.

    Example:
        >>> model = eo.Sequential(eo.Linear(8, 4, seed=0), eo.ReLU(), eo.Linear(4, 1, seed=1))
        >>> with eo.autocast():
        ...     output = model(eo.ones(3, 8))
        >>> output.dtype, model[0].weight.dtype
        ('float16', 'float32')
    """

    def __init__(self, enabled=True):
        if not isinstance(enabled, (bool, np.bool_)):
            raise TypeError(f"autocast(enabled=...) takes a bool, got {type(enabled).__name__} {enabled!r}")
        self.enabled = bool(enabled)
        # A stack, not one token: the same object may be entered again while
        # it is active (e.g. a decorated function calling itself).
        self._tokens = []

    def __enter__(self):
        self._tokens.append(dispatch.set_policy(_FLOAT16_POLICY if self.enabled else None))
        return self

    def __exit__(self, *exc):
        dispatch.reset_policy(self._tokens.pop())
        return False

    def __call__(self, fn):
        enabled = self.enabled

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with autocast(enabled):
                return fn(*args, **kwargs)

        return wrapper

    def __repr__(self):
        return f"autocast(enabled={self.enabled})"
