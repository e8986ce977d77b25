"""Type aliases for EveryO's annotations (for type checkers only).

Modules that use them do ``from __future__ import annotations`` and import
this module's names under ``if TYPE_CHECKING:``, so nothing here is imported
at run time (``numpy.typing`` stays unimported by ``import everyo``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from typing import TypeAlias

    import numpy as np
    from numpy.typing import ArrayLike, DTypeLike, NDArray

    from everyo.tensor import Tensor

    #: Anything an op accepts as an operand: a Tensor, a NumPy array, a Python
    #: scalar or a nested sequence of numbers.
    TensorLike: TypeAlias = Tensor | ArrayLike
    #: An axis argument as NumPy spells it: one axis, several, or all (None).
    Axis: TypeAlias = int | Sequence[int] | None
    #: A shape: a tuple (or any sequence) of non-negative ints.
    Shape: TypeAlias = Sequence[int]
    #: A dtype as NumPy accepts it (``"float32"``, ``np.float16``, ...).
    DType: TypeAlias = DTypeLike
    #: A NumPy array of any dtype.
    Array: TypeAlias = NDArray[Any]
    FloatArray: TypeAlias = NDArray[np.floating[Any]]

__all__: list[str] = []
