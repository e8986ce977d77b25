"""The one extension point in core: an optional precision policy.

Core knows which *category* each primitive op belongs to; an add-on
(``everyo.amp``) decides what a category means by installing a policy object
with one method::

    policy.cast_inputs(category, tensors) -> tuple of tensors

Categories:

``LOW_PRECISION``  matmul, the fused linear ``x @ W + b``, conv2d (with bias).
``FLOAT32``        reductions (sum, mean, var), exp, log, pow, softmax,
                   log_softmax, normalisation statistics and every loss.

Every other op runs in its inputs' dtype (mixed float16/float32 binary ops
promote to the wider type, as NumPy does). When no policy is set, the cost of
the hook is one ``ContextVar.get``. The policy lives in a ContextVar, so it is
local to a thread and to a ``contextvars`` context.
"""
from contextvars import ContextVar

LOW_PRECISION = "lowp"
FLOAT32 = "float32"

_policy = ContextVar("everyo_precision_policy", default=None)


def get_policy():
    """The precision policy in force here, or ``None``."""
    return _policy.get()


def set_policy(policy):
    """Install ``policy`` (or ``None``); returns a token for :func:`reset_policy`."""
    return _policy.set(policy)


def reset_policy(token):
    _policy.reset(token)


def apply(category, *tensors):
    """Route an op's operands through the policy (identity when none is set)."""
    policy = _policy.get()
    if policy is None:
        return tensors
    return tuple(policy.cast_inputs(category, tensors))
