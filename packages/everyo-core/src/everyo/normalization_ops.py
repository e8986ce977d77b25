"""``normalize``: batch, layer and group normalisation as one op (the layers in
:mod:`everyo.nn.normalization` call it).

One node instead of the eight primitives ``(x - mean) / sqrt(var + eps) * w + b``
would make: its backward keeps only the input ``x`` (which the graph holds
anyway, as the previous op's output) and the per-group mean and
``1 / sqrt(var + eps)``, and recomputes ``x_hat`` from them, where the chain of
primitives kept about five arrays of ``x``'s size.

Precision. The statistics and the normalisation are always computed in float32
(or wider): a float16 or bfloat16 input is converted up exactly, its output is
the float32 result rounded *once* to the input's type, and its gradient is the
float32 gradient rounded once. Parameters and running statistics keep their
own type (float32 ones get float32 gradients), as Keras's ``mixed_float16``
policy does: under ``autocast`` a normalisation layer given float16
activations returns float16 activations, so everything downstream stays 16-bit
too. A float32 or float64 input gives a result of the wider of its type and
the parameters' (NumPy's promotion), computed exactly as the primitives would.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from everyo import _buffers, kernel_table
from everyo.axes import normalize_axes
from everyo.casting import convert
from everyo.dispatch import primitive
from everyo.half import _down, _rounded, _up, is_low_precision, takes_rounded
from everyo.tensor import Tensor

if TYPE_CHECKING:
    from collections.abc import Sequence

    from numpy.typing import ArrayLike

    from everyo._typing import TensorLike

__all__ = ["normalize"]

_F32 = np.dtype(np.float32)
# everyo-kernels' layer_norm_forward/backward: for these types, from this many elements
# (below it the NumPy path, and the kernels are never loaded for it; as in everyo.functional).
_COMPILED, _KERNEL_MIN_SIZE = kernel_table.FLOAT_DTYPES, kernel_table.MIN_SIZE


def _wide(value):
    """A value's array in the type normalisation computes in (16-bit -> float32)."""
    data = value.data if isinstance(value, Tensor) else np.asarray(value)
    return _up(data) if is_low_precision(data.dtype) else data


def _unbroadcast(grad, shape):
    if grad.shape == shape:
        return grad
    extra = grad.ndim - len(shape)
    axes = tuple(range(extra)) + tuple(i + extra for i, n in enumerate(shape) if n == 1 and grad.shape[i + extra] != 1)
    return grad.sum(axis=axes, keepdims=True).reshape(shape)


@primitive("normalize", kind="fused", inputs=("x", "weight", "bias"))
def normalize(
    x: TensorLike,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    axis: int | Sequence[int] = -1,
    eps: float = 1e-5,
    mean: ArrayLike | None = None,
    var: ArrayLike | None = None,
) -> Tensor:
    """``(x - mean) / sqrt(var + eps) * weight + bias`` as one differentiable op.

    Args:
        x: the input Tensor (any floating type).
        weight, bias: optional Tensors broadcastable to ``x`` (the learned
            scale and shift; both or neither).
        axis: the axis or axes the statistics are taken over.
        eps: added to the variance.
        mean, var: optional arrays (shaped like the statistics with the reduced
            axes kept, or broadcastable to that): use these statistics (a
            batch norm's running ones, in eval mode) as constants instead of
            ``x``'s own, which are then not differentiated through.

    Returns:
        A Tensor of ``x``'s shape: of ``x``'s type when that is float16 or
        bfloat16 (computed in float32, rounded once), otherwise of the wider
        of ``x``'s and the parameters' types.

    Examples:
        >>> from everyo.normalization_ops import normalize
        >>> y = normalize(eo.tensor([[1.0, 2.0, 3.0]]), axis=-1)
        >>> np.round(y.data, 3)
        array([[-1.225,  0.   ,  1.225]], dtype=float32)
    """
    if (weight is None) != (bias is None):
        raise ValueError("normalize: give both weight and bias, or neither")
    x = x if isinstance(x, Tensor) else Tensor(x)
    dt = x.data.dtype
    xw = _wide(x)
    wide = [xw.dtype] + [_wide(p).dtype for p in (weight, bias) if p is not None]
    comp = np.result_type(_F32, *wide)
    if xw.dtype != comp:
        xw = xw.astype(comp)
    axes = normalize_axes(axis, xw.shape, "normalize")
    batch_stats = mean is None
    rows = _rows_kernel(x, weight, bias, xw, axes) if batch_stats else None
    if rows is not None:
        return _normalize_rows(x, weight, bias, axes, eps, *rows)
    if batch_stats:
        mu = xw.mean(axis=axes, keepdims=True)
        y = np.subtract(xw, mu, out=_buffers.out_for(xw, mu, dtype=comp))  # centred; becomes the output in place below
        count = int(np.prod([xw.shape[i] for i in axes])) if axes else 1
        variance = np.multiply(y, y, out=_buffers.out_for(y, dtype=comp)).sum(axis=axes, keepdims=True) / count
    else:
        if var is None:
            raise ValueError("normalize: give both mean and var, or neither")
        mu, variance = np.asarray(_wide(mean), comp), np.asarray(_wide(var), comp)
        y = np.subtract(xw, mu, out=_buffers.out_for(xw, mu, dtype=comp))
    std = np.sqrt(variance + np.asarray(eps, comp))
    np.divide(y, std, out=y)
    if weight is not None:
        w, b = _wide(weight).astype(comp, copy=False), _wide(bias).astype(comp, copy=False)
        y *= w
        y += b
    low = is_low_precision(dt)
    out = _down(y, dt) if low else y
    del y
    # What backward keeps: x itself (alive anyway, as its producer's output) and
    # the statistics, one value per normalised group.
    rstd = np.asarray(1.0, comp) / std

    @takes_rounded
    def backward(g):
        gw = _up(g) if low else g
        if gw.dtype != comp:
            gw = gw.astype(comp)
        xs = _wide(x).astype(comp, copy=False)
        # Full-size results go into recycled buffers where the operands allow (_into): the
        # same operations in the same order as the fresh arrays, the same bits.
        xhat = np.subtract(xs, mu, out=_buffers.out_for(xs, mu, dtype=comp))
        xhat *= rstd
        gx = gweight = gbias = None
        scratch = None  # a full-size buffer of ours the input gradient may reuse
        if weight is not None:
            if bias.requires_grad:
                gbias = _unbroadcast(gw, bias.data.shape)
            if weight.requires_grad:
                scratch = np.multiply(gw, xhat, out=_buffers.out_for(gw, xhat, dtype=comp))
                gweight = _unbroadcast(scratch, weight.data.shape)
            w = _wide(weight).astype(comp, copy=False)
            gxhat = np.multiply(gw, w, out=_buffers.out_for(gw, w, dtype=comp))
        else:
            gxhat = gw
        if x.requires_grad:
            if batch_stats:
                # d/dx of (x - mean(x)) / sqrt(var(x) + eps), var with ddof 0,
                # as gx = (gxhat - mean(gxhat) - xhat * mean(gxhat * xhat)) * rstd.
                reuse = scratch is not None and gweight is not scratch
                prod = np.multiply(gxhat, xhat, out=scratch if reuse else _buffers.out_for(gxhat, xhat, dtype=comp))
                m2 = prod.mean(axis=axes, keepdims=True)
                del prod, scratch
                m1 = gxhat.mean(axis=axes, keepdims=True)
                gx = np.subtract(gxhat, m1, out=gxhat if gxhat is not gw else _buffers.out_for(gxhat, m1, dtype=comp))
                xhat *= m2
                gx -= xhat
                gx *= rstd
            else:
                gx = np.multiply(gxhat, rstd, out=_buffers.out_for(gxhat, rstd, dtype=comp))
            # (gx is ours, fresh or recycled: no copy when it already has x's type)
            gx = _rounded(gx, dt) if low else gx if gx.dtype == dt else convert(gx, dt)
        if weight is None:
            return (gx,)
        return gx, gweight, gbias

    parents: tuple[Tensor, ...] = (x,) if weight is None or bias is None else (x, weight, bias)
    return Tensor._from_op(out, parents, backward)


def _rows_kernel(x, weight, bias, xw, axes):
    """everyo-kernels' layer_norm_forward and layer_norm_backward where they apply to this call, else None:
    statistics over the trailing axes of a C-contiguous float32 (or float64)
    input of the computing type, the parameters (if any) of the trailing shape."""
    ndim = xw.ndim
    use = (
        xw is x.data
        and xw.dtype in _COMPILED
        and len(axes) >= 1
        and sorted(axes) == list(range(ndim - len(axes), ndim))
        and xw.size >= _KERNEL_MIN_SIZE
        and xw.flags.c_contiguous
        and all(
            p.data.shape == xw.shape[ndim - len(axes) :] and p.data.dtype == xw.dtype
            for p in (weight, bias)
            if p is not None
        )
    )
    forward = kernel_table.get("layer_norm_forward") if use else None
    backward = kernel_table.get("layer_norm_backward") if forward is not None else None
    return None if backward is None else (forward, backward)


def _flat(p, n, dtype):
    return np.ascontiguousarray(p.data.reshape(n)) if p is not None else np.ones(n, dtype)


def _normalize_rows(x, weight, bias, axes, eps, forward, step):
    """:func:`normalize` over trailing axes through everyo-kernels' layer_norm_forward
    and layer_norm_backward: the reference's arithmetic in its order, the same bits."""
    data = x.data
    dtype = data.dtype
    n = int(np.prod(data.shape[data.ndim - len(axes) :]))
    rows = data.size // n
    out = _buffers.empty(data.shape, dtype)
    mean, rstd = np.empty(rows, dtype), np.empty(rows, dtype)
    affine = weight is not None
    forward(
        data.reshape(rows, n),
        _flat(weight, n, dtype),
        _flat(bias, n, dtype),
        affine,
        dtype.type(eps),
        out.reshape(rows, n),
        mean,
        rstd,
    )

    def backward(g):
        # (The reference converts a gradient of another type to the computing type too.)
        g = np.ascontiguousarray(g, dtype)
        gx = _buffers.empty(data.shape, dtype)
        gw, gb = np.zeros(n, dtype), np.zeros(n, dtype)
        step(
            data.reshape(rows, n), g.reshape(rows, n), mean, rstd, _flat(weight, n, dtype), gx.reshape(rows, n), gw, gb
        )
        gx = gx if x.requires_grad else None
        if not affine:
            return (gx,)
        gweight = gw.reshape(weight.data.shape) if weight.requires_grad else None
        gbias = gb.reshape(bias.data.shape) if bias.requires_grad else None
        return gx, gweight, gbias

    parents: tuple[Tensor, ...] = (x,) if not affine else (x, weight, bias)
    return Tensor._from_op(out, parents, backward)
