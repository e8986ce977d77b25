"""Rules for core's fused recurrences: ``rnn_scan``, ``lstm_scan``, ``gru_scan``
become one ONNX ``RNN``, ``LSTM`` or ``GRU`` node each (one per layer and direction).

The layers compute the input projection ``xp = x @ W_ih + b`` with core's
``linear`` and hand ``xp`` to the scan. When ``xp`` comes straight from such a
``linear`` with constant weights, the ONNX node takes ``x``, ``W_ih`` and the
bias itself (and the ``linear`` nodes are dropped as dead code when the scan
was their only reader). Otherwise the node reads ``xp`` through an identity
``W``: slower, but exact for any way of computing ``xp``.

The two directions of a bidirectional layer share one ONNX node
(``direction="bidirectional"``) when they read the same input and their
initial states allow it; otherwise each direction is its own node.

Layouts. EveryO stores ``W_ih`` (in, gates*H) and ``W_hh`` (H, gates*H) with
gate blocks in PyTorch's order; ONNX wants ``W`` (1, gates*H, in), ``R``
(1, gates*H, H) and ``B`` (1, 2*gates*H) = [Wb, Rb], gate blocks in its order:

    LSTM  EveryO i f g o  ->  ONNX i o f c   (blocks 0 3 1 2)
    GRU   EveryO r z n    ->  ONNX z r h     (blocks 1 0 2), linear_before_reset=1
    RNN   one block

``X`` is time-major in ONNX: a Transpose in, and ``Y`` (T, 1, B, H) is squeezed and
transposed back to EveryO's batch-first (B, T, H).
"""

import numpy as np

from everyo.onnx.registry import rule

_GATE_ORDER = {"rnn_scan": [0], "lstm_scan": [0, 3, 1, 2], "gru_scan": [1, 0, 2]}
_ONNX_OP = {"rnn_scan": "RNN", "lstm_scan": "LSTM", "gru_scan": "GRU"}


def _reorder(matrix, order, hidden):
    """Rows of ``matrix`` (gates*H, ...) regrouped block by block into ``order``."""
    return np.concatenate([matrix[k * hidden : (k + 1) * hidden] for k in order], axis=0)


def _projection(t, xp):
    """``(x, W_ih, bias)`` of the ``linear`` that made ``xp``, or None when xp is not
    such a product (then the scan reads xp itself)."""
    producer = xp.node
    if producer is None or producer.op != "linear" or xp.index != 0 or producer.attrs.get("transpose_weight"):
        return None
    x, w, b = producer.inputs
    if w.kind != "const" or (b is not None and b.kind != "const") or x.data.ndim != 3:
        return None
    return x, w.data, (None if b is None else b.data)


def _direction(t, node):
    """One scan's ONNX pieces: ``(x Value or None, x name, W, R, B, attrs)``
    with W/R/B of shape (1, ...) and attrs without ``direction``."""
    op = node.op
    xp, w_hh = node.inputs[0], node.inputs[-1 if op != "gru_scan" else 2]
    if w_hh.kind != "const":
        raise t.refuse(
            "its recurrent weight W_hh is computed inside the model; the ONNX recurrent nodes need it as a constant"
        )
    hidden = w_hh.shape[0]
    order = _GATE_ORDER[op]
    width = len(order) * hidden
    fused = _projection(t, xp)
    if fused is not None:
        x, w_ih, b_in = fused
        x_name = t.name(x, np.float32)
    else:
        x, x_name, w_ih, b_in = None, t.name(xp, np.float32, 0), np.eye(width, dtype=np.float32), None
    W = _reorder(np.asarray(w_ih, np.float32).T, order, hidden)[None]
    R = _reorder(np.asarray(w_hh.data, np.float32).T, order, hidden)[None]
    wb = np.zeros(width, np.float32) if b_in is None else _reorder(np.asarray(b_in, np.float32), order, hidden)
    rb = np.zeros(width, np.float32)
    attrs = dict(hidden_size=int(hidden))
    if op == "gru_scan":
        b_hh = node.inputs[3]
        if b_hh.kind != "const":
            raise t.refuse("its recurrent bias b_hh is computed inside the model; ONNX GRU needs it as a constant")
        rb = _reorder(np.asarray(b_hh.data, np.float32), order, hidden)
        attrs["linear_before_reset"] = 1  # PyTorch's GRU: the reset gate multiplies (h @ W_hn + b_hn)
    if op == "rnn_scan":
        attrs["activations"] = ["Relu" if node.attrs.get("nonlinearity") == "relu" else "Tanh"]
    return x, x_name, W, R, np.concatenate([wb, rb])[None], attrs


def _states(node):
    return node.inputs[1:3] if node.op == "lstm_scan" else node.inputs[1:2]


def _zero(value):
    return value.kind == "const" and not np.any(value.data)


def _reverse_partner(t, node, x, attrs):
    """The reverse scan of the same layer (same op and input, the next few
    recorded nodes) that can share one bidirectional ONNX node, or None."""
    if node.attrs.get("reverse") or x is None:
        return None
    for other in t.tracer.nodes[node.index + 1 : node.index + 4]:
        if other.op != node.op or not other.attrs.get("reverse"):
            continue
        fused = _projection(t, other.inputs[0])
        if (
            fused is None
            or fused[0] is not x
            or other.inputs[-1 if node.op != "gru_scan" else 2].shape[0] != attrs["hidden_size"]
            or other.attrs.get("nonlinearity") != node.attrs.get("nonlinearity")
        ):
            return None
        for mine, theirs in zip(_states(node), _states(other)):
            # Both zeros (omitted), or both real states already available here.
            if _zero(mine) != _zero(theirs) or (theirs.dynamic and id(theirs) not in t.g.names):
                return None
        return other
    return None


def _sequence_lens(t, node):
    """ONNX's ``sequence_lens`` (int32) for ``lengths=``, or "" without it.

    ``lengths`` reaches the trace as an attribute (a NumPy array), not an
    operand; it is exported only when it *is* one of the model's inputs (an
    int64 array passed straight through), so the file reads each batch's own
    lengths. A computed or constant ``lengths`` would be baked into the file
    and wrong for every other batch: refused."""
    lengths = node.attrs.get("lengths")
    if lengths is None:
        return ""
    for inp in t.tracer.inputs:
        if lengths is inp.array or (
            lengths.base is not None and lengths.base is inp.array and lengths.shape == inp.array.shape
        ):
            return t.g.cast(t.name(inp), np.int32)
    raise t.refuse(
        "it was called with lengths= that is not one of the model's inputs (a constant or computed "
        "array would be baked into the file); pass lengths as an int64 (batch,) model input, "
        "straight to the layer"
    )


def _zero_past_lengths(g, y, seq_lens):
    """``Y`` (T, directions, B, H) with every step at or past each sequence's
    length set to zero, as core's scans give. The ONNX spec leaves those steps
    to the runtime, and ONNX Runtime 1.23's RNN (not its LSTM or GRU) leaves
    garbage there, so the file says it explicitly."""
    steps = g.node("Gather", [g.node("Shape", [y]), g.scalar(0, np.int64, "axis0")], axis=0)
    t_index = g.node("Range", [g.scalar(0, np.int64, "start"), steps, g.scalar(1, np.int64, "one")])
    t_index = g.node("Reshape", [t_index, g.constant(np.array([-1, 1, 1, 1], np.int64), "steps_shape")])
    lengths = g.node(
        "Reshape", [g.cast(seq_lens, np.int64), g.constant(np.array([1, 1, -1, 1], np.int64), "lengths_shape")]
    )
    live = g.node("Less", [t_index, lengths])
    return g.node("Where", [live, y, g.constant(np.zeros((), np.float32), "zero")])


def scan(t, node):
    if all(id(v) in t.g.names for v in node.outputs):
        return  # emitted with its forward direction as one bidirectional node
    g = t.g
    x, x_name, W, R, B, attrs = _direction(t, node)
    other = _reverse_partner(t, node, x, attrs)
    nodes = [node] if other is None else [node, other]
    if other is not None:
        _, _, W2, R2, B2, _ = _direction(t, other)
        W, R, B = (np.concatenate(pair) for pair in ((W, W2), (R, R2), (B, B2)))
        attrs["direction"] = "bidirectional"
        if "activations" in attrs:
            attrs["activations"] = attrs["activations"] * 2  # one list per direction
    else:
        attrs["direction"] = "reverse" if node.attrs.get("reverse") else "forward"
    w_hh = node.inputs[-1 if node.op != "gru_scan" else 2]
    base = w_hh.name.replace("weight_hh", "") if w_hh.name else node.op
    inputs = [
        g.transpose(x_name, (1, 0, 2)),
        g.constant(W, f"{base}W"),
        g.constant(R, f"{base}R"),
        g.constant(B, f"{base}B"),
        _sequence_lens(t, node),
    ]
    for k, value in enumerate(_states(node)):
        if _zero(value):
            inputs.append("")  # ONNX's default initial state is zeros
            continue
        parts = [g.unsqueeze(t.name(n.inputs[1 + k], np.float32, 1 + k), [0]) for n in nodes]
        inputs.append(parts[0] if len(parts) == 1 else g.node("Concat", parts, axis=0))
    while inputs[-1] == "":
        inputs.pop()
    y, *states = g.node(_ONNX_OP[node.op], inputs, outputs=len(node.outputs), **attrs)
    if len(inputs) > 4 and inputs[4]:
        y = _zero_past_lengths(g, y, inputs[4])
        # A sequence of length 0 ends in its initial state (ONNX Runtime 1.23's RNN leaves garbage there too).
        started = g.node(
            "Greater",
            [
                g.node(
                    "Reshape",
                    [g.cast(inputs[4], np.int64), g.constant(np.array([1, -1, 1], np.int64), "state_lengths_shape")],
                ),
                g.scalar(0, np.int64, "zero_steps"),
            ],
        )
        states = [
            g.node(
                "Where",
                [
                    started,
                    state,
                    inputs[5 + k]
                    if len(inputs) > 5 + k and inputs[5 + k]
                    else g.constant(np.zeros((), np.float32), "zero"),
                ],
            )
            for k, state in enumerate(states)
        ]
    for d, n in enumerate(nodes):
        # Y is (T, directions, B, H), each state (directions, B, H).
        pick = (
            (lambda v, axis: g.squeeze(v, [axis]))
            if len(nodes) == 1
            else (lambda v, axis, d=d: g.node("Gather", [v, g.scalar(d, np.int64, "direction")], axis=axis))
        )
        t.set(n.outputs[0], g.transpose(pick(y, 1), (1, 0, 2)))
        for value, state in zip(n.outputs[1:], states):
            t.set(value, pick(state, 0))


rule(*_GATE_ORDER)(scan)
