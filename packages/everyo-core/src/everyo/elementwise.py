"""More elementwise ops: ``maximum``, ``minimum`` (of two tensors), ``sin``, ``cos``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from everyo.dispatch import primitive
from everyo.functional import _operands, _t, unbroadcast
from everyo.tensor import Tensor

if TYPE_CHECKING:
    from everyo._typing import TensorLike

__all__ = ["maximum", "minimum", "sin", "cos"]


def _pick(a, b, ufunc, loses):
    a, b = _operands(a, b)
    x, y = a.data, b.data
    out = ufunc(x, y)

    def backward(g):
        # Ties split the gradient equally (as max over an axis does). An
        # operand takes the gradient unless it lost the comparison, so where
        # either is NaN (the output is NaN) both take it, as in PyTorch.
        tie = x == y
        share_a = np.where(tie, 0.5, np.where(loses(x, y), 0.0, 1.0)).astype(g.dtype, copy=False)
        share_b = np.where(tie, 0.5, np.where(loses(y, x), 0.0, 1.0)).astype(g.dtype, copy=False)
        ga = unbroadcast(g * share_a, x.shape) if a.requires_grad else None
        gb = unbroadcast(g * share_b, y.shape) if b.requires_grad else None
        return ga, gb

    return Tensor._from_op(out, (a, b), backward)


@primitive("maximum", kind="elementwise", inputs=("a", "b"))
def maximum(a: TensorLike, b: TensorLike) -> Tensor:
    """Elementwise larger of ``a`` and ``b`` (broadcasting; NaN propagates).

    Examples:
        >>> eo.maximum(eo.tensor([1.0, 4.0]), 2.0).tolist()
        [2.0, 4.0]
    """
    return _pick(a, b, np.maximum, np.less)


@primitive("minimum", kind="elementwise", inputs=("a", "b"))
def minimum(a: TensorLike, b: TensorLike) -> Tensor:
    """Elementwise smaller of ``a`` and ``b`` (broadcasting; NaN propagates)."""
    return _pick(a, b, np.minimum, np.greater)


@primitive("sin", kind="elementwise")
def sin(a: TensorLike) -> Tensor:
    """Elementwise sine (radians)."""
    a = _t(a)
    x = a.data
    return Tensor._from_op(np.sin(x), (a,), lambda g: (g * np.cos(x),))


@primitive("cos", kind="elementwise")
def cos(a: TensorLike) -> Tensor:
    """Elementwise cosine (radians)."""
    a = _t(a)
    x = a.data
    return Tensor._from_op(np.cos(x), (a,), lambda g: (-g * np.sin(x),))


for _name in __all__:
    setattr(Tensor, _name, globals()[_name])
