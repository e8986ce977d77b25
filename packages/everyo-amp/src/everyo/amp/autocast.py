"""``autocast``: run matmul and conv2d in float16 (or bfloat16), keep the sensitive ops in float32.

Core knows op *categories* (:mod:`everyo.dispatch`); this module decides what
they mean by installing a precision policy in core's ContextVar:

- ``'lowp'`` (matmul, the fused linear, conv2d): every floating operand goes
  through ``Tensor.astype('float16')`` (or ``'bfloat16'``), a differentiable cast. Its backward
  casts the incoming float16 gradient back to the operand's own dtype, so a
  float32 parameter keeps a float32 gradient while activations, and the
  gradients flowing through them, really are float16.
- ``'float32'`` (reductions, exp, log, pow, softmax, log_softmax, losses):
  float16 and bfloat16 operands are cast up and the result is float32,
  because summing thousands of values or exponentiating one is where 16 bits
  runs out of range (float16) or precision (bfloat16's 8 bits). An op whose
  backward needs no operand value (softmax, sum, mean, exp) keeps no float32
  copy of its 16-bit input for backward.
- normalisation layers (BatchNorm1D/2D, LayerNorm, GroupNorm; core's
  ``normalize`` op): the statistics and the normalisation are computed in
  float32 and the running statistics and parameters stay float32, but a
  16-bit input gives an output of that type, rounded once (Keras's
  ``mixed_float16`` behaviour), and backward keeps only the 16-bit input and
  the per-group statistics, so the layers after a Conv2D-BatchNorm run and
  save 16-bit activations. A float32 input gives a float32 output (it is not
  cast down: only matmul and conv2d change precision).
- every other op follows its inputs (core computes 16-bit elementwise ops in
  float32 and rounds once: :mod:`everyo.low_precision`); a float16 operand
  meeting a float32 one promotes to float32, as in NumPy.

Which ops output 16-bit under autocast, then: matmul, linear, conv2d (always),
and, given 16-bit activations, every elementwise op (ReLU, tanh, +, *, ...),
pooling, shape ops, dropout and the normalisation layers. Which output
float32: the reductions, exp, log, pow, softmax, log_softmax and every loss.

bfloat16 arrays are ``ml_dtypes.bfloat16`` (imported here, only when asked
for): float32's exponent range with 8 significant bits, so gradients neither
overflow nor flush where float32's would not, and no GradScaler is needed.

Because the policy lives in a ``contextvars.ContextVar``, autocast is local to
a thread and to a context: turning it on in one thread never changes another.
"""

from __future__ import annotations

import functools
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import numpy as np

from everyo import dispatch
from everyo.half import is_low_precision

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from contextvars import Token
    from types import TracebackType

    from everyo._typing import DType
    from everyo.tensor import Tensor

    _F = TypeVar("_F", bound=Callable[..., Any])

__all__ = ["autocast", "is_autocast_enabled", "get_autocast_dtype", "Float16Policy"]

_FLOAT16 = np.dtype(np.float16)
_FLOAT32 = np.dtype(np.float32)
_DTYPES = ("float16", "bfloat16")


class Float16Policy:
    """The precision policy ``autocast`` installs (stateless, one per 16-bit type).

    Args:
        dtype: the low-precision type, ``np.dtype('float16')`` (default) or
            ml_dtypes' bfloat16.
    """

    def __init__(self, dtype: DType = _FLOAT16) -> None:
        self.dtype = np.dtype(dtype)

    def cast_inputs(self, category: str | None, tensors: Sequence[Tensor]) -> Sequence[Tensor]:
        if category == dispatch.LOW_PRECISION:
            return tuple(_cast_floating(t, self.dtype) for t in tensors)
        if category == dispatch.FLOAT32:
            return tuple(t.astype(_FLOAT32) if is_low_precision(t.data.dtype) else t for t in tensors)
        return tensors  # a category this version does not know: leave it alone

    def __repr__(self) -> str:
        return f"Float16Policy(dtype={self.dtype.name!r})"


def _cast_floating(t, dtype):
    # Integer and boolean operands (indices, masks) are not numbers to round.
    if t.data.dtype != dtype and (t.data.dtype.kind == "f" or is_low_precision(t.data.dtype)):
        return t.astype(dtype)
    return t


_POLICIES: dict[str, Float16Policy] = {}


def _policy_for(name):
    if name not in _POLICIES:
        if name == "bfloat16":
            try:
                import ml_dtypes
            except ImportError:
                raise ImportError(
                    "autocast(dtype='bfloat16') needs the ml_dtypes package (a dependency of everyo-amp): "
                    "pip install ml_dtypes"
                ) from None
            _POLICIES[name] = Float16Policy(ml_dtypes.bfloat16)
        else:
            _POLICIES[name] = Float16Policy(_FLOAT16)
    return _POLICIES[name]


def _dtype_name(dtype):
    name = dtype if isinstance(dtype, str) else getattr(np.dtype(dtype), "name", None)
    if name not in _DTYPES:
        raise ValueError(f"autocast(dtype=...) takes 'float16' or 'bfloat16', got {dtype!r}")
    return name


def is_autocast_enabled() -> bool:
    """Whether matmul/conv2d run in a 16-bit type here (in this thread and context)."""
    return isinstance(dispatch.get_policy(), Float16Policy)


def get_autocast_dtype() -> np.dtype[Any] | None:
    """The 16-bit dtype autocast uses here, or ``None`` outside autocast."""
    policy = dispatch.get_policy()
    return policy.dtype if isinstance(policy, Float16Policy) else None


# The policy tokens of the autocast blocks open here, innermost last. A ContextVar,
# not an attribute of the object: a token can only be reset in the context that made
# it, and one autocast object may be open in several threads (or entered again while
# open, e.g. by a decorated function calling itself) at once, as torch's allows.
_entered: ContextVar[tuple[tuple[autocast, Token[Any]], ...]] = ContextVar("everyo_autocast_entered", default=())


class autocast:
    """Mixed precision for the ops inside: matmul and conv2d in float16 or bfloat16.

    Args:
        enabled: ``False`` makes a float32 island (no policy) inside an
            autocast block; ``True`` (default) turns the 16-bit type on.
        dtype: ``'float16'`` (default; use a :class:`GradScaler`) or
            ``'bfloat16'`` (float32's range: no loss scaling needed; arrays
            are ``ml_dtypes.bfloat16``).

    Works as a context manager and as a decorator, and nests: leaving a block
    restores whatever was in force before it.

    Examples:
        >>> model = eo.Sequential(eo.Linear(8, 4, seed=0), eo.ReLU(), eo.Linear(4, 1, seed=1))
        >>> with eo.autocast():
        ...     output = model(eo.ones(3, 8))
        >>> output.dtype, model[0].weight.dtype
        (dtype('float16'), dtype('float32'))
        >>> with eo.autocast(dtype="bfloat16"):
        ...     output = model(eo.ones(3, 8))
        >>> output.dtype
        dtype(bfloat16)
    """

    def __init__(self, enabled: bool = True, dtype: DType = "float16") -> None:
        if not isinstance(enabled, (bool, np.bool_)):
            raise TypeError(f"autocast(enabled=...) takes a bool, got {type(enabled).__name__} {enabled!r}")
        self.enabled = bool(enabled)
        self.dtype = _dtype_name(dtype)
        self._policy = _policy_for(self.dtype) if self.enabled else None

    def __enter__(self) -> autocast:
        token = dispatch.set_policy(self._policy)
        _entered.set(_entered.get() + ((self, token),))
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> Literal[False]:
        stack = _entered.get()
        for k in range(len(stack) - 1, -1, -1):
            if stack[k][0] is self:
                _entered.set(stack[:k] + stack[k + 1 :])
                dispatch.reset_policy(stack[k][1])
                return False
        raise RuntimeError(
            f"{self!r} is leaving a thread or context it was not entered in; enter and leave an autocast "
            "block in the same thread (one object may be entered in several threads at once)"
        )

    def __call__(self, fn: _F) -> _F:
        enabled, dtype = self.enabled, self.dtype

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with autocast(enabled, dtype):
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]  # functools.wraps keeps fn's signature

    def __repr__(self) -> str:
        return f"autocast(enabled={self.enabled}, dtype={self.dtype!r})"
