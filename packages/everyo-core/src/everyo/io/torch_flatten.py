"""Which Linear layers read a flattened channels-last feature map, and in what order.

PyTorch flattens an (N, C, H, W) map in (C, H, W) order; EveryO's map is
(N, H, W, C) and flattens in (H, W, C) order. A Linear fed by such a flatten
needs its PyTorch weight rows (columns, once transposed) permuted, and only the
shape ``(H, W, C)`` says how. This module finds that shape by running the
model once on an example input under a tracer (the op table's hook, as the
ONNX exporter uses) and following each Linear's input back to the op that
made it:

- through ops that keep the layout (element-wise, dropout, casts,
  normalisation, pooling, up-sampling) to a ``reshape``/``flatten`` that merges
  trailing axes ``(d1, ..., dk, C)`` into one; then on, to the op that made the
  merged map. A convolution or a pooling window means a channels-last map
  (permute); an embedding or a recurrent layer a (batch, time, features)
  sequence, as in PyTorch (keep); a model input or any other op (a transpose,
  a matmul, an indexing ...) leaves the order unknown, and the load is refused unless the permutation is
  the identity (``C == 1`` or ``d1 * ... * dk == 1``);
- any other op first (a matmul, a recurrent scan, a global pooling
  reduction): the Linear reads features whose order is PyTorch's.
"""

from __future__ import annotations

import math
from typing import Any

from everyo import dispatch

# Ops whose output has its (first) input's layout: walking back through them keeps the meaning of the last axis.
_KEEPS_LAYOUT = frozenset({"elementwise", "random", "cast", "pool", "resize"})
_KEEPS_LAYOUT_OPS = frozenset({"normalize", "clone", "masked_fill", "where"})
# Ops that make channels-last spatial maps (PyTorch's counterparts make channels-first ones).
_SPATIAL_OPS = frozenset({"conv1d", "conv2d", "conv_transpose2d", "max_pool2d", "avg_pool2d", "upsample2d"})
_MERGES = frozenset({"reshape", "flatten"})
# Ops whose output layout is PyTorch's (batch, time, features): a flatten of it keeps PyTorch's order.
_SEQUENCE_OPS = frozenset({"embedding", "rnn_scan", "lstm_scan", "gru_scan"})

UNKNOWN = "unknown"


class _Recorder:
    """A tracer that remembers which op made each tensor, and the inputs of every ``linear``."""

    def __init__(self) -> None:
        self.maker: dict[int, tuple[str, tuple[Any, ...]]] = {}
        self.linear_inputs: dict[int, Any] = {}  # id(weight) -> x
        self.keep: list[Any] = []  # holds every tensor seen, so no id() is reused during the trace

    def record(self, name, inputs, outputs, attrs):
        self.keep.append((inputs, outputs))
        for out in outputs:
            if all(out is not t for t in inputs):  # an identity hands back its input: keep the input's maker
                self.maker[id(out)] = (name, inputs)
        if name == "linear" and len(inputs) > 1 and inputs[1] is not None:
            self.linear_inputs.setdefault(id(inputs[1]), inputs[0])

    def on_python_value(self, tensor, kind):
        return None


def _kind(name: str) -> str:
    op = dispatch.OPS.get(name)
    return op.kind if op is not None else ""


def _back_through_layout(recorder: _Recorder, x: Any) -> tuple[str | None, Any, bool]:
    """Walk back from ``x`` through layout-keeping ops: the op name reached (None for an input), its
    inputs, and whether a spatial op (a pooling window, an up-sampling) was passed on the way."""
    spatial = False
    while True:
        made = recorder.maker.get(id(x))
        if made is None:
            return None, x, spatial
        name, inputs = made
        if _kind(name) in _KEEPS_LAYOUT or name in _KEEPS_LAYOUT_OPS:
            same = [t for t in inputs if t is not None and getattr(t, "shape", None) == getattr(x, "shape", ())]
            if name in _SPATIAL_OPS or same:
                spatial = spatial or name in _SPATIAL_OPS
                x = inputs[0] if name in _SPATIAL_OPS else same[0]
                continue
        return name, inputs, spatial


def flattened_shape(recorder: _Recorder, x: Any) -> tuple[int, ...] | None | str:
    """For a Linear's input ``x``: the channels-last shape ``(d1, ..., dk, C)`` flattened into its
    last axis (rows to permute), None (PyTorch's order already), or :data:`UNKNOWN`."""
    name, inputs, _ = _back_through_layout(recorder, x)
    if name not in _MERGES:
        return None
    source = inputs[0]
    before, after = tuple(source.shape), tuple(x.shape)
    if before[-1:] == after[-1:]:  # (N, T, D) -> (N*T, D): the feature axis is untouched
        return None
    k = len(after) - 1
    if before[:k] != after[:k] or math.prod(before[k:]) != after[-1]:
        return UNKNOWN  # not a merge of trailing axes: no order to recover
    merged = before[k:]
    if merged[-1] == 1 or math.prod(merged[:-1]) == 1:
        return None  # the permutation is the identity
    origin, _, spatial = _back_through_layout(recorder, source)
    if spatial or origin in _SPATIAL_OPS:
        return merged
    return None if origin in _SEQUENCE_OPS else UNKNOWN


def trace_linear_inputs(module: Any, example_input: Any) -> dict[int, tuple[int, ...] | None | str]:
    """Run ``module`` on ``example_input`` (eval mode, no gradients, training flags restored) and
    classify every Linear's input: id(weight) -> :func:`flattened_shape`."""
    from everyo.autograd import no_grad

    recorder = _Recorder()
    modes = [(m, m.training) for m in module.modules()]
    module.eval()
    token = dispatch.set_tracer(recorder)
    try:
        with no_grad():
            module(example_input)
    finally:
        dispatch.reset_tracer(token)
        for m, mode in modes:
            object.__setattr__(m, "training", mode)
    return {key: flattened_shape(recorder, x) for key, x in recorder.linear_inputs.items()}


def permute_rows(weight: Any, merged: tuple[int, ...]) -> Any:
    """PyTorch's Linear weight (out, C*d1*...*dk) with columns in (C, d1, ..., dk) order ->
    columns in EveryO's (d1, ..., dk, C) order (still (out, in))."""
    *spatial, channels = merged
    out = weight.shape[0]
    grid = weight.reshape(out, channels, *spatial)
    order = (0, *range(2, 2 + len(spatial)), 1)
    return grid.transpose(order).reshape(out, -1)
