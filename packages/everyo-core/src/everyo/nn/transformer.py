"""Transformer encoder/decoder layers and stacks (batch-first, PyTorch's semantics).

A layer is attention + feed-forward, each wrapped in a residual connection and
a LayerNorm. ``norm_first=False`` (post-norm, the original paper)::

    x = norm1(x + dropout(self_attn(x)))
    x = norm2(x + dropout(ff(x)))

``norm_first=True`` (pre-norm, steadier to train deep)::

    x = x + dropout(self_attn(norm1(x)))
    x = x + dropout(ff(norm2(x)))

with ``ff(x) = linear2(dropout(activation(linear1(x))))``. The decoder layer
adds cross-attention over ``memory`` between the two, with its own norm.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from everyo import functional as F
from everyo.activations import gelu
from everyo.nn import arguments as args
from everyo.nn._unread import release_unread
from everyo.nn.activation import Dropout
from everyo.nn.attention import MultiHeadAttention
from everyo.nn.linear import Linear
from everyo.nn.module import Module, Sequential
from everyo.nn.normalization import LayerNorm
from everyo.random import generator_for

if TYPE_CHECKING:
    from collections.abc import Callable

    import numpy as np

    from everyo._typing import DType, TensorLike
    from everyo.tensor import Tensor

__all__ = ["TransformerEncoderLayer", "TransformerDecoderLayer", "TransformerEncoder", "TransformerDecoder"]

_ACTIVATIONS = {"relu": F.relu, "gelu": gelu}


class _Block(Module):
    """What both layers share: hyper-parameters, seeds, the feed-forward part."""

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        dim_feedforward: int,
        dropout: float,
        activation: str | Callable[[Tensor], Tensor],
        layer_norm_eps: float,
        norm_first: bool,
        seed: int | np.random.Generator | None,
        dtype: DType,
    ) -> None:
        super().__init__()
        name = type(self).__name__
        if isinstance(activation, str) and activation not in _ACTIVATIONS:
            raise ValueError(
                f"{name} activation must be one of {sorted(_ACTIVATIONS)} or a callable, got {activation!r}"
            )
        for arg, value in (("d_model", d_model), ("num_heads", num_heads), ("dim_feedforward", dim_feedforward)):
            args.positive_int(name, arg, value)
        args.divides(name, "num_heads", num_heads, d_model=d_model)
        args.probability(name, "dropout", dropout)
        args.positive_float(name, "layer_norm_eps", layer_norm_eps)
        self.d_model, self.num_heads, self.norm_first = int(d_model), int(num_heads), bool(norm_first)
        self.activation = _ACTIVATIONS[activation] if isinstance(activation, str) else activation
        self._seeds = generator_for(seed)  # one stream, so every sub-layer differs
        self._hyper = dict(dropout=dropout, dtype=dtype)
        self.linear1 = Linear(d_model, dim_feedforward, seed=self._next_seed(), dtype=dtype)
        self.linear2 = Linear(dim_feedforward, d_model, seed=self._next_seed(), dtype=dtype)
        self.dropout = Dropout(dropout, seed=self._next_seed())
        self._eps = layer_norm_eps

    def _next_seed(self):
        return int(self._seeds.integers(2**31))

    def _attention(self):
        return MultiHeadAttention(
            self.d_model,
            self.num_heads,
            dropout=self._hyper["dropout"],
            seed=self._next_seed(),
            dtype=self._hyper["dtype"],
        )

    def _norm(self):
        return LayerNorm(self.d_model, eps=self._eps, dtype=self._hyper["dtype"])

    def _dropout(self):
        return Dropout(self._hyper["dropout"], seed=self._next_seed())

    def _feed_forward(self, x):
        return self.linear2(self.dropout(self.activation(self.linear1(x))))

    def _residual(self, x, sublayer, norm, dropout, stop=()):
        """One residual sub-block, pre- or post-norm. ``stop``: other inputs of
        ``sublayer`` (cross-attention's memory), where :func:`release_unread` stops."""
        if self.norm_first:
            h = norm(x)
            out = x + dropout(sublayer(h))
            # Under autocast h is read by nothing (its 16-bit copies are what the products save).
            release_unread(h, out, (x, *stop))
            return out
        return norm(x + dropout(sublayer(x)))


class TransformerEncoderLayer(_Block):
    """Self-attention then feed-forward (see the module docstring for the equations).

    Args:
        d_model: feature width of the input and output.
        num_heads: attention heads (must divide ``d_model``).
        dim_feedforward: hidden width of the feed-forward part (PyTorch's default 2048).
        dropout: dropout after attention, in the feed-forward part and on its
            output, and on the attention weights (train mode only).
        activation: ``'relu'``, ``'gelu'`` (exact, erf) or a callable on Tensors.
        layer_norm_eps: LayerNorm's epsilon.
        norm_first: pre-norm (True) or post-norm (False, default).
        seed: makes every initialisation and dropout mask reproducible.

    Call: ``layer(src, src_mask=None, src_key_padding_mask=None, is_causal=False)``;
    the masks are :class:`MultiHeadAttention`'s ``attn_mask`` and ``key_padding_mask``.

    Shape:
        src (batch, length, d_model) -> (batch, length, d_model).

    Examples:
        >>> layer = eo.TransformerEncoderLayer(16, 4, dim_feedforward=32, seed=0)
        >>> layer(eo.randn(2, 5, 16, seed=1)).shape
        (2, 5, 16)
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        dim_feedforward: int = 2048,
        dropout: float = 0.1,
        activation: str | Callable[[Tensor], Tensor] = "relu",
        layer_norm_eps: float = 1e-5,
        norm_first: bool = False,
        *,
        seed: int | np.random.Generator | None = None,
        dtype: DType = "float32",
    ) -> None:
        super().__init__(
            d_model, num_heads, dim_feedforward, dropout, activation, layer_norm_eps, norm_first, seed, dtype
        )
        self.self_attn = self._attention()
        self.norm1, self.norm2 = self._norm(), self._norm()
        self.dropout1, self.dropout2 = self._dropout(), self._dropout()

    def forward(
        self,
        src: TensorLike,
        src_mask: TensorLike | None = None,
        src_key_padding_mask: TensorLike | None = None,
        is_causal: bool = False,
    ) -> Tensor:
        def attend(x):
            return self.self_attn(x, key_padding_mask=src_key_padding_mask, attn_mask=src_mask, is_causal=is_causal)

        x = self._residual(src, attend, self.norm1, self.dropout1)
        out = self._residual(x, self._feed_forward, self.norm2, self.dropout2)
        release_unread(x, out, (src,))  # post-norm under autocast: norm1's float32 output is read by nothing
        return out


class TransformerDecoderLayer(_Block):
    """Self-attention, cross-attention over ``memory``, then feed-forward.

    Args as :class:`TransformerEncoderLayer`.

    Call: ``layer(tgt, memory, tgt_mask=None, memory_mask=None,
    tgt_key_padding_mask=None, memory_key_padding_mask=None, tgt_is_causal=False)``.
    ``tgt_is_causal=True`` stops each target position from attending to later ones.

    Shape:
        tgt (batch, tgt_len, d_model), memory (batch, src_len, d_model) ->
        (batch, tgt_len, d_model).

    Examples:
        >>> layer = eo.TransformerDecoderLayer(16, 4, dim_feedforward=32, seed=0)
        >>> layer(eo.randn(2, 5, 16, seed=1), eo.randn(2, 7, 16, seed=2), tgt_is_causal=True).shape
        (2, 5, 16)
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        dim_feedforward: int = 2048,
        dropout: float = 0.1,
        activation: str | Callable[[Tensor], Tensor] = "relu",
        layer_norm_eps: float = 1e-5,
        norm_first: bool = False,
        *,
        seed: int | np.random.Generator | None = None,
        dtype: DType = "float32",
    ) -> None:
        super().__init__(
            d_model, num_heads, dim_feedforward, dropout, activation, layer_norm_eps, norm_first, seed, dtype
        )
        self.self_attn, self.multihead_attn = self._attention(), self._attention()
        self.norm1, self.norm2, self.norm3 = self._norm(), self._norm(), self._norm()
        self.dropout1, self.dropout2, self.dropout3 = self._dropout(), self._dropout(), self._dropout()

    def forward(
        self,
        tgt: TensorLike,
        memory: TensorLike,
        tgt_mask: TensorLike | None = None,
        memory_mask: TensorLike | None = None,
        tgt_key_padding_mask: TensorLike | None = None,
        memory_key_padding_mask: TensorLike | None = None,
        tgt_is_causal: bool = False,
    ) -> Tensor:
        def self_attend(x):
            return self.self_attn(x, key_padding_mask=tgt_key_padding_mask, attn_mask=tgt_mask, is_causal=tgt_is_causal)

        def cross_attend(x):
            return self.multihead_attn(
                x, memory, memory, key_padding_mask=memory_key_padding_mask, attn_mask=memory_mask
            )

        x1 = self._residual(tgt, self_attend, self.norm1, self.dropout1)
        x2 = self._residual(x1, cross_attend, self.norm2, self.dropout2, stop=(memory,))
        release_unread(x1, x2, (tgt, memory))  # post-norm under autocast: read by nothing (see the encoder's)
        del x1
        out = self._residual(x2, self._feed_forward, self.norm3, self.dropout3)
        release_unread(x2, out, (memory,))
        return out


class _Stack(Module):
    _layer: type[TransformerEncoderLayer] | type[TransformerDecoderLayer]  # set by each subclass

    def __init__(
        self,
        num_layers: int,
        d_model: int,
        num_heads: int,
        dim_feedforward: int = 2048,
        dropout: float = 0.1,
        activation: str | Callable[[Tensor], Tensor] = "relu",
        layer_norm_eps: float = 1e-5,
        norm_first: bool = False,
        final_norm: bool | None = None,
        *,
        seed: int | np.random.Generator | None = None,
        dtype: DType = "float32",
    ) -> None:
        super().__init__()
        rng = generator_for(seed)
        self.num_layers = args.positive_int(type(self).__name__, "num_layers", num_layers)
        self.layers = Sequential(
            *[
                self._layer(
                    d_model,
                    num_heads,
                    dim_feedforward,
                    dropout,
                    activation,
                    layer_norm_eps,
                    norm_first,
                    seed=int(rng.integers(2**31)),
                    dtype=dtype,
                )
                for _ in range(self.num_layers)
            ]
        )
        # A pre-norm stack leaves its output un-normalised, so it gets a final norm by default.
        final_norm = norm_first if final_norm is None else final_norm
        self.norm = LayerNorm(d_model, eps=layer_norm_eps, dtype=dtype) if final_norm else None

    def _finish(self, x):
        return x if self.norm is None else self.norm(x)


class TransformerEncoder(_Stack):
    """``num_layers`` :class:`TransformerEncoderLayer` in sequence (each with its own
    initialisation), plus an optional final LayerNorm.

    Args: ``num_layers``, then :class:`TransformerEncoderLayer`'s arguments, and
    ``final_norm`` (default: True when ``norm_first``, else False).

    Call: ``encoder(src, mask=None, src_key_padding_mask=None, is_causal=False)``.

    Examples:
        >>> enc = eo.TransformerEncoder(2, 16, 4, dim_feedforward=32, seed=0)
        >>> enc(eo.randn(2, 5, 16, seed=1)).shape
        (2, 5, 16)
    """

    _layer = TransformerEncoderLayer

    def forward(
        self,
        src: TensorLike,
        mask: TensorLike | None = None,
        src_key_padding_mask: TensorLike | None = None,
        is_causal: bool = False,
    ) -> Tensor:
        x = src
        for layer in self.layers:
            y = layer(x, src_mask=mask, src_key_padding_mask=src_key_padding_mask, is_causal=is_causal)
            if x is not src:  # a layer's output the next one only cast and added (post-norm, autocast)
                release_unread(x, y)
            x = y
        del y
        return self._finish(x)


class TransformerDecoder(_Stack):
    """``num_layers`` :class:`TransformerDecoderLayer` in sequence, plus an optional final LayerNorm.

    Args as :class:`TransformerEncoder`.

    Call: ``decoder(tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
    memory_key_padding_mask=None, tgt_is_causal=False)``.

    Examples:
        >>> dec = eo.TransformerDecoder(2, 16, 4, dim_feedforward=32, seed=0)
        >>> dec(eo.randn(2, 5, 16, seed=1), eo.randn(2, 7, 16, seed=2), tgt_is_causal=True).shape
        (2, 5, 16)
    """

    _layer = TransformerDecoderLayer

    def forward(
        self,
        tgt: TensorLike,
        memory: TensorLike,
        tgt_mask: TensorLike | None = None,
        memory_mask: TensorLike | None = None,
        tgt_key_padding_mask: TensorLike | None = None,
        memory_key_padding_mask: TensorLike | None = None,
        tgt_is_causal: bool = False,
    ) -> Tensor:
        x = tgt
        for layer in self.layers:
            y = layer(
                x,
                memory,
                tgt_mask=tgt_mask,
                memory_mask=memory_mask,
                tgt_key_padding_mask=tgt_key_padding_mask,
                memory_key_padding_mask=memory_key_padding_mask,
                tgt_is_causal=tgt_is_causal,
            )
            if x is not tgt:
                release_unread(x, y, (memory,))
            x = y
        del y
        return self._finish(x)
