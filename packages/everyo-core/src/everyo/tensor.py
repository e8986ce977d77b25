"""The Tensor: a NumPy array plus what autograd needs to differentiate it.

Ops live in :mod:`everyo.functional` (elementwise, reductions, shapes,
matmul) and :mod:`everyo.conv` (convolution, pooling); they are attached to
``Tensor`` as methods and operators there, so this file stays about state.
"""

import operator

import numpy as np

from everyo import autograd, dispatch
from everyo.errors import EveryOInPlaceError
from everyo.random import generator_for
from everyo.half import is_bfloat16

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

    def __init__(self, data, requires_grad=False, dtype=None):
        self._data = _to_array(data, dtype)
        self._version = 0
        if requires_grad and not (np.issubdtype(self.data.dtype, np.floating) or is_bfloat16(self.data.dtype)):
            raise TypeError(f"only floating-point tensors can require grad, got {self.data.dtype}")
        self.grad = None
        self.requires_grad = bool(requires_grad)
        self._parents = ()
        self._backward = None
        self._retain = False
        self._hooks = self._post_hooks = ()

    # --- construction from an op ---------------------------------------
    @staticmethod
    def _from_op(data, parents, backward):
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
            if autograd.snapshots is not None:
                autograd.snapshot(out)
        else:
            out.requires_grad = False
            out._parents = ()
            out._backward = None
        return out

    # --- properties ----------------------------------------------------
    def _set_data(self, value):
        self._data = value
        autograd.bump_version(self)

    data = property(
        operator.attrgetter("_data"),
        _set_data,
        doc=(
            "The values, an ndarray. Assigning to it (``t.data = a``, and so ``t.data -= a``) counts as an "
            "in-place change, which backward checks (see :mod:`everyo.autograd`)."
        ),
    )

    @property
    def dtype(self):
        """The ``numpy.dtype`` of the values. It compares equal to its name
        and to the scalar type: ``t.dtype == 'float32'`` and
        ``t.dtype == np.float32`` both hold; ``str(t.dtype)`` is the name."""
        return self.data.dtype

    @property
    def shape(self):
        return self.data.shape

    @property
    def ndim(self):
        return self.data.ndim

    @property
    def size(self):
        return self.data.size

    @property
    def is_leaf(self):
        return self._backward is None

    def __len__(self):
        return len(self.data)

    def numpy(self):
        return self.data

    # --- Python values ---------------------------------------------------
    # Each conversion tells an active tracer first (dispatch.python_value):
    # a traced graph cannot follow a value into Python control flow.
    def item(self):
        """The value of a one-element tensor as a Python number."""
        dispatch.python_value(self, "item")
        return self.data.item()

    def tolist(self):
        """The values as (nested) Python lists of Python numbers."""
        dispatch.python_value(self, "tolist")
        return self.data.tolist()

    def __bool__(self):
        dispatch.python_value(self, "bool")
        return bool(self.data)  # NumPy's ambiguity error for more than one element

    def __int__(self):
        dispatch.python_value(self, "int")
        return int(self.data)

    def __float__(self):
        dispatch.python_value(self, "float")
        return float(self.data)

    def __index__(self):
        dispatch.python_value(self, "index")
        return self.data.__index__()  # integer tensors with one element only, as NumPy

    def __array__(self, dtype=None, copy=None):
        return self.data if dtype is None else self.data.astype(dtype)

    def __repr__(self):
        body = np.array2string(self.data, separator=", ", prefix="tensor(")
        extra = ", requires_grad=True" if self.requires_grad else ""
        return f"tensor({body}, dtype={self.dtype}{extra})"

    # --- autograd ------------------------------------------------------
    def backward(self, grad=None, retain_graph=False):
        """Accumulate d(self)/d(leaf) into every leaf's ``.grad``.

        Args:
            grad: the gradient of ``self`` (needed unless ``self`` has one element).
            retain_graph: keep the graph, so that backward can run through it
                again; by default it is freed as the pass goes.
        """
        autograd.backward(self, grad, retain_graph)

    def register_hook(self, fn):
        """Call ``fn(grad)`` with this tensor's gradient (an ndarray) each time a
        backward pass has computed it; a return value other than None replaces
        the gradient. Returns a handle whose ``remove()`` unregisters ``fn``."""
        if not self.requires_grad:
            raise RuntimeError("register_hook: this tensor does not require grad, so it never gets a gradient")
        if not self._hooks:
            self._hooks = []
        self._hooks.append(fn)
        return autograd.RemovableHandle(self._hooks, fn)

    def register_post_accumulate_grad_hook(self, fn):
        """Call ``fn(tensor)`` once this leaf's ``.grad`` holds everything the
        current backward pass adds to it (a data-parallel wrapper starts its
        all-reduce there). Returns a handle whose ``remove()`` unregisters ``fn``."""
        if not self.requires_grad or not self.is_leaf:
            raise RuntimeError("register_post_accumulate_grad_hook: only leaves that require grad accumulate a .grad")
        if not self._post_hooks:
            self._post_hooks = []
        self._post_hooks.append(fn)
        return autograd.RemovableHandle(self._post_hooks, fn)

    def retain_grad(self):
        """Keep this non-leaf tensor's gradient in ``.grad`` after backward()."""
        self._retain = True
        return self

    def detach(self):
        """The same values (sharing memory) outside the graph: no gradient flows through it."""
        return Tensor(self.data)

    def requires_grad_(self, requires_grad=True):
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

    def zero_grad(self):
        self.grad = None

    # --- in-place changes (not differentiable; each bumps the version) --------
    def _inplace(self, method, change):
        if self.requires_grad and autograd.is_grad_enabled():
            raise EveryOInPlaceError(
                f"Tensor.{method}: this tensor (shape {self.shape}, {self.dtype}) requires grad, and in-place "
                f"changes are not recorded for backward. Change it under eo.no_grad() (e.g. a parameter "
                f"update), or use the out-of-place op."
            )
        change(self._data)
        autograd.bump_version(self)
        return self

    def add_(self, other, alpha=1):
        """``self += alpha * other`` in place; returns ``self``."""
        other = other.data if isinstance(other, Tensor) else other
        return self._inplace(
            "add_", lambda a: np.add(a, other if alpha == 1 else alpha * np.asarray(other), out=a, casting="same_kind")
        )

    def mul_(self, other):
        """``self *= other`` in place; returns ``self``."""
        other = other.data if isinstance(other, Tensor) else other
        return self._inplace("mul_", lambda a: np.multiply(a, other, out=a, casting="same_kind"))

    def copy_(self, src):
        """Copy ``src``'s values (broadcast to this shape, cast to this dtype) into this tensor."""
        src = src.data if isinstance(src, Tensor) else src
        return self._inplace("copy_", lambda a: np.copyto(a, src, casting="unsafe"))

    def fill_(self, value):
        """Set every element to ``value``; returns ``self``."""
        return self._inplace("fill_", lambda a: a.fill(value))

    def zero_(self):
        """Set every element to 0; returns ``self``."""
        return self.fill_(0)


class Parameter(Tensor):
    """A Tensor that a Module registers as trainable (``requires_grad=True``)."""

    __slots__ = ()

    def __init__(self, data, dtype=None):
        super().__init__(data, requires_grad=True, dtype=dtype)

    def __repr__(self):
        return "Parameter(" + super().__repr__() + ")"


def _to_array(data, dtype=None):
    if isinstance(data, Tensor):
        data = data.data
    if isinstance(data, np.ndarray):
        arr = data
    else:
        arr = np.asarray(data)
        if arr.dtype == np.float64 and dtype is None:
            arr = arr.astype(_FLOAT_DEFAULT)  # Python floats -> float32, like PyTorch
    if dtype is not None:
        arr = arr.astype(np.dtype(dtype), copy=False)
    return arr


def tensor(data, dtype=None, requires_grad=False):
    """Create a Tensor. NumPy arrays keep their dtype unless ``dtype`` is given."""
    return Tensor(data, requires_grad=requires_grad, dtype=dtype)


def _shape(shape):
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        return tuple(shape[0])
    return tuple(shape)


def ones(*shape, dtype="float32", requires_grad=False):
    """A Tensor of ones of ``shape`` (ints or one tuple)."""
    return Tensor(np.ones(_shape(shape), dtype=dtype), requires_grad=requires_grad)


def zeros(*shape, dtype="float32", requires_grad=False):
    """A Tensor of zeros of ``shape`` (ints or one tuple)."""
    return Tensor(np.zeros(_shape(shape), dtype=dtype), requires_grad=requires_grad)


def randn(*shape, seed=None, dtype="float32", requires_grad=False):
    """Standard-normal samples; ``seed=`` (or ``eo.manual_seed``) makes them reproducible."""
    rng = generator_for(seed)
    return Tensor(rng.standard_normal(_shape(shape)).astype(dtype), requires_grad=requires_grad)


def arange(*args, dtype=None):
    """``np.arange(*args, dtype=dtype)`` as a Tensor (no gradient)."""
    return Tensor(np.arange(*args, dtype=dtype))
