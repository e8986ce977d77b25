"""``scaled_dot_product_attention``: PyTorch's functional attention, a composite
of EveryO's primitives (matmul, softmax with a blocked mask, dropout), so its
gradients and ONNX export follow from theirs."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from everyo.dispatch import get_tracer
from everyo.errors import EveryODTypeError, EveryOShapeError
from everyo.functional import _t, add, dropout, matmul, mul, softmax, transpose, where
from everyo.random import generator_for
from everyo.tensor import Tensor

if TYPE_CHECKING:
    from everyo._typing import TensorLike

__all__ = ["scaled_dot_product_attention"]


def scaled_dot_product_attention(
    query: TensorLike,
    key: TensorLike,
    value: TensorLike,
    attn_mask: TensorLike | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    *,
    seed: int | np.random.Generator | None = None,
) -> Tensor:
    """``softmax(query @ key^T * scale + mask) @ value``, as PyTorch's
    ``torch.nn.functional.scaled_dot_product_attention``.

    Args:
        query: (..., L, E).
        key: (..., S, E); its leading axes broadcast against query's.
        value: (..., S, Ev).
        attn_mask: broadcastable to (..., L, S). **Boolean: True where a
            query may attend** (PyTorch's convention here; EveryO's
            :class:`~everyo.nn.MultiHeadAttention` and PyTorch's
            ``nn.MultiheadAttention`` take True as *blocked*). Floating: added
            to the scores (``-inf`` blocks).
        dropout_p: dropout on the attention weights. Applied whenever it is
            positive, as PyTorch's function does (it has no training flag):
            pass ``dropout_p=p if model.training else 0.0``.
        is_causal: query i attends to keys 0..i (top-left aligned); not
            together with ``attn_mask``, as PyTorch.
        scale: defaults to ``1 / sqrt(E)``.
        seed: an int or ``numpy.random.Generator`` for the dropout mask;
            without it the mask comes from the global generator (``eo.manual_seed``).

    Returns:
        (..., L, Ev). A query whose keys are all blocked gets zero weights and
        a zero output (PyTorch gives NaN there). A NaN or inf in a key or
        value that a boolean mask blocks for every query does not leak into
        the output or the gradients (in PyTorch it does).

    Examples:
        >>> q = k = v = eo.randn(2, 4, 5, 8, seed=0)
        >>> eo.scaled_dot_product_attention(q, k, v, is_causal=True).shape
        (2, 4, 5, 8)
    """
    q, k, v = _t(query), _t(key), _t(value)
    for name, t in (("query", q), ("key", k), ("value", v)):
        if t.data.ndim < 2:
            raise EveryOShapeError(
                f"scaled_dot_product_attention: {name} needs shape (..., length, features), got {t.data.shape}"
            )
    (L, E), (S, Ek), Sv = q.data.shape[-2:], k.data.shape[-2:], v.data.shape[-2]
    if Ek != E or Sv != S:
        raise EveryOShapeError(
            f"scaled_dot_product_attention: query (..., L, E) = {q.data.shape}, key (..., S, E) = {k.data.shape} "
            f"and value (..., S, Ev) = {v.data.shape} disagree"
        )
    if is_causal and attn_mask is not None:
        raise ValueError("scaled_dot_product_attention: pass attn_mask or is_causal=True, not both (as PyTorch)")
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"scaled_dot_product_attention: dropout_p must be in [0, 1), got {dropout_p}")
    # E == 0: the scores are all zero whatever the scale (uniform weights, as PyTorch).
    scale = 1.0 / math.sqrt(max(E, 1)) if scale is None else float(scale)
    order = tuple(range(k.data.ndim - 2)) + (k.data.ndim - 1, k.data.ndim - 2)
    lead = np.broadcast_shapes(q.data.shape[:-2], k.data.shape[:-2])
    blocked, added = None, None
    if is_causal:
        blocked = np.triu(np.ones((L, S), dtype=bool), k=1)
    elif attn_mask is not None:
        mask = attn_mask.data if isinstance(attn_mask, Tensor) else np.asarray(attn_mask)
        try:
            np.broadcast_shapes(mask.shape, lead + (L, S))
        except ValueError:
            raise EveryOShapeError(
                f"scaled_dot_product_attention: attn_mask of shape {mask.shape} does not broadcast to the "
                f"scores' shape {lead + (L, S)}"
            ) from None
        if mask.dtype == np.bool_:
            blocked = ~mask
        elif mask.dtype.kind == "f":
            added = attn_mask
        else:
            raise EveryODTypeError(
                f"scaled_dot_product_attention: attn_mask must be boolean (True = attend) or floating (added), "
                f"got {mask.dtype}"
            )
    scores = mul(matmul(q, transpose(hide_blocked_keys(k, blocked), order)), scale)
    if added is not None:
        scores = add(scores, added)
    weights = softmax(scores, axis=-1, blocked=blocked)
    v = hide_blocked_keys(v, blocked)
    if dropout_p > 0:
        weights = dropout(weights, dropout_p, True, generator_for(seed))
    return matmul(weights, v)


def hide_blocked_keys(t: Tensor, blocked: np.ndarray | None) -> Tensor:
    """``t`` (..., S, D) with the key rows that every query has blocked set to 0.

    A blocked key has weight exactly 0, but ``0 * nan`` is NaN: without this a
    NaN or inf in a padded key or value would leak into the output and the
    gradients (PyTorch's attention lets it leak). ``blocked`` broadcasts to
    (..., L, S), True = blocked. Not while an exporter traces: the mask may be a
    graph input there, and the exported graph (as ONNX's Attention) lets it leak.
    """
    if blocked is None or get_tracer() is not None:
        return t
    b = np.asarray(blocked)
    col = np.asarray((b if b.ndim >= 2 else b[None]).all(axis=-2))[..., None]
    return where(col, 0.0, t) if col.any() else t
