"""Rules for core's fused recurrences: ``rnn_scan``, ``lstm_scan``, ``gru_scan``
become one ONNX ``RNN``, ``LSTM`` or ``GRU`` node each (one per layer and direction).

The layers compute the input projection ``xp = x @ W_ih + b`` with core's
``linear`` and hand ``xp`` to the scan. When ``xp`` comes straight from such a
``linear`` with constant weights, the ONNX node takes ``x``, ``W_ih`` and the
bias itself (and the ``linear`` nodes are dropped as dead code when the scan
was their only reader). Otherwise the node reads ``xp`` through an identity
``W``: slower, but exact for any way of computing ``xp``.

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

RULES = {}

_GATE_ORDER = {"rnn_scan": [0], "lstm_scan": [0, 3, 1, 2], "gru_scan": [1, 0, 2]}
_ONNX_OP = {"rnn_scan": "RNN", "lstm_scan": "LSTM", "gru_scan": "GRU"}


def _reorder(matrix, order, hidden):
    """Rows of ``matrix`` (gates*H, ...) regrouped block by block into ``order``."""
    return np.concatenate([matrix[k * hidden:(k + 1) * hidden] for k in order], axis=0)


def _projection(t, xp):
    """``(x, W_ih, bias)`` of the ``linear`` that made ``xp``, or None when xp is not
    such a product (then the scan reads xp itself)."""
    producer = xp.node
    if producer is None or producer.op != "linear" or xp.index != 0:
        return None
    x, w, b = producer.inputs
    if w.kind != "const" or (b is not None and b.kind != "const") or x.data.ndim != 3:
        return None
    return x, w.data, (None if b is None else b.data)


def _initial(t, value, position):
    """The ONNX (1, B, H) initial state, or "" (ONNX's zeros) for an all-zero constant."""
    if value.kind == "const" and not np.any(value.data):
        return ""
    return t.g.unsqueeze(t.name(value, np.float32, position), [0])


def scan(t, node):
    op = node.op
    xp, w_hh = node.inputs[0], node.inputs[-1 if op != "gru_scan" else 2]
    if w_hh.kind != "const":
        raise t.refuse("its recurrent weight W_hh is computed inside the model; the ONNX recurrent nodes need it "
                       "as a constant")
    hidden = w_hh.shape[0]
    order = _GATE_ORDER[op]
    width = len(order) * hidden
    fused = _projection(t, xp)
    if fused is not None:
        x, w_ih, b_in = fused
        x_name = t.name(x, np.float32)
    else:
        x_name, w_ih, b_in = t.name(xp, np.float32, 0), np.eye(width, dtype=np.float32), None
    g = t.g
    W = _reorder(np.asarray(w_ih, np.float32).T, order, hidden)[None]
    R = _reorder(np.asarray(w_hh.data, np.float32).T, order, hidden)[None]
    wb = np.zeros(width, np.float32) if b_in is None else _reorder(np.asarray(b_in, np.float32), order, hidden)
    rb = np.zeros(width, np.float32)
    attrs = dict(hidden_size=int(hidden), direction="reverse" if node.attrs.get("reverse") else "forward")
    if op == "gru_scan":
        b_hh = node.inputs[3]
        if b_hh.kind != "const":
            raise t.refuse("its recurrent bias b_hh is computed inside the model; ONNX GRU needs it as a constant")
        rb = _reorder(np.asarray(b_hh.data, np.float32), order, hidden)
        attrs["linear_before_reset"] = 1  # PyTorch's GRU: the reset gate multiplies (h @ W_hn + b_hn)
    if op == "rnn_scan":
        attrs["activations"] = ["Relu" if node.attrs.get("nonlinearity") == "relu" else "Tanh"]
    base = w_hh.name.replace("weight_hh", "") if w_hh.name else op
    inputs = [g.transpose(x_name, (1, 0, 2)), g.constant(W, f"{base}W"), g.constant(R, f"{base}R"),
              g.constant(np.concatenate([wb, rb])[None], f"{base}B"), "", _initial(t, node.inputs[1], 1)]
    if op == "lstm_scan":
        inputs.append(_initial(t, node.inputs[2], 2))
    while inputs and inputs[-1] == "":
        inputs.pop()
    outs = g.node(_ONNX_OP[op], inputs, outputs=len(node.outputs) + 0, **attrs)
    y, *states = outs
    t.set(node.outputs[0], g.transpose(g.squeeze(y, [1]), (1, 0, 2)))
    for value, state in zip(node.outputs[1:], states):
        t.set(value, g.squeeze(state, [0]))


for _name in _GATE_ORDER:
    RULES[_name] = scan
