"""The Tensor: a NumPy array plus what autograd needs to differentiate it.

Ops live in :mod:`everyo.functional` (elementwise, reductions, shapes,
matmul) and :mod:`everyo.conv` (convolution, pooling); they are attached to
``Tensor`` as methods and operators there, so this file stays about state.
"""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any

import numpy as np

from everyo import autograd, dispatch
from everyo.errors import EveryOInPlaceError, EveryOSpellingError
from everyo.half import as_dtype, is_bfloat16
from everyo.random import generator_for

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Literal

    from everyo._typing import Array, Axis, DType, TensorLike

_FLOAT_DEFAULT = np.float32


class Tensor:
    """An n-dimensional array that records the ops applied to it.

    Args:
        data: array-like. NumPy arrays keep their dtype; Python floats and
            lists of floats become float32, Python ints int64.
        requires_grad: whether gradients should be accumulated into ``.grad``.
        dtype: optional dtype to convert ``data`` to.

    Examples:
        >>> x = eo.tensor([[1.0, 2.0]], requires_grad=True)
        >>> (x * x).sum().backward()
        >>> x.grad
        array([[2., 4.]], dtype=float32)
    """

    __slots__ = (
        "_data",
        "grad",
        "requires_grad",
        "_parents",
        "_backward",
        "_retain",
        "_hooks",
        "_post_hooks",
        "__weakref__",
        "_version",
        "_saved_at",
    )
    __array_priority__ = 1000  # ndarray (op) Tensor defers to Tensor's reflected op
    # Comparisons are elementwise (everyo.comparisons), hashing stays by
    # identity: tensors remain usable as dict keys and set members.
    __hash__ = object.__hash__

    def __init__(self, data: TensorLike, requires_grad: bool = False, dtype: DType | None = None) -> None:
        self._data: Array = _to_array(data, dtype)
        self._version = 0
        if requires_grad and not (np.issubdtype(self.data.dtype, np.floating) or is_bfloat16(self.data.dtype)):
            raise TypeError(f"only floating-point tensors can require grad, got {self.data.dtype}")
        self.grad: Array | None = None
        self.requires_grad = bool(requires_grad)
        self._parents: tuple[Tensor, ...] = ()
        self._backward: Callable[..., Any] | None = None
        self._saved_at: int = 0
        self._retain = False
        self._hooks: list[Callable[..., Any]] | tuple[()] = ()
        self._post_hooks: list[Callable[..., Any]] | tuple[()] = ()

    if TYPE_CHECKING:
        # The ops attached as methods and operators by everyo.functional,
        # elementwise, reductions, shape_ops, indexing, sorting and
        # comparisons, declared here for type checkers (at run time the
        # functions themselves are the methods).
        @property
        def T(self) -> Tensor: ...
        def __add__(self, other: TensorLike) -> Tensor: ...
        def __radd__(self, other: TensorLike) -> Tensor: ...
        def __sub__(self, other: TensorLike) -> Tensor: ...
        def __rsub__(self, other: TensorLike) -> Tensor: ...
        def __mul__(self, other: TensorLike) -> Tensor: ...
        def __rmul__(self, other: TensorLike) -> Tensor: ...
        def __truediv__(self, other: TensorLike) -> Tensor: ...
        def __rtruediv__(self, other: TensorLike) -> Tensor: ...
        def __matmul__(self, other: TensorLike) -> Tensor: ...
        def __rmatmul__(self, other: TensorLike) -> Tensor: ...
        def __pow__(self, exponent: TensorLike) -> Tensor: ...
        def __rpow__(self, other: TensorLike) -> Tensor: ...
        def __neg__(self) -> Tensor: ...
        def __getitem__(self, index: Any) -> Tensor: ...
        # Comparisons are elementwise and return boolean Tensors (as NumPy's do).
        def __eq__(self, other: object) -> Tensor: ...  # type: ignore[override]
        def __ne__(self, other: object) -> Tensor: ...  # type: ignore[override]
        def __lt__(self, other: TensorLike) -> Tensor: ...
        def __le__(self, other: TensorLike) -> Tensor: ...
        def __gt__(self, other: TensorLike) -> Tensor: ...
        def __ge__(self, other: TensorLike) -> Tensor: ...
        def abs(self) -> Tensor: ...
        def exp(self) -> Tensor: ...
        def log(self) -> Tensor: ...
        def sqrt(self) -> Tensor: ...
        def sin(self) -> Tensor: ...
        def cos(self) -> Tensor: ...
        def tanh(self) -> Tensor: ...
        def sigmoid(self) -> Tensor: ...
        def relu(self) -> Tensor: ...
        def clone(self) -> Tensor: ...
        def astype(self, dtype: DType) -> Tensor: ...
        def clip(self, min: float | None = None, max: float | None = None) -> Tensor: ...
        def maximum(self, b: TensorLike) -> Tensor: ...
        def minimum(self, b: TensorLike) -> Tensor: ...
        def matmul(self, b: TensorLike) -> Tensor: ...
        # dim=/keepdim= are PyTorch's spellings of axis=/keepdims= (everyo.axes.torch_spelling)
        def sum(
            self, axis: Axis = None, keepdims: bool = False, *, dim: Axis = None, keepdim: bool = False
        ) -> Tensor: ...
        def mean(
            self, axis: Axis = None, keepdims: bool = False, *, dim: Axis = None, keepdim: bool = False
        ) -> Tensor: ...
        def max(self, axis: Axis = None, keepdims: bool = False) -> Tensor: ...
        def min(self, axis: Axis = None, keepdims: bool = False) -> Tensor: ...
        def prod(
            self, axis: Axis = None, keepdims: bool = False, *, dim: Axis = None, keepdim: bool = False
        ) -> Tensor: ...
        def logsumexp(
            self, axis: Axis = None, keepdims: bool = False, *, dim: Axis = None, keepdim: bool = False
        ) -> Tensor: ...
        def var(self, axis: Axis = None, keepdims: bool = False, ddof: float = 0) -> Tensor: ...
        def std(self, axis: Axis = None, keepdims: bool = False, ddof: float = 0) -> Tensor: ...
        def norm(self, ord: float | Literal["fro"] = 2, axis: Axis = None, keepdims: bool = False) -> Tensor: ...
        def argmax(
            self, axis: int | None = None, keepdims: bool = False, *, dim: int | None = None, keepdim: bool = False
        ) -> Tensor: ...
        def argmin(
            self, axis: int | None = None, keepdims: bool = False, *, dim: int | None = None, keepdim: bool = False
        ) -> Tensor: ...
        def cumsum(self, axis: int | None = None, *, dim: int | None = None) -> Tensor: ...
        def softmax(self, axis: int = -1, blocked: TensorLike | None = None, *, dim: int = -1) -> Tensor: ...
        def log_softmax(self, axis: int = -1, *, dim: int = -1) -> Tensor: ...
        def sort(self, axis: int = -1, descending: bool = False) -> tuple[Tensor, Tensor]: ...
        def topk(self, k: int, axis: int = -1, largest: bool = True, sorted: bool = True) -> tuple[Tensor, Tensor]: ...
        def reshape(self, *shape: int | Sequence[int]) -> Tensor: ...
        def transpose(self, *axes: int | Sequence[int]) -> Tensor: ...
        def flatten(self, start_axis: int = 1) -> Tensor: ...
        def squeeze(self, axis: Axis = None, *, dim: Axis = None) -> Tensor: ...
        def expand_dims(self, axis: int | Sequence[int]) -> Tensor: ...
        def unsqueeze(self, axis: int | Sequence[int]) -> Tensor: ...
        def moveaxis(self, source: int | Sequence[int], destination: int | Sequence[int]) -> Tensor: ...
        def gather(self, axis: int, index: TensorLike) -> Tensor: ...
        def take_along_axis(self, indices: TensorLike, axis: int) -> Tensor: ...
        def masked_fill(self, mask: TensorLike, value: TensorLike) -> Tensor: ...
        # PyTorch's spellings (everyo.composites)
        def split(self, split_size_or_sections: int | Sequence[int], dim: int = 0) -> tuple[Tensor, ...]: ...
        def chunk(self, chunks: int, dim: int = 0) -> tuple[Tensor, ...]: ...
        def permute(self, *dims: int | Sequence[int]) -> Tensor: ...
        def swapaxes(self, axis0: int, axis1: int) -> Tensor: ...
        def view(self, *shape: int | Sequence[int]) -> Tensor: ...
        def view_as(self, other: TensorLike) -> Tensor: ...
        def contiguous(self) -> Tensor: ...
        def eq(self, b: TensorLike) -> Tensor: ...
        def ne(self, b: TensorLike) -> Tensor: ...
        def lt(self, b: TensorLike) -> Tensor: ...
        def le(self, b: TensorLike) -> Tensor: ...
        def gt(self, b: TensorLike) -> Tensor: ...
        def ge(self, b: TensorLike) -> Tensor: ...

    # --- construction from an op ---------------------------------------
    @staticmethod
    def _from_op(data: Array, parents: tuple[Tensor, ...], backward: Callable[..., Any] | None) -> Tensor:
        """Wrap an op's output; record the graph only when a parent needs it."""
        out = Tensor.__new__(Tensor)
        out._data = data
        out._version = 0
        out.grad = None
        out._retain = False
        out._hooks = out._post_hooks = ()
        if autograd.is_grad_enabled() and any(p.requires_grad for p in parents):
            out.requires_grad = True
            out._parents = parents
            out._backward = backward
            out._saved_at = autograd.latest_version  # backward checks that no input changed since
            autograd.lock_saved_leaves(out, parents, backward)
            if autograd.snapshots is not None:
                autograd.snapshot(out)
        else:
            out.requires_grad = False
            out._parents = ()
            out._backward = None
        return out

    # --- properties ----------------------------------------------------
    def _set_data(self, value: Array) -> None:
        self._data = value
        autograd.bump_version(self)

    if TYPE_CHECKING:

        @property
        def data(self) -> Array:
            """The values, an ndarray (see below)."""

        @data.setter
        def data(self, value: Array) -> None: ...
    else:
        # A C-level getter: ``.data`` is read on every op.
        data = property(
            operator.attrgetter("_data"),
            _set_data,
            doc=(
                "The values, an ndarray. Assigning to it (``t.data = a``, and so ``t.data -= a``) counts as an "
                "in-place change, which backward checks (see :mod:`everyo.autograd`)."
            ),
        )

    @property
    def dtype(self) -> np.dtype[Any]:
        """The ``numpy.dtype`` of the values. It compares equal to its name
        and to the scalar type: ``t.dtype == 'float32'`` and
        ``t.dtype == np.float32`` both hold; ``str(t.dtype)`` is the name."""
        return self.data.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape of the values, a tuple of ints."""
        return self.data.shape

    @property
    def ndim(self) -> int:
        """The number of axes."""
        return self.data.ndim

    @property
    def size(self) -> ElementCount:
        """The number of elements (NumPy's meaning), an int. Calling it as
        PyTorch's ``x.size()`` raises an error naming ``x.shape``."""
        return ElementCount(self.data.size)

    def numel(self) -> int:
        """The number of elements (PyTorch's spelling of ``x.size``)."""
        return int(self.data.size)

    @property
    def is_leaf(self) -> bool:
        """Whether this tensor was made by the user (or by an op outside the graph), not recorded from an op."""
        return self._backward is None

    def __setitem__(self, index: Any, value: Any) -> None:
        # PyTorch writes in place (``t[mask] = v``); an EveryO Tensor is a node of the
        # graph and is never changed in place, so say which op gives the same values.
        raise EveryOSpellingError(
            "Tensor item assignment (t[index] = value) is PyTorch's in-place write; EveryO tensors "
            "are not changed in place: use t.masked_fill(mask, value) or eo.where(mask, value, t) for "
            "a boolean mask, or build the new tensor (e.g. eo.concatenate) -- or, outside autograd, "
            "write into the NumPy array t.data[index] = value"
        )

    def __len__(self) -> int:
        return len(self.data)

    def numpy(self) -> Array:
        """The values as an ndarray (the same memory, not a copy)."""
        return self.data

    # --- Python values ---------------------------------------------------
    # Each conversion tells an active tracer first (dispatch.python_value):
    # a traced graph cannot follow a value into Python control flow.
    def item(self) -> int | float | bool:
        """The value of a one-element tensor as a Python number."""
        dispatch.python_value(self, "item")
        return self.data.item()

    def tolist(self) -> Any:
        """The values as (nested) Python lists of Python numbers."""
        dispatch.python_value(self, "tolist")
        return self.data.tolist()

    def __bool__(self) -> bool:
        dispatch.python_value(self, "bool")
        return bool(self.data)  # NumPy's ambiguity error for more than one element

    def __int__(self) -> int:
        dispatch.python_value(self, "int")
        return int(self.data)

    def __float__(self) -> float:
        dispatch.python_value(self, "float")
        return float(self.data)

    def __index__(self) -> int:
        dispatch.python_value(self, "index")
        return self.data.__index__()  # integer tensors with one element only, as NumPy

    def __array__(self, dtype: DType | None = None, copy: bool | None = None) -> Array:
        return self.data if dtype is None else self.data.astype(dtype)

    def __repr__(self) -> str:
        body = np.array2string(self.data, separator=", ", prefix="tensor(")
        extra = ", requires_grad=True" if self.requires_grad else ""
        return f"tensor({body}, dtype={self.dtype}{extra})"

    # --- autograd ------------------------------------------------------
    def backward(self, grad: TensorLike | None = None, retain_graph: bool = False) -> None:
        """Accumulate d(self)/d(leaf) into every leaf's ``.grad``.

        Args:
            grad: the gradient of ``self`` (needed unless ``self`` has one element).
            retain_graph: keep the graph, so that backward can run through it
                again; by default it is freed as the pass goes.
        """
        autograd.backward(self, grad, retain_graph)

    def register_hook(self, fn: Callable[[Array], Array | None]) -> autograd.RemovableHandle:
        """Call ``fn(grad)`` with this tensor's gradient (an ndarray) each time a
        backward pass has computed it; a return value other than None replaces
        the gradient. Returns a handle whose ``remove()`` unregisters ``fn``."""
        if not self.requires_grad:
            raise RuntimeError("register_hook: this tensor does not require grad, so it never gets a gradient")
        if not self._hooks:
            self._hooks = []  # () until the first hook
        self._hooks.append(fn)
        return autograd.RemovableHandle(self._hooks, fn)

    def register_post_accumulate_grad_hook(self, fn: Callable[[Tensor], None]) -> autograd.RemovableHandle:
        """Call ``fn(tensor)`` once this leaf's ``.grad`` holds everything the
        current backward pass adds to it (a data-parallel wrapper starts its
        all-reduce there). Returns a handle whose ``remove()`` unregisters ``fn``."""
        if not self.requires_grad or not self.is_leaf:
            raise RuntimeError("register_post_accumulate_grad_hook: only leaves that require grad accumulate a .grad")
        if not self._post_hooks:
            self._post_hooks = []  # () until the first hook
        self._post_hooks.append(fn)
        return autograd.RemovableHandle(self._post_hooks, fn)

    def retain_grad(self) -> Tensor:
        """Keep this non-leaf tensor's gradient in ``.grad`` after backward()."""
        self._retain = True
        return self

    def detach(self) -> Tensor:
        """The same values (sharing memory) outside the graph: no gradient flows through it."""
        return Tensor(self.data)

    def requires_grad_(self, requires_grad: bool = True) -> Tensor:
        """Switch gradient recording for this leaf on or off, in place; returns ``self``."""
        if not self.is_leaf:
            raise RuntimeError(
                "requires_grad_: only leaf tensors can change requires_grad; "
                "use .detach() to make a leaf from a computed tensor"
            )
        if requires_grad and not np.issubdtype(self.data.dtype, np.floating):
            raise TypeError(f"only floating-point tensors can require grad, got {self.data.dtype}")
        self.requires_grad = bool(requires_grad)
        return self

    def zero_grad(self) -> None:
        """Drop the accumulated gradient (``.grad`` becomes None)."""
        self.grad = None

    # --- in-place changes (not differentiable; each bumps the version) --------
    def _inplace(self, method: str, change: Callable[[Array], object]) -> Tensor:
        if self.requires_grad and autograd.is_grad_enabled():
            raise EveryOInPlaceError(
                f"Tensor.{method}: this tensor (shape {self.shape}, {self.dtype}) requires grad, and in-place "
                f"changes are not recorded for backward. Change it under eo.no_grad() (e.g. a parameter "
                f"update), or use the out-of-place op."
            )
        if autograd.held_by_graph(self):
            raise EveryOInPlaceError(
                f"Tensor.{method}: this tensor (shape {self.shape}, {self.dtype}) is saved by a recorded op for "
                f"backward, so its array is read-only until backward() frees the graph; change it after "
                f"backward(), or recompute the forward pass after changing it."
            )
        change(self._data)
        autograd.bump_version(self)
        return self

    def add_(self, other: TensorLike, alpha: float = 1) -> Tensor:
        """``self += alpha * other`` in place; returns ``self``."""
        other = other.data if isinstance(other, Tensor) else other
        return self._inplace(
            "add_", lambda a: np.add(a, other if alpha == 1 else alpha * np.asarray(other), out=a, casting="same_kind")
        )

    def mul_(self, other: TensorLike) -> Tensor:
        """``self *= other`` in place; returns ``self``."""
        other = other.data if isinstance(other, Tensor) else other
        return self._inplace("mul_", lambda a: np.multiply(a, other, out=a, casting="same_kind"))

    def copy_(self, src: TensorLike) -> Tensor:
        """Copy ``src``'s values (broadcast to this shape, cast to this dtype) into this tensor."""
        src = src.data if isinstance(src, Tensor) else src
        return self._inplace("copy_", lambda a: np.copyto(a, src, casting="unsafe"))

    def fill_(self, value: float) -> Tensor:
        """Set every element to ``value``; returns ``self``."""
        return self._inplace("fill_", lambda a: a.fill(value))

    def zero_(self) -> Tensor:
        """Set every element to 0; returns ``self``."""
        return self.fill_(0)


class ElementCount(int):
    """``Tensor.size``: the element count, an int as NumPy's ``ndarray.size``.
    Calling it (PyTorch's ``x.size()`` / ``x.size(dim)``, which give the shape)
    raises :class:`~everyo.errors.EveryOSpellingError` naming ``x.shape``."""

    __slots__ = ()

    def __call__(self, dim: int | None = None) -> tuple[int, ...]:
        wanted = "x.shape" if dim is None else f"x.shape[{dim}]"
        raise EveryOSpellingError(
            f"x.size is the number of elements ({int(self)}), as in NumPy, not a method: for PyTorch's "
            f"x.size({'' if dim is None else dim}) write {wanted}; for the element count, x.size or x.numel()"
        )


class Parameter(Tensor):
    """A Tensor that a Module registers as trainable (``requires_grad=True``)."""

    __slots__ = ()

    def __init__(self, data: TensorLike, dtype: DType | None = None) -> None:
        super().__init__(data, requires_grad=True, dtype=dtype)

    def __repr__(self) -> str:
        return "Parameter(" + super().__repr__() + ")"


def _to_array(data: TensorLike, dtype: DType | None = None) -> Array:
    if isinstance(data, Tensor):
        data = data.data
    if isinstance(data, np.ndarray):
        arr = data
    else:
        arr = np.asarray(data)
        if arr.dtype == np.float64 and dtype is None:
            arr = arr.astype(_FLOAT_DEFAULT)  # Python floats -> float32, like PyTorch
    if dtype is not None:
        arr = arr.astype(as_dtype(dtype), copy=False)
    return arr


def tensor(data: TensorLike, dtype: DType | None = None, requires_grad: bool = False) -> Tensor:
    """Create a Tensor. NumPy arrays keep their dtype unless ``dtype`` is given."""
    return Tensor(data, requires_grad=requires_grad, dtype=dtype)


def _shape(shape: tuple[Any, ...]) -> tuple[int, ...]:
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        return tuple(shape[0])
    return tuple(shape)


# ones, zeros and arange are table ops (kind "creation"), so that the exporter can record them when
# their sizes come from x.shape while tracing (eo.zeros(B, H) for a first hidden state).
@dispatch.primitive("ones", kind="creation", inputs=(), differentiable=False)
def ones(*shape: int | Sequence[int], dtype: DType = "float32", requires_grad: bool = False) -> Tensor:
    """A Tensor of ones of ``shape`` (ints or one tuple)."""
    return Tensor(np.ones(_shape(shape), dtype=dtype), requires_grad=requires_grad)


@dispatch.primitive("zeros", kind="creation", inputs=(), differentiable=False)
def zeros(*shape: int | Sequence[int], dtype: DType = "float32", requires_grad: bool = False) -> Tensor:
    """A Tensor of zeros of ``shape`` (ints or one tuple)."""
    return Tensor(np.zeros(_shape(shape), dtype=dtype), requires_grad=requires_grad)


def randn(
    *shape: int | Sequence[int],
    seed: int | np.random.Generator | None = None,
    dtype: DType = "float32",
    requires_grad: bool = False,
) -> Tensor:
    """Standard-normal samples; ``seed=`` (or ``eo.manual_seed``) makes them reproducible."""
    rng = generator_for(seed)
    return Tensor(rng.standard_normal(_shape(shape)).astype(dtype), requires_grad=requires_grad)


@dispatch.primitive("arange", kind="creation", inputs=(), differentiable=False)
def arange(*args: float, dtype: DType | None = None) -> Tensor:
    """``np.arange(*args, dtype=dtype)`` as a Tensor (no gradient)."""
    return Tensor(np.arange(*args, dtype=dtype))


dispatch.bind_tensor(Tensor)
