"""Differentiable primitive ops: elementwise, reductions, shapes, matmul.

Each op computes its output with NumPy and hands ``Tensor._from_op`` one
closure mapping the output gradient to its inputs' gradients. Each is
registered in the op table (:mod:`everyo.dispatch`) with its precision
category, which routes its operands through the precision policy.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from everyo import _blas, _buffers, _passes, kernel_table
from everyo.axes import check_permutation, normalize_axes, normalize_axis
from everyo.casting import DEFAULT_FLOAT, is_floating, mixed_dtype, scalar_dtype
from everyo.casting import convert as _convert
from everyo.dispatch import FLOAT32, LOW_PRECISION, primitive
from everyo.errors import EveryOShapeError, EveryOSpellingError
from everyo.half import Rounded, _down, _rounded, _up, as_dtype, is_low_precision, takes_rounded
from everyo.random import default_generator
from everyo.tensor import Tensor

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from types import EllipsisType
    from typing import Any, TypeAlias

    from everyo._typing import Array, Axis, DType, Shape, TensorLike

    #: What ``tensor[index]`` accepts, as NumPy indexing does: ints, slices,
    #: ``None``, ``...``, integer or boolean arrays (or Tensors), or a tuple of those.
    Index: TypeAlias = int | slice | EllipsisType | None | TensorLike | tuple[Any, ...]

__all__ = [
    "add",
    "sub",
    "mul",
    "div",
    "neg",
    "pow",
    "matmul",
    "linear",
    "sum",
    "mean",
    "max",
    "min",
    "var",
    "exp",
    "log",
    "sqrt",
    "abs",
    "clip",
    "tanh",
    "sigmoid",
    "relu",
    "softmax",
    "log_softmax",
    "reshape",
    "transpose",
    "flatten",
    "concatenate",
    "stack",
    "where",
    "astype",
    "dropout",
]


def _t(x: TensorLike, like: Tensor | None = None) -> Tensor:
    """Wrap a non-Tensor operand as a constant. Python scalars stay weakly
    typed: ``float16 * 2.0`` stays float16, and ``int + 2.5`` is float32
    (everyo.casting.scalar_dtype)."""
    if isinstance(x, Tensor):
        return x
    if isinstance(x, (int, float, bool)) and like is not None:
        return Tensor(np.asarray(x, dtype=scalar_dtype(like.data.dtype, x)))
    return Tensor(x)


def _operands(a: TensorLike, b: TensorLike) -> tuple[Tensor, Tensor]:
    """Both operands of a binary op as Tensors, in the dtypes the op computes in.

    The one dtype rule for mixed operands (everyo.casting): a Python number
    takes the other operand's dtype (``float16_tensor * 2.0`` stays float16;
    a float with an integer tensor gives float32), and an integer or bool
    operand with a floating one takes the floating dtype (``int64 array *
    float32 tensor`` is float32, not NumPy's float64). float64 thus appears
    only where an operand is float64."""
    a, b = _t(a, b if isinstance(b, Tensor) else None), _t(b, a if isinstance(a, Tensor) else None)
    common = mixed_dtype(a.data.dtype, b.data.dtype)
    if common is not None:
        # The non-floating operand is a constant (integer tensors take no gradient).
        if a.data.dtype != common:
            a = Tensor(a.data.astype(common))
        else:
            b = Tensor(b.data.astype(common))
    return a, b


def unbroadcast(grad: Array, shape: Shape) -> Array:
    """Sum ``grad`` down to ``shape``: the backward of NumPy broadcasting."""
    if grad.shape == shape:
        return grad
    extra = grad.ndim - len(shape)
    if extra:
        grad = _sum_leading(grad, extra)
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and grad.shape[i] != 1)
    if axes:
        if axes == tuple(range(len(axes))):  # leading axes only (a (1, n) bias): column sums
            grad = _sum_leading(grad, len(axes))
        else:
            grad = grad.sum(axis=axes, keepdims=True)
    return grad.reshape(shape)


def _ufunc(op, x, y):
    """``op(x, y)``, into a recycled buffer when both are float arrays of one dtype."""
    if type(x) is np.ndarray and type(y) is np.ndarray and x.dtype == y.dtype and x.dtype.kind == "f":
        shape = x.shape if x.shape == y.shape else np.broadcast_shapes(x.shape, y.shape)
        return _passes.run(op, (x, y), _buffers.empty(shape, x.dtype))  # two halves where that applies
    return op(x, y)


# --- arithmetic ----------------------------------------------------------
@primitive("add", kind="elementwise", inputs=("a", "b"))
def add(a: TensorLike, b: TensorLike) -> Tensor:
    """``a + b`` with NumPy broadcasting; each gradient is summed back to its operand's shape."""
    a, b = _operands(a, b)
    sa, sb = a.data.shape, b.data.shape

    def backward(g):
        return (unbroadcast(g, sa) if a.requires_grad else None, unbroadcast(g, sb) if b.requires_grad else None)

    return Tensor._from_op(_ufunc(np.add, a.data, b.data), (a, b), backward)


@primitive("sub", kind="elementwise", inputs=("a", "b"))
def sub(a: TensorLike, b: TensorLike) -> Tensor:
    """``a - b`` with NumPy broadcasting."""
    a, b = _operands(a, b)
    sa, sb = a.data.shape, b.data.shape

    def backward(g):
        return (unbroadcast(g, sa) if a.requires_grad else None, unbroadcast(-g, sb) if b.requires_grad else None)

    return Tensor._from_op(_ufunc(np.subtract, a.data, b.data), (a, b), backward)


@primitive("mul", kind="elementwise", inputs=("a", "b"))
def mul(a: TensorLike, b: TensorLike) -> Tensor:
    """``a * b`` with NumPy broadcasting."""
    a, b = _operands(a, b)

    def backward(g):
        ga = unbroadcast(_product(g, b.data), a.data.shape) if a.requires_grad else None
        gb = unbroadcast(_product(g, a.data), b.data.shape) if b.requires_grad else None
        return ga, gb

    return Tensor._from_op(_ufunc(np.multiply, a.data, b.data), (a, b), backward)


def _product(g, x):
    # g * x; into a recycled buffer (everyo._buffers) when nothing broadcasts: the same
    # products, no fresh pages each step.
    if type(g) is np.ndarray and type(x) is np.ndarray and g.dtype == x.dtype and g.dtype.kind == "f":
        if g.shape == x.shape:
            return _passes.run(np.multiply, (g, x), _buffers.empty(g.shape, g.dtype))
        # x broadcasting into g (a scale, a per-feature weight): C order, as the fresh product
        # of two C-contiguous arrays is, so its sums over the broadcast axes are the same too.
        if (
            g.ndim
            and g.flags.c_contiguous
            and x.flags.c_contiguous
            and np.broadcast_shapes(g.shape, x.shape) == g.shape
        ):
            return _passes.run(np.multiply, (g, x), _buffers.empty(g.shape, g.dtype))
    return g * x


@primitive("div", kind="elementwise", inputs=("a", "b"))
def div(a: TensorLike, b: TensorLike) -> Tensor:
    """``a / b`` with NumPy broadcasting; integer / integer gives float32 (PyTorch's true division)."""
    a, b = _operands(a, b)
    if not is_floating(a.data.dtype) and not is_floating(b.data.dtype):
        a, b = Tensor(a.data.astype(DEFAULT_FLOAT)), Tensor(b.data.astype(DEFAULT_FLOAT))

    def backward(g):
        ga = unbroadcast(g / b.data, a.data.shape) if a.requires_grad else None
        gb = unbroadcast(-g * a.data / (b.data * b.data), b.data.shape) if b.requires_grad else None
        return ga, gb

    return Tensor._from_op(a.data / b.data, (a, b), backward)


@primitive("neg", kind="elementwise")
def neg(a: Tensor) -> Tensor:
    """``-a`` elementwise."""
    return Tensor._from_op(-a.data, (a,), lambda g: (-g,))


@primitive("pow", FLOAT32, kind="elementwise", inputs=("a", "exponent"))
def pow(a: TensorLike, exponent: TensorLike) -> Tensor:
    """``a ** exponent`` (exponent a number, an array or a Tensor; ``2 ** x``
    works too); runs in float32 under autocast. The exponent's gradient
    ``a ** b * log(a)`` is taken as 0 where ``a`` is 0."""
    if isinstance(exponent, (int, float)):
        a = _t(a)
        if not is_floating(a.data.dtype):  # int ** 0.5 is float32, bool ** 2 is int64
            a = Tensor(a.data.astype(scalar_dtype(a.data.dtype, exponent)))
    else:
        a, exponent = _operands(a, exponent)
    if isinstance(exponent, Tensor):
        out = np.power(a.data, exponent.data)

        def backward(g):
            ga = gb = None
            if a.requires_grad:
                ga = unbroadcast(g * exponent.data * np.power(a.data, exponent.data - 1), a.data.shape)
            if exponent.requires_grad:
                with np.errstate(divide="ignore", invalid="ignore"):
                    log_a = np.where(a.data == 0, 0, np.log(a.data))
                gb = unbroadcast(g * out * log_a, exponent.data.shape)
            return ga, gb

        return Tensor._from_op(out, (a, exponent), backward)
    p = exponent
    x = a.data
    if p == 2:
        return Tensor._from_op(x * x, (a,), lambda g: (g * (2 * x),))
    return Tensor._from_op(np.power(x, p), (a,), lambda g: (g * (p * np.power(x, p - 1)),))


# --- matmul and the fused linear -------------------------------------------
# The dtypes everyo-kernels' dense kernels are used for, from this many elements (kernel_table).
_COMPILED, _KERNEL_MIN_SIZE = kernel_table.FLOAT_DTYPES, kernel_table.MIN_SIZE


def _mm(x, y):
    # NumPy's float16 matmul is a naive loop with no BLAS (hundreds of times
    # slower; ml_dtypes' bfloat16 one too, and it returns float32). Upcasting
    # to float32 for the BLAS call and casting the result down gives the same
    # 16-bit rounding of the float32-accumulated product.
    if x.dtype == y.dtype and is_low_precision(x.dtype):
        return _down(_mm(_up(x), _up(y)), x.dtype)
    if x.ndim == 2 and y.ndim == 2 and x.shape[1] == 1:
        # An outer product (e.g. the backward of a 1-unit output layer): a
        # broadcast multiply is exact (one product per element) and ~3x
        # faster than BLAS for this shape. Into a recycled buffer, as below;
        # through everyo-kernels' outer_product (the same products) where it applies.
        if x.dtype == y.dtype and x.dtype.kind == "f":
            out = _buffers.empty((x.shape[0], y.shape[1]), x.dtype)
            use = out.size >= _KERNEL_MIN_SIZE and x.dtype in _COMPILED
            step = kernel_table.get("outer_product") if use else None
            if step is not None:
                step(x.reshape(-1), y.reshape(-1), out)
                return out
            return np.multiply(x, y, out=out)
        return x * y
    if x.dtype == y.dtype and x.ndim == y.ndim >= 2 and x.shape[:-2] == y.shape[:-2] and x.dtype.kind == "f":
        # Into a recycled buffer (see everyo._buffers): the same BLAS call, the same bits.
        return _blas.matmul(x, y, _buffers.empty(x.shape[:-1] + y.shape[-1:], x.dtype))
    return _blas.matmul(x, y)


@primitive("matmul", LOW_PRECISION, kind="matmul", inputs=("a", "b"))
def matmul(a: TensorLike, b: TensorLike) -> Tensor:
    """Matrix product with NumPy's broadcasting rules (1-D operands allowed)."""
    a, b = _operands(a, b)
    x, y = a.data, b.data
    if (
        x.dtype == y.dtype
        and is_low_precision(x.dtype)
        and x.ndim >= 2
        and y.ndim >= 2
        and x.shape[:-2] == y.shape[:-2]
    ):
        return _matmul_half(a, b)
    out = _mm(x, y)

    def backward(g):
        if x.ndim == 1 and y.ndim == 1:  # a dot product: g is 0-d
            return (g * y if a.requires_grad else None), (g * x if b.requires_grad else None)
        x2 = x[None, :] if x.ndim == 1 else x
        y2 = y[:, None] if y.ndim == 1 else y
        g2 = g
        if x.ndim == 1:
            g2 = np.expand_dims(g2, -2)
        if y.ndim == 1:
            g2 = np.expand_dims(g2, -1)
        ga = gb = None
        if a.requires_grad:
            ga = _mm(g2, np.swapaxes(y2, -1, -2))
            ga = unbroadcast(ga, x2.shape).reshape(x.shape)
        if b.requires_grad:
            gb = _mm(np.swapaxes(x2, -1, -2), g2)
            gb = unbroadcast(gb, y2.shape).reshape(y.shape)
        return ga, gb

    return Tensor._from_op(out, (a, b), backward)


def _matmul_half(a, b):
    # Two 16-bit operands with the same batch axes (attention's products): as
    # _mm's 16-bit path in forward; in backward the incoming gradient is taken
    # as a Rounded, converted up once for both products, and each gradient is
    # rounded once and handed on as a Rounded (nothing to sum over broadcast
    # axes here), the values _mm would give, without encoding them.
    x, y = a.data, b.data
    dt = x.dtype
    out = _down(_mm(_up(x), _up(y)), dt)

    @takes_rounded
    def backward(g):
        g32 = _up(g)
        ga = _rounded(_mm(g32, np.swapaxes(_up(y), -1, -2)), dt) if a.requires_grad else None
        gb = _rounded(_mm(np.swapaxes(_up(x), -1, -2), g32), dt) if b.requires_grad else None
        return ga, gb

    backward.__qualname__ = "matmul.<locals>.backward"
    return Tensor._from_op(out, (a, b), backward)


@primitive("linear", LOW_PRECISION, kind="matmul", inputs=("x", "weight", "bias"))
def linear(x: TensorLike, weight: Tensor, bias: Tensor | None = None, transpose_weight: bool = False) -> Tensor:
    """``x @ weight + bias`` as one op; ``weight`` is (in, out) (Keras layout),
    or (out, in) with ``transpose_weight=True`` (``x @ weight.T + bias``, no copy:
    how a Linear uses an Embedding's table it is tied to).

    Leading axes of ``x`` are flattened into one batch axis so the product is a
    single BLAS call.
    """
    x = _t(x)
    dt = x.data.dtype
    if is_low_precision(dt) and weight.data.dtype == dt and (bias is None or bias.data.dtype == dt):
        return _linear_half(x, weight, bias, transpose_weight)
    xd, w = x.data, (weight.data.T if transpose_weight else weight.data)
    lead = xd.shape[:-1]
    x2 = xd.reshape(-1, xd.shape[-1])
    # A narrow input (under half as many features in as out, e.g. an RNN's input
    # projection to its gates) and more rows than features: the bias rides in the
    # product as a column of ones in x and a row of W. That copies x and W but
    # saves a pass over the wider output here, and the bias gradient's sum over it
    # in backward (it is the last row of the weight gradient's product). Measured
    # on the LSTM's 32 -> 512 projection: ~7-10% off the linear's forward+backward;
    # at 64 -> 128 (the seed MLP) no gain, so it keeps the plain product there.
    ones_column = (
        bias is not None and not transpose_weight and 2 * x2.shape[1] < w.shape[1] and x2.shape[0] > x2.shape[1]
    )
    if ones_column:
        assert bias is not None  # implied by ones_column
        rt = np.result_type(x2, w)
        # x1 and the product come from the recycled pool like every other large result
        # (fresh arrays here were a quarter of the encoder's page faults per step).
        x1 = _buffers.empty((x2.shape[0], x2.shape[1] + 1), rt)
        _passes.run(_passes.copy, (x2,), x1[:, :-1])  # x1[:, :-1] = x2 (in halves where that applies)
        x1[:, -1] = 1
        out = _mm(x1, np.concatenate([w, bias.data[None]], axis=0, dtype=rt))
    else:
        out = _mm(x2, w)
        if bias is not None:
            _add_bias(out, bias.data)
    out = out.reshape(lead + (w.shape[1],))

    def backward(g):
        g2 = g.reshape(-1, g.shape[-1])
        gx = _mm(g2, w.T).reshape(xd.shape) if x.requires_grad else None
        if ones_column and weight.requires_grad:
            assert bias is not None
            gwb = _mm(x1.T, g2)
            return gx, gwb[:-1], gwb[-1] if bias.requires_grad else None
        gw = None if not weight.requires_grad else _mm(g2.T, x2) if transpose_weight else _mm(x2.T, g2)
        if bias is None:
            return gx, gw
        if not bias.requires_grad:
            gb = None
        elif g2.dtype == np.float16:
            gb = g2.sum(axis=0, dtype=np.float32)
        else:
            gb = _sum_leading(g2)
        return gx, gw, gb

    parents = (x, weight) if bias is None else (x, weight, bias)
    return Tensor._from_op(out, parents, backward)


def _sum_leading(a, k=1):
    # a.sum(axis=tuple(range(k))), the gradient of a bias (or of any operand broadcast
    # along a's first k axes): through everyo-kernels' column_sums where it applies.
    # NumPy sums a C-contiguous array over its leading axes row by row in order (one
    # inner-loop call per row: 2.2 ms on the CNN's (100352, 32), 0.41 ms compiled);
    # the kernel adds in that order, so the bits are the same. With fewer than two
    # values per row NumPy sums pairwise instead, and keeps that path here.
    width = math.prod(a.shape[k:])
    use = (
        type(a) is np.ndarray
        and 0 < k < a.ndim
        and width >= 2
        and a.size >= _KERNEL_MIN_SIZE
        and a.dtype in _COMPILED
        and a.flags.c_contiguous
    )
    step = kernel_table.get("column_sums") if use else None
    if step is None:
        return a.sum(axis=tuple(range(k)))
    out = np.empty(width, a.dtype)
    step(a.reshape(-1, width), out)
    return out.reshape(a.shape[k:])


def _add_bias(out, b):
    # out += b, through everyo-kernels' one-pass add_bias where it applies (same bits).
    use = out.size >= _KERNEL_MIN_SIZE and out.dtype == b.dtype and out.dtype in _COMPILED
    step = kernel_table.get("add_bias") if use else None
    if step is not None and out.ndim == 2 and out.flags.c_contiguous and b.ndim == 1 and b.flags.c_contiguous:
        step(out, b)
    else:
        out += b


def _linear_half(x, weight, bias, transpose_weight):
    # float16 (or bfloat16) operands: one float32 BLAS call with the bias added in float32,
    # then a single rounding to float16 (what a fused float16 GEMM does). Each
    # gradient is rounded once the same way and handed on as a Rounded (its
    # float16 values kept in float32, so the next float16 op skips converting
    # it back up); the incoming gradient is converted up once and shared by
    # the three products. Only float16 arrays are saved for backward (x is
    # converted again there), so the memory autocast saves is not spent on
    # float32 copies.
    xd = x.data
    dt = xd.dtype
    lead = xd.shape[:-1]
    x2 = xd.reshape(-1, xd.shape[-1])
    w32 = _up(weight.data).T if transpose_weight else _up(weight.data)
    out = _mm(_up(x2), w32)
    if bias is not None:
        out += _up(bias.data)
    out = _down(out, dt).reshape(lead + (w32.shape[1],))

    @takes_rounded
    def backward(g):
        g2 = _up(g).reshape(-1, g.shape[-1])
        gx = _rounded(_mm(g2, w32.T).reshape(xd.shape), dt) if x.requires_grad else None
        if weight.requires_grad:
            gw = _rounded(_mm(g2.T, _up(x2)) if transpose_weight else _mm(_up(x2).T, g2), dt)
        else:
            gw = None
        if bias is None:
            return gx, gw
        # float32 sum; autograd rounds it once to the bias's float16.
        return gx, gw, (g2.sum(axis=0) if bias.requires_grad else None)

    parents = (x, weight) if bias is None else (x, weight, bias)
    return Tensor._from_op(out, parents, backward)


# --- reductions -----------------------------------------------------------
_axes = normalize_axes  # (axis, shape, op) -> sorted tuple of axes, checked as NumPy does


def _expand(g, shape, axes, keepdims):
    if not keepdims:
        g = np.expand_dims(g, axes)
    return np.broadcast_to(g, shape)


@primitive("sum", FLOAT32, kind="reduction")
def sum(a: TensorLike, axis: Axis = None, keepdims: bool = False) -> Tensor:
    """The sum over ``axis`` (all axes when ``None``), keeping the reduced axes as 1 if ``keepdims``."""
    a = _t(a)
    shape, axes = a.data.shape, _axes(axis, a.data.shape, "sum")
    out = np.asarray(a.data.sum(axis=axes, keepdims=keepdims))
    return Tensor._from_op(out, (a,), lambda g: (_expand(g, shape, axes, keepdims),))


@primitive("mean", FLOAT32, kind="reduction")
def mean(a: TensorLike, axis: Axis = None, keepdims: bool = False) -> Tensor:
    """The mean over ``axis`` (all axes when ``None``), keeping the reduced axes as 1 if ``keepdims``."""
    a = _t(a)
    shape, axes = a.data.shape, _axes(axis, a.data.shape, "mean")
    count = int(np.prod([shape[i] for i in axes])) if axes else 1
    out = np.asarray(a.data.mean(axis=axes, keepdims=keepdims))
    return Tensor._from_op(out, (a,), lambda g: (_expand(g / count, shape, axes, keepdims),))


@primitive("var", FLOAT32, kind="reduction")
def var(a: TensorLike, axis: Axis = None, keepdims: bool = False, ddof: float = 0) -> Tensor:
    """Variance (``ddof=0``: the biased estimate, like NumPy)."""
    a = _t(a)
    x = a.data
    shape, axes = x.shape, _axes(axis, x.shape, "var")
    count = int(np.prod([shape[i] for i in axes])) if axes else 1
    # PyTorch's divisor max(count - ddof, 0): with none left (ddof=1 over one
    # element) the variance is 0/0 = NaN and so is its gradient, never 0.
    den = np.asarray(count - ddof if count > ddof else 0, x.dtype)
    with np.errstate(invalid="ignore", divide="ignore"):
        centered = x - x.mean(axis=axes, keepdims=True)
        out = np.asarray((centered * centered).sum(axis=axes, keepdims=keepdims) / den)

    def backward(g):
        with np.errstate(invalid="ignore", divide="ignore"):
            return (_expand(g, shape, axes, keepdims) * centered * (2.0 / den),)

    return Tensor._from_op(out, (a,), backward)


def _extreme(a, axis, keepdims, reducer, op):
    a = _t(a)
    x = a.data
    shape, axes = x.shape, _axes(axis, x.shape, op)
    if any(shape[i] == 0 for i in axes):
        raise EveryOShapeError(
            f"{op}: cannot take the {op}imum over an empty axis (shape {shape}, axis={axis!r}), as PyTorch refuses "
            f"too; reduce over a non-empty axis, or use eo.sum/eo.logsumexp, which are defined over nothing"
        )
    kept = reducer(x, axis=axes, keepdims=True)
    out = kept if keepdims else np.squeeze(kept, axis=axes)

    def backward(g):
        # Ties share the gradient equally, so the sum over the window is exact.
        mask = x == kept
        count = mask.sum(axis=axes, keepdims=True)
        return (_expand(g, shape, axes, keepdims) * mask / count,)

    return Tensor._from_op(np.asarray(out), (a,), backward)


@primitive("max", kind="reduction")
def max(a: TensorLike, axis: Axis = None, keepdims: bool = False) -> Tensor:
    """The maximum over ``axis`` (all axes when ``None``); the gradient goes to the maximal entries."""
    return _extreme(a, axis, keepdims, np.max, "max")


@primitive("min", kind="reduction")
def min(a: TensorLike, axis: Axis = None, keepdims: bool = False) -> Tensor:
    """The minimum over ``axis`` (all axes when ``None``); the gradient goes to the minimal entries."""
    return _extreme(a, axis, keepdims, np.min, "min")


# --- elementwise ----------------------------------------------------------
@primitive("exp", FLOAT32, kind="elementwise")
def exp(a: TensorLike) -> Tensor:
    """``e ** a`` elementwise."""
    a = _t(a)
    out = np.exp(a.data)
    return Tensor._from_op(out, (a,), lambda g: (g * out,))


@primitive("log", FLOAT32, kind="elementwise")
def log(a: TensorLike) -> Tensor:
    """Natural logarithm elementwise."""
    a = _t(a)
    x = a.data
    return Tensor._from_op(np.log(x), (a,), lambda g: (g / x,))


@primitive("sqrt", kind="elementwise")
def sqrt(a: TensorLike) -> Tensor:
    """Square root elementwise."""
    a = _t(a)
    out = np.sqrt(a.data)
    return Tensor._from_op(out, (a,), lambda g: (g / (2 * out),))


@primitive("abs", kind="elementwise")
def abs(a: TensorLike) -> Tensor:
    """``|a|`` elementwise (the gradient at 0 is 0)."""
    a = _t(a)
    x = a.data
    return Tensor._from_op(np.abs(x), (a,), lambda g: (g * np.sign(x),))


@primitive("clip", kind="elementwise")
def clip(a: TensorLike, min: float | None = None, max: float | None = None) -> Tensor:
    """``a`` limited to ``[min, max]`` (either bound may be ``None``); the gradient is 0 where clipped."""
    a = _t(a)
    x = a.data
    out = np.clip(x, min, max)

    def backward(g):
        inside = np.ones(x.shape, dtype=bool)
        if min is not None:
            inside &= x >= min
        if max is not None:
            inside &= x <= max
        return (g * inside,)

    return Tensor._from_op(out, (a,), backward)


@primitive("tanh", kind="elementwise")
def tanh(a: TensorLike) -> Tensor:
    """``tanh(a)`` elementwise."""
    a = _t(a)
    out = np.tanh(a.data)
    return Tensor._from_op(out, (a,), lambda g: (g * (1 - out * out),))


@primitive("sigmoid", kind="elementwise")
def sigmoid(a: TensorLike) -> Tensor:
    """``1 / (1 + exp(-a))`` elementwise."""
    a = _t(a)
    # exp(-log(1 + exp(-x))) never overflows, for either sign of x.
    out = np.exp(-np.logaddexp(0, -a.data)).astype(a.data.dtype, copy=False)
    return Tensor._from_op(out, (a,), lambda g: (g * out * (1 - out),))


@primitive("relu", kind="elementwise")
def relu(a: TensorLike) -> Tensor:
    """``max(a, 0)`` elementwise."""
    a = _t(a)
    if is_low_precision(a.data.dtype):
        return _relu_half(a)
    ad = a.data
    if ad.dtype.kind == "f":
        out = _buffers.empty(ad.shape, ad.dtype)
        use = type(ad) is np.ndarray and ad.size >= _KERNEL_MIN_SIZE and ad.dtype in _COMPILED and ad.flags.c_contiguous
        step = kernel_table.get("relu_forward") if use else None
        if step is not None:  # the same bits, ~4x faster than maximum with a scalar 0
            step(ad.reshape(-1), out.reshape(-1))
        else:
            np.maximum(ad, 0, out=out)
    else:
        out = np.maximum(ad, 0)

    # not (out <= 0), rather than out > 0: at a NaN input the gradient passes
    # (NaN stays NaN downstream), as in PyTorch, instead of being cut to 0.
    # out is max(a, 0): never below 0, so not (out <= 0) is out != 0 (NaN != 0
    # too, and -0 == 0), one pass instead of a compare and a negation.
    def backward(g):
        if g.dtype == out.dtype and g.shape == out.shape:  # the common case, into recycled buffers
            res = _buffers.empty(g.shape, g.dtype)
            use = g.size >= _KERNEL_MIN_SIZE and g.dtype in _COMPILED
            step = kernel_table.get("relu_backward") if use else None
            if step is not None and g.flags.c_contiguous and out.flags.c_contiguous and res.flags.c_contiguous:
                step(g.reshape(-1), out.reshape(-1), res.reshape(-1))  # the same bits in one pass
                return (res,)
            live = np.not_equal(out, 0, out=_buffers.empty(out.shape, np.bool_))
            return (np.multiply(g, live, out=res),)
        return (g * ~(out <= 0),)

    return Tensor._from_op(out, (a,), backward)


_RELU_FACTORS = np.array([1.0, 0.0], np.float32)  # relu_codes_backward's g * True and g * False
_F32_INF = np.float32(np.inf)


def _relu_half(a):
    # NumPy's float16 maximum/multiply convert every element (~40x slower than
    # float32). ReLU only selects, so it can work on the 16-bit codes: same
    # results as np.maximum(x, 0) and g * (out > 0), code for code.
    # bfloat16's codes are laid out alike, with +inf at 0x7F80 and the quiet
    # NaN 0x7FC0 instead of float16's 0x7C00 and 0x7E00.
    u16, dt = np.uint16, a.data.dtype
    inf, nan = (0x7C00, 0x7E00) if dt == np.float16 else (0x7F80, 0x7FC0)
    codes = a.data.view(u16)
    # everyo-kernels' relu_codes / relu_codes_backward: the same operations in one pass each.
    big = type(codes) is np.ndarray and codes.size >= _KERNEL_MIN_SIZE and codes.flags.c_contiguous
    step = kernel_table.get("relu_codes") if big else None
    if step is not None:
        out = _buffers.empty(codes.shape, u16)  # recycled, as the float32 ReLU's result
        step(codes.reshape(-1), inf, out.reshape(-1))
        out = out.view(dt)
    else:
        # Codes 0x8001..0x8000 + inf are the negative non-NaN values other than -0.
        keep = np.greater_equal(np.subtract(codes, u16(0x8001)), u16(inf))
        out = np.multiply(codes, keep).view(dt)

    @takes_rounded
    def backward(grad):
        # The gradient passes where not (out <= 0), as in the float32 path:
        # out holds no negative number but -0, so that is every code whose
        # magnitude bits are not 0 (positive values and NaNs of either sign).
        if isinstance(grad, Rounded) and step is not None:
            f32 = grad.f32
            back = kernel_table.get("relu_codes_backward")
            usable = type(f32) is np.ndarray and f32.dtype == np.float32 and f32.shape == out.shape
            if back is not None and usable and f32.flags.c_contiguous:
                if back(f32.reshape(-1), out.view(u16).reshape(-1), _RELU_FACTORS):  # g * live, in place
                    np.multiply(_F32_INF, _RELU_FACTORS[1])  # an inf * 0 was made: NumPy's warning (errstate)
                return (Rounded(f32, dt),)
        live = np.not_equal(np.bitwise_and(out.view(u16), u16(0x7FFF)), u16(0))
        if isinstance(grad, Rounded):
            # float16 values in float32: g * 1 is g, g * 0 a signed zero (NaN
            # for inf/NaN), each again a float16 value. The array is this
            # backward's own (autograd hands each gradient to one consumer).
            return (Rounded(np.multiply(grad.f32, live, out=grad.f32), dt),)
        gc = grad.view(u16)
        # g * 1 is g; g * 0 is a zero with g's sign, or NaN if g is inf/NaN.
        res = np.multiply(live, u16(0x7FFF))
        res |= u16(0x8000)
        res &= gc
        nonfinite = np.equal(np.bitwise_and(gc, u16(inf)), u16(inf))
        if nonfinite.any():
            res[nonfinite & ~live] = nan
        return (res.view(dt),)

    return Tensor._from_op(out, (a,), backward)


def _hide(data: np.ndarray, blocked: TensorLike) -> np.ndarray:
    """A copy of ``data`` with the ``blocked`` entries set to -inf (what
    ``np.where(blocked, -inf, data)`` gives; a copy and a masked fill is the
    faster of the two where the mask broadcasts to ``data``)."""
    mask = blocked.data if isinstance(blocked, Tensor) else np.asarray(blocked)
    if mask.dtype != np.bool_ or np.broadcast_shapes(mask.shape, data.shape) != data.shape:
        return np.where(mask, -np.inf, data)
    out = _buffers.copy_of(data)  # data.copy(): C order, into a recycled buffer
    np.copyto(out, -np.inf, where=mask)
    return out


def _row_mask(blocked: TensorLike, shape: tuple[int, ...]) -> np.ndarray | None:
    """``blocked`` as a C-contiguous boolean (mrows, n) whose rows repeat over
    the rows of an array of ``shape`` (last axis n), or None where it is no
    boolean array broadcasting to ``shape``. A mask that varies only over
    trailing axes (a causal (L, S) mask over (B, H, L, S) scores) is used as
    it is; any other is broadcast to ``shape`` first."""
    mask = blocked.data if isinstance(blocked, Tensor) else np.asarray(blocked)
    if mask.dtype != np.bool_:
        return None
    try:
        if np.broadcast_shapes(mask.shape, shape) != shape:
            return None
    except ValueError:
        return None
    padded = (1,) * (len(shape) - mask.ndim) + mask.shape
    k = len(shape)  # the mask is the full trailing shape from axis k on
    while k > 0 and padded[k - 1] == shape[k - 1]:
        k -= 1
    if k == len(shape) or any(d != 1 for d in padded[:k]):
        mask = np.broadcast_to(mask, shape)
    return np.ascontiguousarray(mask).reshape(-1, shape[-1])


def _softmax_rows(data: np.ndarray, axis: int, blocked: TensorLike | None) -> np.ndarray | None:
    """softmax over the last axis of a C-contiguous float32 array through
    everyo-kernels' softmax_shift/softmax_scale, around NumPy's own ``exp``
    (the same bits as the reference below); None where they do not apply."""
    use = (
        data.dtype == np.float32 and axis == data.ndim - 1 and data.size >= _KERNEL_MIN_SIZE and data.flags.c_contiguous
    )
    shift = kernel_table.get("softmax_shift") if use else None
    scale = kernel_table.get("softmax_scale") if shift is not None else None
    if shift is None or scale is None:
        return None
    mask = None if blocked is None else _row_mask(blocked, data.shape)
    if blocked is not None and mask is None:
        return None
    out = _buffers.empty(data.shape, data.dtype)
    rows = out.reshape(-1, data.shape[-1])
    shift(data.reshape(-1, data.shape[-1]), mask, rows)
    _passes.run(np.exp, (out,), out)
    scale(rows)
    return out


def _softmax_rows_backward(g: np.ndarray, out: np.ndarray, axis: int) -> np.ndarray | None:
    """softmax's gradient over the last axis through everyo-kernels'
    softmax_backward (float32/float64, C-contiguous; the same bits); None where
    it does not apply."""
    use = (
        g.dtype == out.dtype
        and g.dtype in _COMPILED
        and g.shape == out.shape
        and axis == out.ndim - 1
        and out.size >= _KERNEL_MIN_SIZE
        and g.flags.c_contiguous
        and out.flags.c_contiguous
    )
    step = kernel_table.get("softmax_backward") if use else None
    if step is None:
        return None
    gx = _buffers.empty(g.shape, g.dtype)
    n = g.shape[-1]
    step(g.reshape(-1, n), out.reshape(-1, n), gx.reshape(-1, n))
    return gx


def _softmax_numpy(data: np.ndarray, axis: int, blocked: TensorLike | None) -> np.ndarray:
    """The reference softmax (see :func:`softmax`)."""
    data = data if blocked is None else _hide(data, blocked)
    peak = data.max(axis=axis, keepdims=True, initial=-np.inf)  # initial: an empty axis is no error
    # Shifting a fully ignored slice by 0 (not by -inf) keeps exp() at 0
    # instead of producing exp(-inf - -inf) = NaN.
    peak = np.where(np.isfinite(peak), peak, 0).astype(data.dtype, copy=False)
    # One full-size buffer (the masked copy, when there is one, is reused):
    # shift, exp and divide in place, the same arithmetic as e = exp(data - peak).
    if blocked is not None:
        e = np.subtract(data, peak, out=data)
    elif data.flags.c_contiguous:  # into a recycled buffer of the fresh result's layout: the same sums
        e = np.subtract(data, peak, out=_buffers.empty(data.shape, data.dtype))
    else:
        e = np.subtract(data, peak)
    np.exp(e, out=e)
    total = e.sum(axis=axis, keepdims=True)
    # Only an all-ignored slice (total 0) is divided by 1; a NaN or inf total
    # must reach every entry of its slice (PyTorch: a slice holding NaN is NaN).
    out = np.divide(e, np.where(total == 0, 1, total).astype(data.dtype, copy=False), out=e)
    return out


@primitive("softmax", FLOAT32, kind="reduction", inputs=("a", "blocked"))
def softmax(a: TensorLike, axis: int = -1, blocked: TensorLike | None = None) -> Tensor:
    """Numerically stable softmax (the maximum is subtracted first).

    ``blocked`` (optional) is a boolean array broadcastable to ``a``: those
    entries are ignored, like entries equal to ``-inf``. A slice with every
    entry ignored gives all zeros (and a zero gradient), never NaN, which is
    what masked attention needs: attention over nothing attends to nothing.
    """
    a = _t(a)
    axis = normalize_axis(axis, a.data.shape, "softmax")
    # Through everyo-kernels where they apply (the same bits), else the reference:
    out = _softmax_rows(a.data, axis, blocked)
    if out is None:
        out = _softmax_numpy(a.data, axis, blocked)

    def backward(g):
        gx = _softmax_rows_backward(g, out, axis)
        if gx is not None:
            return (gx,)
        # out * (g - sum(g * out)) in one buffer (a recycled one where its layout is the
        # fresh product's: the same sums).
        same = type(g) is np.ndarray and g.shape == out.shape and g.dtype == out.dtype
        if same and g.flags.c_contiguous and out.flags.c_contiguous:
            gx = np.multiply(g, out, out=_buffers.empty(g.shape, g.dtype))
        else:
            gx = np.multiply(g, out)
        dot = gx.sum(axis=axis, keepdims=True)
        np.subtract(g, dot, out=gx)
        gx *= out
        return (gx,)

    return Tensor._from_op(out, (a,), backward)


@primitive("log_softmax", FLOAT32, kind="reduction")
def log_softmax(a: TensorLike, axis: int = -1) -> Tensor:
    """Numerically stable ``log(softmax(a))`` via the log-sum-exp trick."""
    a = _t(a)
    axis = normalize_axis(axis, a.data.shape, "log_softmax")
    shifted = a.data - a.data.max(axis=axis, keepdims=True, initial=-np.inf)
    lse = np.log(np.exp(shifted).sum(axis=axis, keepdims=True))
    out = np.subtract(shifted, lse, out=shifted)

    def backward(g):
        gx = np.exp(out)
        gx *= g.sum(axis=axis, keepdims=True)
        return (np.subtract(g, gx, out=gx),)

    return Tensor._from_op(out, (a,), backward)


# --- shapes ------------------------------------------------------------------
def _resolve_reshape(inputs, attrs):
    # The tracer sees the target shape as one tuple, however it was passed.
    shape = attrs["shape"]
    attrs["shape"] = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else tuple(shape)
    return attrs


def _transpose_order(axes, shape):
    """The permutation ``transpose(*axes)`` applies: NumPy's (a full
    permutation, one sequence or several ints; none reverses), or, for exactly
    two ints on a tensor of more than two axes, PyTorch's swap of those two."""
    ndim = len(shape)
    if len(axes) == 1 and isinstance(axes[0], (tuple, list)):
        return check_permutation(tuple(axes[0]), shape, "transpose") if axes[0] else tuple(reversed(range(ndim)))
    if not axes:
        return tuple(reversed(range(ndim)))
    if len(axes) == 2 and ndim != 2:
        a, b = (normalize_axis(d, shape, "transpose") for d in axes)
        order = list(range(ndim))
        order[a], order[b] = order[b], order[a]
        return tuple(order)
    order = check_permutation(axes, shape, "transpose")
    if ndim == 2 and order == (0, 1):
        raise EveryOSpellingError(
            f"transpose{tuple(axes)} on a 2-d tensor (shape {tuple(shape)}) is ambiguous: NumPy reads it as the "
            f"identity permutation, PyTorch as swapping the two axes. Swap with x.T or x.swapaxes(0, 1); "
            f"for the identity pass one tuple, x.transpose((0, 1))"
        )
    return order


def _resolve_transpose(inputs, attrs):
    attrs["axes"] = _transpose_order(tuple(attrs["axes"]), inputs[0].data.shape)
    return attrs


@primitive("reshape", kind="shape", resolve=_resolve_reshape)
def reshape(a: TensorLike, *shape: int | Sequence[int]) -> Tensor:
    """``a`` with a new shape (one entry may be ``-1``), as ``np.reshape``."""
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    a = _t(a)
    old = a.data.shape
    try:
        out = _reshaped(a.data, shape)
    except (ValueError, TypeError) as exc:
        raise EveryOShapeError(
            f"reshape: cannot reshape a tensor of shape {old} ({a.data.size} elements) to {shape}: {exc}"
        ) from None
    return Tensor._from_op(out, (a,), _moves("reshape", lambda g: _reshaped(g, old)))


def _reshaped(data: np.ndarray, shape: tuple[Any, ...]) -> np.ndarray:
    """``data.reshape(shape)``: a view where one exists; else the same C-order copy
    NumPy would make, for a float array into a recycled buffer (everyo._buffers)."""
    if type(data) is not np.ndarray or data.dtype.kind != "f":
        return data.reshape(shape)
    try:
        return data.reshape(shape, copy=False)
    except TypeError:  # NumPy 2.0: reshape has no copy= (2.1 added it); setting .shape never copies
        view = data.view()
        try:
            view.shape = shape  # a wrong size raises ValueError (-> EveryOShapeError)
            return view
        except AttributeError:  # no view of this layout has that shape: copy below
            pass
    except ValueError:
        pass
    return _buffers.copy_of(data).reshape(shape)  # (an impossible shape raises NumPy's own error here)


def _moves(op, move):
    """A shape op's backward, ``move`` applied to the gradient; a 16-bit
    gradient held as float32 values (a Rounded) stays one: moving values
    rounds nothing."""

    @takes_rounded
    def backward(g):
        if isinstance(g, Rounded):
            return (Rounded(move(g.f32), g.dtype),)
        return (move(g),)

    backward.__qualname__ = f"{op}.<locals>.backward"
    return backward


@primitive("flatten", kind="shape")
def flatten(a: TensorLike, start_axis: int = 1) -> Tensor:
    """Merge the axes from ``start_axis`` (default 1, keeping the batch axis) into one."""
    a = _t(a)
    start_axis = normalize_axis(start_axis, a.data.shape, "flatten")
    return reshape(a, a.data.shape[:start_axis] + (-1,))


@primitive("transpose", kind="shape", resolve=_resolve_transpose)
def transpose(a: TensorLike, *axes: int | Sequence[int]) -> Tensor:
    """``a`` with its axes permuted (reversed when no axes are given), as ``np.transpose``.

    Exactly two ints on a tensor of more than two axes swap those two, as
    PyTorch's ``transpose(d0, d1)`` (NumPy would refuse them as an
    incomplete permutation). On a 2-d tensor ``transpose(0, 1)`` is refused
    as ambiguous (NumPy: identity; PyTorch: swap); ``transpose(1, 0)`` is
    the swap in both.

    Examples:
        >>> eo.zeros(2, 3, 4).transpose(1, 2).shape
        (2, 4, 3)
        >>> eo.zeros(2, 3, 4).transpose(2, 0, 1).shape
        (4, 2, 3)
    """
    a = _t(a)
    order = _transpose_order(axes, a.data.shape)
    inverse = tuple(np.argsort(order))
    return Tensor._from_op(a.data.transpose(order), (a,), _moves("transpose", lambda g: g.transpose(inverse)))


def _is_advanced(index):
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, (list, np.ndarray)) for i in items)


@primitive("getitem", kind="indexing")
def getitem(a: Tensor, index: Index) -> Tensor:
    key: Any = index  # what NumPy is indexed with: Tensors replaced by their arrays
    if isinstance(index, Tensor):
        key = index.data
    elif isinstance(index, tuple):
        key = tuple(i.data if isinstance(i, Tensor) else i for i in index)
    x = a.data
    out = x[key]

    def backward(g):
        full = np.zeros(x.shape, dtype=g.dtype)
        if _is_advanced(key):
            np.add.at(full, key, g)  # repeated indices accumulate
        else:
            full[key] = g
        return (full,)

    return Tensor._from_op(np.asarray(out), (a,), backward)


def _check_joinable(tensors, axis, op):
    """The axis, normalised, once the tensors are known to fit together:
    same rank, and the same shape except along ``axis`` (``concatenate``) or
    everywhere (``stack``, whose axis may also be one past the last)."""
    if not tensors:
        raise EveryOShapeError(f"{op}: needs at least one tensor, got an empty sequence")
    first = tensors[0].data.shape
    axis = normalize_axis(axis, first, op, extra=1 if op == "stack" else 0)
    for i, t in enumerate(tensors[1:], 1):
        shape = t.data.shape
        ok = (
            shape == first
            if op == "stack"
            else (len(shape) == len(first) and all(a == b for k, (a, b) in enumerate(zip(shape, first)) if k != axis))
        )
        if not ok:
            rule = "the same shape" if op == "stack" else f"the same shape except along axis {axis}"
            raise EveryOShapeError(
                f"{op}: tensor {i} has shape {shape} but tensor 0 has shape {first}; they need {rule}"
            )
    return axis


@primitive("concatenate", kind="shape", inputs=("*tensors",))
def concatenate(tensors: Sequence[TensorLike], axis: int = 0) -> Tensor:
    """Join a sequence of Tensors along an existing ``axis``; the gradient is split back."""
    parts = [_t(t) for t in tensors]
    axis = _check_joinable(parts, axis, "concatenate")
    sizes = [t.data.shape[axis] for t in parts]
    out = np.concatenate([t.data for t in parts], axis=axis)
    bounds = np.cumsum(sizes)[:-1]
    return Tensor._from_op(out, tuple(parts), lambda g: tuple(np.split(g, bounds, axis=axis)))


@primitive("stack", kind="shape", inputs=("*tensors",))
def stack(tensors: Sequence[TensorLike], axis: int = 0) -> Tensor:
    """Join a sequence of same-shaped Tensors along a new ``axis``."""
    parts = [_t(t) for t in tensors]
    axis = _check_joinable(parts, axis, "stack")
    out = np.stack([t.data for t in parts], axis=axis)
    n = len(parts)
    return Tensor._from_op(out, tuple(parts), lambda g: tuple(np.take(g, i, axis=axis) for i in range(n)))


@primitive("where", kind="elementwise", inputs=("condition", "a", "b"))
def where(condition: TensorLike, a: TensorLike, b: TensorLike) -> Tensor:
    """``a`` where ``condition`` is true, else ``b`` (broadcast together), as ``np.where``."""
    cond = condition.data if isinstance(condition, Tensor) else np.asarray(condition)
    cond = cond.astype(bool, copy=False)
    a, b = _operands(a, b)
    sa, sb = a.data.shape, b.data.shape

    def backward(g):
        return unbroadcast(np.where(cond, g, 0), sa), unbroadcast(np.where(cond, 0, g), sb)

    return Tensor._from_op(np.where(cond, a.data, b.data), (a, b), backward)


@primitive("astype", kind="cast")
def astype(a: TensorLike, dtype: DType) -> Tensor:
    """Differentiable cast: the gradient comes back in ``a``'s own dtype."""
    a = _t(a)
    dtype = as_dtype(dtype)
    if a.data.dtype == dtype:
        return a
    src = a.data.dtype

    @takes_rounded
    def backward(g):
        if isinstance(g, Rounded):  # float16 values already in float32
            return (g.f32 if src == np.float32 else g.f32.astype(src),)
        if is_low_precision(src) and g.dtype == np.float32:
            return (_rounded(g, src),)  # the 16-bit gradient, kept in float32 for the next op
        return (_convert(g, src),)

    return Tensor._from_op(_convert(a.data, dtype), (a,), backward)


@primitive("dropout", kind="random")
def dropout(a: TensorLike, p: float = 0.5, training: bool = True, rng: np.random.Generator | None = None) -> Tensor:
    """Inverted dropout: zero each element with probability ``p``, scale the rest by 1/(1-p).

    ``p=1`` gives ``x * 0`` in training (zeros, NaN where x is NaN or inf;
    gradient 0), as in PyTorch; with
    ``training=False`` the input is returned unchanged whatever ``p`` is.
    """
    a = _t(a)
    if not 0 <= p <= 1:
        raise ValueError(f"dropout: probability p must be in [0, 1], got {p}")
    if not training or p == 0:
        return a
    if p == 1:
        # x * 0 (PyTorch's rule: a NaN or inf input gives NaN, not a silent 0).
        with np.errstate(invalid="ignore"):  # inf * 0 is NaN on purpose
            zeros = a.data * np.zeros((), a.data.dtype)
        return Tensor._from_op(zeros, (a,), lambda g: (np.zeros_like(g),))
    rng = rng if rng is not None else default_generator()  # eo.manual_seed makes it reproducible
    x = a.data
    scale = np.asarray(1.0 / (1.0 - p), x.dtype)
    if type(x) is np.ndarray and x.ndim and x.dtype.kind == "f" and x.flags.c_contiguous:
        # The same draws, comparisons and products as below, into recycled buffers (everyo._buffers),
        # each C-contiguous as the fresh arrays are.
        draws = rng.random(out=_buffers.empty(x.shape, np.float64))
        keep = np.greater_equal(draws, p, out=_buffers.empty(x.shape, np.bool_))
        del draws
        shape, dtype = x.shape, x.dtype  # the closures keep these, not the input array itself

        def scaled() -> np.ndarray:
            return np.multiply(keep, scale, out=_buffers.empty(shape, dtype))

        def backward(g: np.ndarray) -> tuple[np.ndarray]:
            mask = scaled()
            if type(g) is np.ndarray and g.shape == shape and g.dtype == dtype and g.flags.c_contiguous:
                return (np.multiply(g, mask, out=mask),)
            return (g * mask,)

        return Tensor._from_op(np.multiply(x, scaled(), out=_buffers.empty(shape, dtype)), (a,), backward)
    keep = rng.random(x.shape) >= p
    # Backward keeps the boolean mask (a quarter of a float32 one) and rebuilds the scaled mask from it.
    return Tensor._from_op(a.data * (keep * scale), (a,), lambda g: (g * (keep * scale),))


# --- Tensor methods and operators -----------------------------------------------
# Attached with setattr: the Tensor class declares them for type checkers, and
# mypy refuses a plain assignment to a declared method.
def _reflect(fn: Callable[[TensorLike, TensorLike], Tensor]) -> Callable[[Tensor, TensorLike], Tensor]:
    def reflected(self: Tensor, other: TensorLike) -> Tensor:
        return fn(other, self)

    return reflected


def _transposed(self: Tensor) -> Tensor:
    return transpose(self)


for _name, _method in (
    ("__add__", add),
    ("__radd__", _reflect(add)),
    ("__sub__", sub),
    ("__rsub__", _reflect(sub)),
    ("__mul__", mul),
    ("__rmul__", _reflect(mul)),
    ("__truediv__", div),
    ("__rtruediv__", _reflect(div)),
    ("__neg__", neg),
    ("__pow__", pow),
    ("__rpow__", _reflect(pow)),
    ("__matmul__", matmul),
    ("__rmatmul__", _reflect(matmul)),
    ("__getitem__", getitem),
    ("softmax", softmax),
    ("log_softmax", log_softmax),
    ("T", property(_transposed)),
    ("matmul", matmul),
):
    setattr(Tensor, _name, _method)
for _name in (
    "sum",
    "mean",
    "max",
    "min",
    "var",
    "exp",
    "log",
    "sqrt",
    "abs",
    "clip",
    "tanh",
    "sigmoid",
    "relu",
    "reshape",
    "transpose",
    "flatten",
    "astype",
):
    setattr(Tensor, _name, globals()[_name])
