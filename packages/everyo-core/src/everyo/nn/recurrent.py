"""Recurrent layers: RNN, LSTM, GRU (batch-first by default, stacked, optionally bidirectional).

Layout and naming follow PyTorch, with the weights stored Keras-style
(inputs x outputs, like :class:`Linear`) so that every product is ``x @ W``:

    weight_ih_l{k}[_reverse]   (in_features, gates * hidden_size)
    weight_hh_l{k}[_reverse]   (hidden_size, gates * hidden_size)
    bias_ih_l{k}[_reverse], bias_hh_l{k}[_reverse]   (gates * hidden_size,)

where ``in_features`` is ``input_size`` for layer 0 and ``num_directions *
hidden_size`` above it. Every parameter starts as U(-1/sqrt(H), 1/sqrt(H)),
PyTorch's default. The input projection of a layer runs for all time steps in
one ``linear``; the recurrence itself is one fused op per layer and direction
(:mod:`everyo.recurrent_ops`). Under ``eo.autocast()`` the input projection
runs in float16 like every ``linear``, while the recurrence (state updates
over many steps, where float16 error would compound) runs in the recurrent
weights' dtype, so outputs and states come back in float32.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from everyo import functional as F
from everyo.errors import EveryOShapeError
from everyo.nn.module import Module, as_input
from everyo.random import generator_for
from everyo.recurrent_ops import gru_scan, lstm_scan, rnn_scan
from everyo.tensor import Parameter, Tensor

if TYPE_CHECKING:
    from everyo._typing import DType, TensorLike

__all__ = ["RNN", "LSTM", "GRU"]


class _RecurrentBase(Module):
    _gates = 1

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        bias: bool = True,
        bidirectional: bool = False,
        dropout: float = 0.0,
        *,
        batch_first: bool = True,
        seed: int | np.random.Generator | None = None,
        dtype: DType = "float32",
    ) -> None:
        super().__init__()
        if not isinstance(batch_first, (bool, np.bool_)):
            raise TypeError(f"{type(self).__name__} batch_first must be True or False, got {batch_first!r}")
        self.batch_first = bool(batch_first)
        if hidden_size < 1 or num_layers < 1 or input_size < 1:
            raise ValueError(
                f"{type(self).__name__} needs input_size, hidden_size and num_layers >= 1, got "
                f"{input_size}, {hidden_size}, {num_layers}"
            )
        if not 0 <= dropout < 1:
            raise ValueError(f"{type(self).__name__} dropout must be in [0, 1), got {dropout}")
        self.input_size, self.hidden_size = int(input_size), int(hidden_size)
        self.num_layers, self.bias = int(num_layers), bool(bias)
        self.bidirectional, self.dropout = bool(bidirectional), float(dropout)
        self.num_directions = 2 if bidirectional else 1
        rng = generator_for(seed)
        dropout_stream = np.random.default_rng(rng.integers(2**63))
        if self.dropout and self.num_layers > 1:  # saved in state_dict only where it is drawn from
            self.register_generator("dropout_generator", dropout_stream)
        bound = 1.0 / math.sqrt(self.hidden_size)
        width = self._gates * self.hidden_size

        def init(*shape):
            return Parameter(rng.uniform(-bound, bound, size=shape).astype(dtype))

        for layer in range(self.num_layers):
            fan_in = self.input_size if layer == 0 else self.hidden_size * self.num_directions
            for suffix in self._suffixes(layer):
                setattr(self, "weight_ih" + suffix, init(fan_in, width))
                setattr(self, "weight_hh" + suffix, init(self.hidden_size, width))
                if self.bias:
                    setattr(self, "bias_ih" + suffix, init(width))
                    setattr(self, "bias_hh" + suffix, init(width))

    def _suffixes(self, layer):
        return [f"_l{layer}"] + ([f"_l{layer}_reverse"] if self.bidirectional else [])

    def _weights(self, suffix):
        get = self.__dict__.get
        return get("weight_ih" + suffix), get("weight_hh" + suffix), get("bias_ih" + suffix), get("bias_hh" + suffix)

    def _state(self, state, batch, dtype, what):
        """Validate an initial state (num_layers * num_directions, batch, hidden) or make zeros."""
        shape = (self.num_layers * self.num_directions, batch, self.hidden_size)
        if state is None:
            return Tensor(np.zeros(shape, dtype=dtype))
        state = as_input(self, state, ndim=3, what=what)
        if state.data.shape != shape:
            raise EveryOShapeError(
                f"{self!r} expected {what} of shape (num_layers * num_directions, batch, hidden_size) = "
                f"{shape}, got {state.data.shape}"
            )
        return state

    def _lengths(self, lengths, batch, steps):
        """Validate ``lengths=``: one integer per sequence, each in [0, time]."""
        if lengths is None:
            return None
        arr = np.asarray(lengths.data if isinstance(lengths, Tensor) else lengths)
        if arr.shape != (batch,) or arr.dtype.kind not in "iu":
            raise EveryOShapeError(
                f"{self!r} expected lengths of shape (batch,) = ({batch},) with integer dtype, got {arr.dtype} "
                f"of shape {arr.shape}"
            )
        if batch and (arr.min() < 0 or arr.max() > steps):
            raise ValueError(
                f"{self!r} lengths must lie in [0, {steps}] (the input's time axis), got min {arr.min()}, "
                f"max {arr.max()}"
            )
        return arr.astype(np.int64, copy=False)

    def _run(self, x, states, lengths=None):
        """Run every layer and direction. ``states`` is a list of initial-state
        Tensors (h, or h and c); returns the top layer's output and, per state,
        the final values stacked as (num_layers * num_directions, batch, hidden)."""
        x = as_input(self, x, ndim=3, last_dim=self.input_size)
        if not self.batch_first:  # (time, batch, features), PyTorch's default layout
            x = F.transpose(x, (1, 0, 2))
        if x.data.shape[1] == 0:
            raise EveryOShapeError(f"{self!r} received an empty sequence (shape {x.data.shape}); time must be >= 1")
        lengths = self._lengths(lengths, *x.data.shape[:2])
        states = [self._state(s, x.data.shape[0], x.data.dtype, name) for s, name in states]
        finals = [[] for _ in states]
        layer_input = x
        for layer in range(self.num_layers):
            outputs = []
            for direction, suffix in enumerate(self._suffixes(layer)):
                index = layer * self.num_directions + direction
                initial = [s[index] for s in states]
                out, *last = self._scan(layer_input, initial, self._weights(suffix), direction == 1, lengths)
                outputs.append(out)
                for store, value in zip(finals, last):
                    store.append(value)
            layer_input = outputs[0] if len(outputs) == 1 else F.concatenate(outputs, axis=-1)
            if self.dropout and self.training and layer < self.num_layers - 1:
                layer_input = F.dropout(layer_input, self.dropout, True, self.dropout_generator)
        if not self.batch_first:
            layer_input = F.transpose(layer_input, (1, 0, 2))
        return layer_input, [F.stack(f, axis=0) for f in finals]

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        if self.num_layers != 1:
            s += f", num_layers={self.num_layers}"
        if self.bidirectional:
            s += ", bidirectional=True"
        if not self.bias:
            s += ", bias=False"
        if self.dropout:
            s += f", dropout={self.dropout}"
        if not self.batch_first:
            s += ", batch_first=False"
        return s


def _project(x, w_ih, b_ih, b_hh):
    """``x @ W_ih + (b_ih + b_hh)`` for every time step in one BLAS call (RNN, LSTM:
    the two biases are only ever added, so they are summed first)."""
    if b_ih is None:
        return F.linear(x, w_ih)
    return F.linear(x, w_ih, b_ih + b_hh)


class RNN(_RecurrentBase):
    """Elman RNN over batch-first sequences.

    For each layer and time step::

        h_t = act(x_t @ W_ih + b_ih + h_{t-1} @ W_hh + b_hh)

    with ``act`` = tanh (default) or relu. A reverse direction
    (``bidirectional=True``) runs the same equation from the last step to the
    first; its outputs are concatenated after the forward direction's.

    Args:
        input_size: features per time step.
        hidden_size: size of the state.
        num_layers: stacked layers; layer k > 0 reads layer k-1's outputs.
        nonlinearity: ``'tanh'`` or ``'relu'``.
        bias: learn ``b_ih`` and ``b_hh``.
        bidirectional: add a reverse-time direction.
        dropout: dropout on the outputs of every layer but the last (train mode).
        batch_first: ``True`` (EveryO's default): input and output are (batch,
            time, features). ``False``: (time, batch, features), PyTorch's
            default layout (PyTorch's default is ``batch_first=False``; EveryO
            keeps ``True``, so pass it explicitly when porting). The states
            are (num_layers * num_directions, batch, hidden_size) either way.
            Keyword-only: PyTorch's positional order differs.
        seed: makes the initialisation (and the dropout masks) reproducible.

    Shape:
        input (batch, time, input_size); optional ``h0`` (num_layers * num_directions,
        batch, hidden_size), zeros when omitted. Returns ``(output, h_n)``: output
        (batch, time, num_directions * hidden_size) holds the top layer's state at
        every step; ``h_n`` has h0's shape and holds each layer and direction's
        final state (for the reverse direction: its state after reading step 0).

    Padded batches: ``lengths=`` (batch,) integers, e.g. from ``eo.pad_sequences``.
    Outputs past each sequence's length are zero, ``h_n`` holds each sequence's
    state after its own last step, and a reverse direction starts at each
    sequence's own end, so padding never reaches a state. The same holds for
    LSTM and GRU.

    Examples:
        >>> rnn = eo.RNN(8, 16, seed=0)
        >>> out, h_n = rnn(eo.randn(4, 10, 8, seed=1))
        >>> out.shape, h_n.shape
        ((4, 10, 16), (1, 4, 16))
        >>> out, h_n = rnn(eo.randn(4, 10, 8, seed=1), lengths=[10, 3, 7, 1])
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        nonlinearity: str = "tanh",
        bias: bool = True,
        bidirectional: bool = False,
        dropout: float = 0.0,
        *,
        batch_first: bool = True,
        seed: int | np.random.Generator | None = None,
        dtype: DType = "float32",
    ) -> None:
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"RNN nonlinearity must be 'tanh' or 'relu', got {nonlinearity!r}")
        super().__init__(
            input_size,
            hidden_size,
            num_layers,
            bias,
            bidirectional,
            dropout,
            batch_first=batch_first,
            seed=seed,
            dtype=dtype,
        )
        self.nonlinearity = nonlinearity

    def _scan(self, x, initial, weights, reverse, lengths):
        w_ih, w_hh, b_ih, b_hh = weights
        return rnn_scan(_project(x, w_ih, b_ih, b_hh), initial[0], w_hh, self.nonlinearity, reverse, lengths)

    def forward(
        self, x: TensorLike, h0: TensorLike | None = None, *, lengths: TensorLike | None = None
    ) -> tuple[Tensor, Tensor]:
        out, (h_n,) = self._run(x, [(h0, "h0")], lengths)
        return out, h_n


class LSTM(_RecurrentBase):
    """Long short-term memory over batch-first sequences.

    Gate order in the weights' columns: input, forget, cell, output
    (i, f, g, o), each ``hidden_size`` wide. For each layer and time step::

        i = sigmoid(x_t @ W_ii + h_{t-1} @ W_hi + b_i)
        f = sigmoid(x_t @ W_if + h_{t-1} @ W_hf + b_f)
        g = tanh   (x_t @ W_ig + h_{t-1} @ W_hg + b_g)
        o = sigmoid(x_t @ W_io + h_{t-1} @ W_ho + b_o)
        c_t = f * c_{t-1} + i * g
        h_t = o * tanh(c_t)

    where ``b = b_ih + b_hh``. Args as :class:`RNN` (no ``nonlinearity``).

    Shape:
        input (batch, time, input_size); optional ``state = (h0, c0)``, each
        (num_layers * num_directions, batch, hidden_size), zeros when omitted;
        optional ``lengths=`` (batch,) as :class:`RNN`.
        Returns ``(output, (h_n, c_n))``: output (batch, time, num_directions *
        hidden_size), ``h_n`` and ``c_n`` the final states of every layer and direction.

    Examples:
        >>> lstm = eo.LSTM(8, 16, num_layers=2, seed=0)
        >>> out, (h_n, c_n) = lstm(eo.randn(4, 10, 8, seed=1))
        >>> out.shape, h_n.shape, c_n.shape
        ((4, 10, 16), (2, 4, 16), (2, 4, 16))
    """

    _gates = 4

    def _scan(self, x, initial, weights, reverse, lengths):
        w_ih, w_hh, b_ih, b_hh = weights
        return lstm_scan(_project(x, w_ih, b_ih, b_hh), initial[0], initial[1], w_hh, reverse, lengths)

    def forward(
        self, x: TensorLike, state: tuple[TensorLike, TensorLike] | None = None, *, lengths: TensorLike | None = None
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        h0, c0 = (None, None) if state is None else state
        out, (h_n, c_n) = self._run(x, [(h0, "h0"), (c0, "c0")], lengths)
        return out, (h_n, c_n)


class GRU(_RecurrentBase):
    """Gated recurrent unit over batch-first sequences (PyTorch's variant).

    Gate order in the weights' columns: reset, update, new (r, z, n). For each
    layer and time step::

        r = sigmoid(x_t @ W_ir + b_ir + h_{t-1} @ W_hr + b_hr)
        z = sigmoid(x_t @ W_iz + b_iz + h_{t-1} @ W_hz + b_hz)
        n = tanh(x_t @ W_in + b_in + r * (h_{t-1} @ W_hn + b_hn))
        h_t = (1 - z) * n + z * h_{t-1}

    The reset gate is applied *after* the recurrent projection (it multiplies
    ``h_{t-1} @ W_hn + b_hn``), as in PyTorch and Keras' ``reset_after=True``;
    that is why ``b_hh`` is a separate parameter. Args as :class:`RNN` (no
    ``nonlinearity``).

    Shape:
        input (batch, time, input_size); optional ``h0`` (num_layers *
        num_directions, batch, hidden_size). Returns ``(output, h_n)`` as :class:`RNN`.

    Examples:
        >>> gru = eo.GRU(8, 16, bidirectional=True, seed=0)
        >>> out, h_n = gru(eo.randn(4, 10, 8, seed=1))
        >>> out.shape, h_n.shape
        ((4, 10, 32), (2, 4, 16))
    """

    _gates = 3

    def _scan(self, x, initial, weights, reverse, lengths):
        w_ih, w_hh, b_ih, b_hh = weights
        xp = F.linear(x, w_ih, b_ih)
        if b_hh is None:
            b_hh = Tensor(np.zeros(w_hh.data.shape[1], dtype=w_hh.data.dtype))
        return gru_scan(xp, initial[0], w_hh, b_hh, reverse, lengths)

    def forward(
        self, x: TensorLike, h0: TensorLike | None = None, *, lengths: TensorLike | None = None
    ) -> tuple[Tensor, Tensor]:
        out, (h_n,) = self._run(x, [(h0, "h0")], lengths)
        return out, h_n
