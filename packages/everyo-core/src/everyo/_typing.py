"""Type aliases for EveryO's annotations (for type checkers only).

Modules that use them do ``from __future__ import annotations`` and import
this module's names under ``if TYPE_CHECKING:``, so nothing here is imported
at run time (``numpy.typing`` stays unimported by ``import everyo``).

This module stands on the ground floor and names no other EveryO module, not
even for the type checker: where the floor under :mod:`everyo.tensor`
(``dispatch``, ``autograd``) annotates a tensor, it names :class:`AnyTensor`,
the protocol of what it reads of one, which ``everyo.tensor.Tensor`` meets.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Protocol, TypeAlias

    import numpy as np
    from numpy.typing import ArrayLike, DTypeLike, NDArray

    class AnyTensor(Protocol):
        """What the floor under ``everyo.tensor`` (``dispatch``, ``autograd``)
        reads and writes of a Tensor; ``everyo.tensor.Tensor`` meets it."""

        requires_grad: bool
        _data: Array
        _version: int

        @property
        def data(self) -> Array: ...
        @property
        def _parents(self) -> tuple[AnyTensor, ...]: ...
        @property
        def _backward(self) -> Callable[..., Any] | None: ...  # the op's closure; None for a leaf
        def __array__(self, dtype: DType | None = None, copy: bool | None = None) -> Array: ...

    #: Anything an op accepts as an operand: a Tensor, a NumPy array, a Python
    #: scalar or a nested sequence of numbers.
    TensorLike: TypeAlias = AnyTensor | ArrayLike
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
