"""Activation layers, Identity, Flatten and Dropout."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from everyo import activations as A
from everyo import functional as F
from everyo.axes import torch_spelling
from everyo.errors import EveryOShapeError
from everyo.nn import arguments as args
from everyo.nn.module import Module, as_input

if TYPE_CHECKING:
    import numpy as np

    from everyo._typing import TensorLike
    from everyo.tensor import Tensor


class ReLU(Module):
    """``max(x, 0)`` elementwise (:func:`everyo.relu` as a layer)."""

    def forward(self, x: TensorLike) -> Tensor:
        return F.relu(as_input(self, x))


class Sigmoid(Module):
    """``1 / (1 + exp(-x))`` elementwise (:func:`everyo.sigmoid` as a layer)."""

    def forward(self, x: TensorLike) -> Tensor:
        return F.sigmoid(as_input(self, x))


class Tanh(Module):
    """``tanh(x)`` elementwise (:func:`everyo.tanh` as a layer)."""

    def forward(self, x: TensorLike) -> Tensor:
        return F.tanh(as_input(self, x))


class Softmax(Module):
    """Softmax along ``axis`` (default: the last, the feature/channel axis);
    PyTorch's ``dim=`` is accepted for ``axis=``."""

    def __init__(self, axis: int = -1, *, dim: int | None = None) -> None:
        super().__init__()
        given = {"axis": axis} if dim is None else {"dim": dim, **({"axis": axis} if axis != -1 else {})}
        self.axis: int = torch_spelling(type(self).__name__, given)["axis"]

    def forward(self, x: TensorLike) -> Tensor:
        return F.softmax(as_input(self, x), axis=self.axis)

    def extra_repr(self) -> str:
        return f"axis={self.axis}"


class LogSoftmax(Softmax):
    """Log-softmax along ``axis`` (default: the last), computed stably (:func:`everyo.log_softmax`)."""

    def forward(self, x: TensorLike) -> Tensor:
        return F.log_softmax(as_input(self, x), axis=self.axis)


class Flatten(Module):
    """Flatten the axes from ``start_axis`` on into one (NHWC order is kept).

    Args:
        start_axis: the first axis flattened (default 1: everything but the
            batch axis); negative counts from the end.

    Shape:
        (N, d1, ..., dk) -> (N, d1 * ... * dk) for ``start_axis=1``. A batch of
        0 gives (0, d1 * ... * dk).

    Examples:
        >>> eo.Flatten(start_axis=2)(eo.ones(2, 3, 4, 5)).shape
        (2, 3, 20)
    """

    def __init__(self, start_axis: int = 1) -> None:
        super().__init__()
        self.start_axis = args.ints("Flatten", "start_axis", start_axis, 1, minimum=-(2**31))[0]

    def forward(self, x: TensorLike) -> Tensor:
        x = as_input(self, x, ndim=tuple(range(1, 33)))
        shape = x.data.shape
        start = self.start_axis + len(shape) if self.start_axis < 0 else self.start_axis
        if not 0 <= start < len(shape):
            raise EveryOShapeError(
                f"{self!r}: start_axis {self.start_axis} is out of range for an input of rank {len(shape)} "
                f"(shape {shape})"
            )
        # An explicit size, not -1: reshape cannot infer -1 when a batch of 0 makes the array empty.
        return F.reshape(x, shape[:start] + (math.prod(shape[start:]),))

    def extra_repr(self) -> str:
        return "" if self.start_axis == 1 else f"start_axis={self.start_axis}"


class Dropout(Module):
    """Inverted dropout: active in train mode, identity in eval mode.

    The mask stream ``generator`` (seeded by ``seed=``, else from the global
    state, see ``eo.manual_seed``) is saved in ``state_dict``."""

    generator: np.random.Generator  # registered in __init__ (register_generator)

    def __init__(self, p: float = 0.5, *, seed: int | np.random.Generator | None = None) -> None:
        super().__init__()
        from everyo.random import generator_for

        self.p = args.probability("Dropout", "p", p, include_one=True)
        self.register_generator("generator", generator_for(seed))

    def forward(self, x: TensorLike) -> Tensor:
        return F.dropout(as_input(self, x), self.p, self.training, self.generator)

    def extra_repr(self) -> str:
        return f"p={self.p}"


class Identity(Module):
    """Returns its input unchanged (a placeholder, e.g. for a removed head).
    Extra arguments to the constructor are accepted and ignored, as in PyTorch."""

    def __init__(self, *_args: Any, **_kwargs: Any) -> None:
        super().__init__()

    def forward(self, x: Any) -> Any:
        return x


class GELU(Module):
    """Gaussian error linear unit ``x * Phi(x)``.

    Args:
        approximate: ``'none'`` (exact, erf) or ``'tanh'``.

    Examples:
        >>> eo.GELU(approximate="tanh")(eo.ones(2, 3)).shape
        (2, 3)
    """

    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        self.approximate = args.one_of("GELU", "approximate", approximate, ("none", "tanh"))

    def forward(self, x: TensorLike) -> Tensor:
        return A.gelu(as_input(self, x), approximate=self.approximate)

    def extra_repr(self) -> str:
        return "" if self.approximate == "none" else f"approximate={self.approximate!r}"


class SiLU(Module):
    """``x * sigmoid(x)`` (also called swish)."""

    def forward(self, x: TensorLike) -> Tensor:
        return A.silu(as_input(self, x))


class LeakyReLU(Module):
    """``max(x, 0) + negative_slope * min(x, 0)``; the default slope is PyTorch's 0.01."""

    def __init__(self, negative_slope: float = 0.01) -> None:
        super().__init__()
        self.negative_slope = args.real("LeakyReLU", "negative_slope", negative_slope)

    def forward(self, x: TensorLike) -> Tensor:
        return A.leaky_relu(as_input(self, x), self.negative_slope)

    def extra_repr(self) -> str:
        return f"negative_slope={self.negative_slope}"


class ELU(Module):
    """``x`` for ``x > 0``, else ``alpha * (exp(x) - 1)``."""

    def __init__(self, alpha: float = 1.0) -> None:
        super().__init__()
        self.alpha = args.real("ELU", "alpha", alpha)

    def forward(self, x: TensorLike) -> Tensor:
        return A.elu(as_input(self, x), self.alpha)

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}"


class Softplus(Module):
    """``log(1 + exp(beta * x)) / beta``, linear where ``beta * x > threshold``."""

    def __init__(self, beta: float = 1.0, threshold: float = 20.0) -> None:
        super().__init__()
        self.beta = args.positive_float("Softplus", "beta", beta)
        self.threshold = args.real("Softplus", "threshold", threshold)

    def forward(self, x: TensorLike) -> Tensor:
        return A.softplus(as_input(self, x), self.beta, self.threshold)

    def extra_repr(self) -> str:
        return f"beta={self.beta}, threshold={self.threshold}"
