"""Multi-head scaled dot-product attention (batch-first, channels last)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from everyo import functional as F
from everyo.attention_ops import hide_blocked_keys
from everyo.errors import EveryODTypeError, EveryOShapeError
from everyo.nn._unread import release_unread
from everyo.nn.linear import Linear
from everyo.nn.module import Module, as_input
from everyo.random import generator_for
from everyo.sequence_ops import split
from everyo.tensor import Parameter, Tensor

if TYPE_CHECKING:
    from typing import Literal, overload

    from everyo._typing import Array, DType, TensorLike

__all__ = ["MultiHeadAttention", "causal_mask"]


def causal_mask(query_length: int, key_length: int | None = None) -> Array:
    """Boolean (query_length, key_length) mask, True where query i would see key j > i.

    True means *blocked* (PyTorch's convention for boolean masks). The mask is
    aligned at the top-left: query i may see keys 0..i.
    """
    key_length = query_length if key_length is None else key_length
    return np.triu(np.ones((query_length, key_length), dtype=bool), k=1)


class MultiHeadAttention(Module):
    """Multi-head attention: ``softmax(Q K^T / sqrt(d) + mask) V`` per head.

    With ``d = embed_dim // num_heads``, for each head ``j``::

        Q_j = query @ W_q[:, j] + b_q[j]     (and K_j, V_j from key and value)
        head_j = softmax(Q_j @ K_j^T / sqrt(d), over keys, ignoring blocked keys) @ V_j
        output = concat(head_1 .. head_h) @ W_o + b_o

    Args:
        embed_dim: width of query, key, value and output.
        num_heads: number of heads; must divide ``embed_dim``.
        dropout: dropout on the attention weights (train mode only).
        bias: learn the projection biases.
        seed: makes the initialisation and the dropout masks reproducible.

    Parameters (PyTorch's names, Keras layout): ``in_proj_weight``
    (embed_dim, 3 * embed_dim) holds W_q, W_k, W_v side by side,
    ``in_proj_bias`` (3 * embed_dim,), ``out_proj`` a :class:`Linear`.

    Call: ``mha(query, key=None, value=None, key_padding_mask=None,
    attn_mask=None, is_causal=False, need_weights=False)``. ``key`` defaults to
    ``query`` and ``value`` to ``key`` (self-attention).

    Masks follow PyTorch: a boolean mask is True where attention is *blocked*;
    a floating mask is *added* to the scores (``-inf`` blocks).
    ``key_padding_mask`` is (batch, key_len) (True marks padding keys);
    ``attn_mask`` is (query_len, key_len), (batch, query_len, key_len) or
    (batch, num_heads, query_len, key_len); ``is_causal=True`` adds
    :func:`causal_mask`. A query whose keys are all blocked gets all-zero
    weights and a zero context (the output is then ``b_o``), never NaN. A NaN
    or inf in a key or value that a boolean mask blocks for every query (e.g.
    padding) does not reach the output or the input gradients (PyTorch's
    lets it leak; an exported graph does too).

    Shape:
        query (batch, query_len, embed_dim), key and value (batch, key_len,
        embed_dim) -> output (batch, query_len, embed_dim); with
        ``need_weights=True`` returns ``(output, weights)``, weights (batch,
        num_heads, query_len, key_len) before dropout.

    Examples:
        >>> mha = eo.MultiHeadAttention(16, 4, seed=0)
        >>> x = eo.randn(2, 5, 16, seed=1)
        >>> mha(x, is_causal=True).shape
        (2, 5, 16)
    """

    generator: np.random.Generator  # registered in __init__ when dropout > 0

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        *,
        seed: int | np.random.Generator | None = None,
        dtype: DType = "float32",
    ) -> None:
        super().__init__()
        if embed_dim % num_heads:
            raise ValueError(f"MultiHeadAttention: embed_dim {embed_dim} is not divisible by num_heads {num_heads}")
        if not 0 <= dropout < 1:
            raise ValueError(f"MultiHeadAttention dropout must be in [0, 1), got {dropout}")
        self.embed_dim, self.num_heads = int(embed_dim), int(num_heads)
        self.head_dim = self.embed_dim // self.num_heads
        self.dropout = float(dropout)
        rng = generator_for(seed)
        # Xavier-uniform over the (E, 3E) block and zero biases, as PyTorch does.
        bound = math.sqrt(6.0 / (embed_dim + 3 * embed_dim))
        self.in_proj_weight = Parameter(rng.uniform(-bound, bound, (embed_dim, 3 * embed_dim)).astype(dtype))
        self.in_proj_bias = Parameter(np.zeros(3 * embed_dim, dtype=dtype)) if bias else None
        self.out_proj = Linear(embed_dim, embed_dim, bias=bias, seed=int(rng.integers(2**31)), dtype=dtype)
        if self.out_proj.bias is not None:  # bias=True
            self.out_proj.bias.data[...] = 0
        dropout_stream = np.random.default_rng(rng.integers(2**63))
        if self.dropout:  # saved in state_dict only where it is drawn from
            self.register_generator("generator", dropout_stream)

    # --- projections --------------------------------------------------------
    def _project(self, query, key, value):
        """Q, K and V, each (batch, heads, length, head_dim)."""
        w, b, e = self.in_proj_weight, self.in_proj_bias, self.embed_dim

        def part(lo, hi):
            return w[:, lo:hi], (None if b is None else b[lo:hi])

        if query is key and key is value:  # self-attention: one product for Q, K and V
            return self._heads(F.linear(query, w, b), 3)
        (q,) = self._heads(F.linear(query, *part(0, e)), 1)
        if key is value:
            k, v = self._heads(F.linear(key, *part(e, 3 * e)), 2)
        else:
            (k,) = self._heads(F.linear(key, *part(e, 2 * e)), 1)
            (v,) = self._heads(F.linear(value, *part(2 * e, 3 * e)), 1)
        return q, k, v

    def _heads(self, t, parts):
        """``parts`` projections side by side in ``t`` (batch, length, parts * embed_dim)
        as (batch, heads, length, head_dim) each. Split after the reshape to heads
        (views all): the backward then gathers the heads' gradients into ``t``'s
        layout in one concatenation, where splitting first made each reshape's
        backward copy its gradient before the concatenation copied it again."""
        batch, length, _ = t.data.shape
        heads = F.reshape(t, (batch, length, parts * self.num_heads, self.head_dim))
        pieces = [heads] if parts == 1 else split(heads, parts, axis=2)
        return [F.transpose(p, (0, 2, 1, 3)) for p in pieces]

    # --- masks ----------------------------------------------------------------
    def _mask(self, mask, shape, what, ranks):
        """A mask as (blocked bool, additive float), each None or broadcastable to ``shape``
        = (batch, heads, query_len, key_len)."""
        m = mask.data if isinstance(mask, Tensor) else np.asarray(mask)
        if m.ndim not in ranks:
            raise EveryOShapeError(
                f"{self!r}: {what} must have rank {' or '.join(map(str, ranks))}, got shape {m.shape}"
            )
        batch, heads, lq, lk = shape
        if what == "key_padding_mask":
            expected, m4 = (batch, lk), m[:, None, None, :]
        elif m.ndim == 2:
            expected, m4 = (lq, lk), m[None, None]
        elif m.ndim == 3:
            expected, m4 = (batch, lq, lk), m[:, None]
        else:
            expected, m4 = (batch, heads, lq, lk), m
        if m.shape != expected:
            raise EveryOShapeError(f"{self!r}: {what} has shape {m.shape}, expected {expected} for these inputs")
        if m.dtype == np.bool_:
            return m4, None
        if np.issubdtype(m.dtype, np.floating):
            return None, m4
        raise EveryODTypeError(f"{self!r}: {what} must be boolean (True = blocked) or floating (added), got {m.dtype}")

    # --- forward ----------------------------------------------------------------
    def forward(
        self,
        query: TensorLike,
        key: TensorLike | None = None,
        value: TensorLike | None = None,
        key_padding_mask: TensorLike | None = None,
        attn_mask: TensorLike | None = None,
        is_causal: bool = False,
        need_weights: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor]:
        key = query if key is None else key
        value = key if value is None else value
        same_kv, self_attn = key is value, query is key and key is value
        query = as_input(self, query, ndim=3, last_dim=self.embed_dim, what="query")
        key = query if self_attn else as_input(self, key, ndim=3, last_dim=self.embed_dim, what="key")
        value = key if same_kv else as_input(self, value, ndim=3, last_dim=self.embed_dim, what="value")
        (batch, lq, _), (kb, lk, _) = query.data.shape, key.data.shape
        if kb != batch or value.data.shape[:2] != (batch, lk):
            raise EveryOShapeError(
                f"{self!r}: query {query.data.shape}, key {key.data.shape} and value {value.data.shape} must share "
                f"the batch size, and key and value the length"
            )
        q, k, v = self._project(query, key, value)
        shape = (batch, self.num_heads, lq, lk)
        blocked, added = None, []
        for mask, what, ranks in ((key_padding_mask, "key_padding_mask", (2,)), (attn_mask, "attn_mask", (2, 3, 4))):
            if mask is None:
                continue
            block, add = self._mask(mask, shape, what, ranks)
            if add is not None:
                added.append(Tensor(add.astype(q.data.dtype, copy=False)))
            if block is not None:
                blocked = block if blocked is None else blocked | block
        if is_causal:
            causal = causal_mask(lq, lk)
            blocked = causal if blocked is None else blocked | causal
        k, v = hide_blocked_keys(k, blocked), hide_blocked_keys(v, blocked)  # no NaN from padded keys
        scores = F.matmul(q * (1.0 / math.sqrt(self.head_dim)), F.transpose(k, (0, 1, 3, 2)))
        for add in added:
            scores = scores + add
        weights = F.softmax(scores, axis=-1, blocked=blocked)
        attended = F.dropout(weights, self.dropout, self.training, self.generator) if self.dropout else weights
        context = F.matmul(attended, v)  # (batch, heads, lq, head_dim)
        if attended is not weights:  # under autocast read by nothing: the product saved its 16-bit copy
            release_unread(attended, context, (query, key, value))
        del attended
        merged = F.reshape(F.transpose(context, (0, 2, 1, 3)), (batch, lq, self.embed_dim))
        out = self.out_proj(merged)
        return (out, weights) if need_weights else out

    if TYPE_CHECKING:
        # Calling the layer: the output alone, or (output, weights) with need_weights=True.
        @overload
        def __call__(
            self,
            query: TensorLike,
            key: TensorLike | None = None,
            value: TensorLike | None = None,
            key_padding_mask: TensorLike | None = None,
            attn_mask: TensorLike | None = None,
            is_causal: bool = False,
            need_weights: Literal[False] = False,
        ) -> Tensor: ...
        @overload
        def __call__(
            self,
            query: TensorLike,
            key: TensorLike | None = None,
            value: TensorLike | None = None,
            key_padding_mask: TensorLike | None = None,
            attn_mask: TensorLike | None = None,
            is_causal: bool = False,
            *,
            need_weights: Literal[True],
        ) -> tuple[Tensor, Tensor]: ...
        @overload
        def __call__(
            self,
            query: TensorLike,
            key: TensorLike | None = None,
            value: TensorLike | None = None,
            key_padding_mask: TensorLike | None = None,
            attn_mask: TensorLike | None = None,
            is_causal: bool = False,
            need_weights: bool = False,
        ) -> Tensor | tuple[Tensor, Tensor]: ...
        def __call__(self, *args: Any, **kwargs: Any) -> Any: ...

    def extra_repr(self) -> str:
        return f"{self.embed_dim}, num_heads={self.num_heads}" + (f", dropout={self.dropout}" if self.dropout else "")
