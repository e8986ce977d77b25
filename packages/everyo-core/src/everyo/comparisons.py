"""Elementwise comparisons: ``==, !=, <, <=, >, >=`` return boolean Tensors.

As in NumPy and PyTorch, comparing a Tensor with a Tensor, an ndarray or a
scalar compares element by element (broadcasting) and gives a boolean
Tensor with no gradient. ``Tensor`` stays hashable by identity, so tensors
still work as dict keys and set members; but ``t in some_list`` now compares
values, so code looking a tensor up among others must compare identities
(``any(t is p for p in params)``).

Examples:
    >>> x = eo.tensor([1.0, 2.0, 3.0])
    >>> (x >= 2).tolist()
    [False, True, True]
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from everyo.dispatch import primitive
from everyo.functional import _operands
from everyo.tensor import Tensor

if TYPE_CHECKING:
    from everyo._typing import TensorLike

__all__ = ["equal", "not_equal", "less", "less_equal", "greater", "greater_equal"]


def _compare(ufunc, a, b):
    a, b = _operands(a, b)
    return Tensor._from_op(ufunc(a.data, b.data), (), None)


@primitive("equal", kind="compare", inputs=("a", "b"), differentiable=False)
def equal(a: TensorLike, b: TensorLike) -> Tensor:
    """``a == b`` elementwise, as a boolean Tensor."""
    return _compare(np.equal, a, b)


@primitive("not_equal", kind="compare", inputs=("a", "b"), differentiable=False)
def not_equal(a: TensorLike, b: TensorLike) -> Tensor:
    """``a != b`` elementwise, as a boolean Tensor."""
    return _compare(np.not_equal, a, b)


@primitive("less", kind="compare", inputs=("a", "b"), differentiable=False)
def less(a: TensorLike, b: TensorLike) -> Tensor:
    """``a < b`` elementwise, as a boolean Tensor."""
    return _compare(np.less, a, b)


@primitive("less_equal", kind="compare", inputs=("a", "b"), differentiable=False)
def less_equal(a: TensorLike, b: TensorLike) -> Tensor:
    """``a <= b`` elementwise, as a boolean Tensor."""
    return _compare(np.less_equal, a, b)


@primitive("greater", kind="compare", inputs=("a", "b"), differentiable=False)
def greater(a: TensorLike, b: TensorLike) -> Tensor:
    """``a > b`` elementwise, as a boolean Tensor."""
    return _compare(np.greater, a, b)


@primitive("greater_equal", kind="compare", inputs=("a", "b"), differentiable=False)
def greater_equal(a: TensorLike, b: TensorLike) -> Tensor:
    """``a >= b`` elementwise, as a boolean Tensor."""
    return _compare(np.greater_equal, a, b)


# ``x == y`` tries x.__eq__ then y.__eq__, so the reflections are each
# other's mirror: 2 < t calls t.__gt__(2), which computes 2 < t. (setattr: the
# Tensor class declares the operators for type checkers.)
for _name, _op in (
    ("__eq__", equal),
    ("__ne__", not_equal),
    ("__lt__", less),
    ("__le__", less_equal),
    ("__gt__", greater),
    ("__ge__", greater_equal),
):
    setattr(Tensor, _name, _op)
