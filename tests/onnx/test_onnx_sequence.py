"""Sequence layers: RNN/LSTM/GRU as ONNX recurrent nodes, attention with its
masks, transformer stacks, embeddings and positional encoding; each exported
with dynamic batch and sequence axes, verified, and checked against ONNX
Runtime at the traced sizes and at other batch sizes (1, 7) and lengths."""

import numpy as np
import onnx
import pytest
from onnx_agreement import assert_traced_agrees

import everyo as eo

SEQ_AXES = {"input": {0: "batch", 1: "seq"}}
SIZES = [(1, 5), (7, 5), (7, 9), (1, 3)]


def sequence(width):
    def make(batch, length):
        return np.random.default_rng(batch * 100 + length).standard_normal((batch, length, width)).astype(np.float32)

    return make


class Recurrent(eo.Module):
    """The layer's whole output: sequence and final states."""

    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, x):
        return self.layer(x)


RECURRENT = [
    ("rnn_tanh", lambda: eo.RNN(4, 6, seed=0)),
    ("rnn_relu_bidirectional", lambda: eo.RNN(4, 6, nonlinearity="relu", bidirectional=True, seed=1)),
    ("lstm", lambda: eo.LSTM(4, 6, seed=2)),
    ("lstm_stacked_bidirectional", lambda: eo.LSTM(4, 6, num_layers=2, bidirectional=True, seed=3)),
    ("lstm_no_bias", lambda: eo.LSTM(4, 5, bias=False, seed=4)),
    ("gru", lambda: eo.GRU(4, 6, seed=5)),
    ("gru_stacked_bidirectional", lambda: eo.GRU(4, 6, num_layers=3, bidirectional=True, seed=6)),
    ("gru_no_bias", lambda: eo.GRU(4, 5, bias=False, seed=7)),
]


@pytest.mark.parametrize("factory", [c[1] for c in RECURRENT], ids=[c[0] for c in RECURRENT])
def test_recurrent_layer_exports_as_one_node_per_layer(factory, tmp_path):
    layer = factory()
    proto = assert_traced_agrees(
        Recurrent(layer), sequence(4), tmp_path / "rnn.onnx", sizes=SIZES, dynamic_axes=SEQ_AXES
    )
    op = type(layer).__name__
    nodes = [n for n in proto.graph.node if n.op_type in ("RNN", "LSTM", "GRU")]
    assert [n.op_type for n in nodes] == [op] * layer.num_layers  # one node per layer, both directions in it
    # The input projection is inside the recurrent node, not a MatMul beside it.
    assert "MatMul" not in [n.op_type for n in proto.graph.node]
    directions = [onnx.helper.get_attribute_value(a) for n in nodes for a in n.attribute if a.name == "direction"]
    assert directions == [b"bidirectional" if layer.bidirectional else b"forward"] * layer.num_layers


class WithStates(eo.Module):
    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, x, *state):
        if isinstance(self.layer, eo.LSTM):
            out, (h, c) = self.layer(x, state)
            return out, h, c
        out, h = self.layer(x, state[0])
        return out, h


@pytest.mark.parametrize("cls", [eo.RNN, eo.LSTM, eo.GRU])
def test_initial_states_are_graph_inputs(cls, tmp_path):
    layer = cls(3, 4, num_layers=2, bidirectional=True, seed=0)
    n_states = 2 if cls is eo.LSTM else 1

    def make(batch, length):
        rng = np.random.default_rng(batch + length)
        x = rng.standard_normal((batch, length, 3)).astype(np.float32)
        return (x,) + tuple(rng.standard_normal((4, batch, 4)).astype(np.float32) for _ in range(n_states))

    names = ["x"] + [f"state{k}" for k in range(n_states)]
    axes = {"x": {0: "batch", 1: "seq"}, **{f"state{k}": {1: "batch"} for k in range(n_states)}}
    model = WithStates(layer).eval()
    path = tmp_path / "states.onnx"
    eo.export_onnx(model, path, example_input=make(2, 5), input_names=names, dynamic_axes=axes, verify=True)
    for size in [(1, 5), (7, 8)]:
        inputs = make(*size)
        expected = model(*[eo.tensor(a) for a in inputs])
        for a, e in zip(eo.run_onnx(path, *inputs), expected):
            np.testing.assert_allclose(a, e.data, rtol=0, atol=1e-5)


class LSTMClassifier(eo.Module):
    """The sequence example's shape: embedding, LSTM, last step, linear head."""

    def __init__(self):
        super().__init__()
        self.embed = eo.Embedding(12, 8, seed=0)
        self.lstm = eo.LSTM(8, 16, num_layers=2, seed=1)
        self.head = eo.Linear(16, 5, seed=2)

    def forward(self, ids):
        out, _ = self.lstm(self.embed(ids))
        return self.head(out[:, -1])


def token_ids(vocab):
    def make(batch, length):
        return np.random.default_rng(batch * 10 + length).integers(0, vocab, (batch, length))

    return make


def test_lstm_classifier(tmp_path):
    assert_traced_agrees(LSTMClassifier(), token_ids(12), tmp_path / "cls.onnx", sizes=SIZES, dynamic_axes=SEQ_AXES)


class CausalLM(eo.Module):
    """A character-level transformer language model."""

    def __init__(self, vocab=13, width=16, norm_first=False):
        super().__init__()
        self.embed = eo.Embedding(vocab, width, seed=0)
        self.position = eo.PositionalEncoding(width, max_len=32, dropout=0.1)
        self.encoder = eo.TransformerEncoder(2, width, 4, dim_feedforward=24, norm_first=norm_first, seed=1)
        self.head = eo.Linear(width, vocab, seed=2)

    def forward(self, ids):
        return self.head(self.encoder(self.position(self.embed(ids)), is_causal=True))


@pytest.mark.parametrize("norm_first", [False, True])
def test_causal_transformer_language_model(norm_first, tmp_path):
    proto = assert_traced_agrees(
        CausalLM(norm_first=norm_first), token_ids(13), tmp_path / "lm.onnx", sizes=SIZES, dynamic_axes=SEQ_AXES
    )
    dims = proto.graph.output[0].type.tensor_type.shape.dim
    assert [d.dim_param or d.dim_value for d in dims] == ["batch", "seq", 13]
    # The positional table is stored once, whole, and sliced to the input's length in the graph.
    tables = [t for t in proto.graph.initializer if tuple(t.dims) == (32, 16)]
    assert len(tables) == 1


class PaddedEncoder(eo.Module):
    def __init__(self, causal):
        super().__init__()
        self.causal = causal
        self.encoder = eo.TransformerEncoder(1, 8, 2, dim_feedforward=16, seed=0)

    def forward(self, x, padding):
        return self.encoder(x, src_key_padding_mask=padding, is_causal=self.causal)


@pytest.mark.parametrize("causal", [False, True])
def test_key_padding_mask_input_with_a_fully_masked_row(causal, tmp_path):
    def make(batch, length):
        rng = np.random.default_rng(batch + length)
        pad = rng.random((batch, length)) < 0.3
        pad[0] = True  # every key of the first sequence is padding: its rows must be zeros' result, not NaN
        if batch > 1:
            pad[1] = False
        return rng.standard_normal((batch, length, 8)).astype(np.float32), pad

    axes = {"input0": {0: "batch", 1: "seq"}, "input1": {0: "batch", 1: "seq"}}
    assert_traced_agrees(PaddedEncoder(causal), make, tmp_path / "pad.onnx", sizes=SIZES, dynamic_axes=axes)


class CrossAttention(eo.Module):
    def __init__(self):
        super().__init__()
        self.mha = eo.MultiHeadAttention(8, 4, seed=0)

    def forward(self, query, memory):
        return self.mha(query, memory, memory)


def test_cross_attention_with_different_lengths(tmp_path):
    def make(batch, lq, lk):
        rng = np.random.default_rng(batch + lq + lk)
        return (
            rng.standard_normal((batch, lq, 8)).astype(np.float32),
            rng.standard_normal((batch, lk, 8)).astype(np.float32),
        )

    axes = {"input0": {0: "batch", 1: "tgt"}, "input1": {0: "batch", 1: "src"}}
    assert_traced_agrees(
        CrossAttention(), make, tmp_path / "cross.onnx", sizes=[(1, 3, 5), (7, 3, 5), (2, 6, 4)], dynamic_axes=axes
    )


class Seq2Seq(eo.Module):
    def __init__(self):
        super().__init__()
        self.encoder = eo.TransformerEncoder(2, 8, 2, dim_feedforward=16, seed=0)
        self.decoder = eo.TransformerDecoder(2, 8, 2, dim_feedforward=16, norm_first=True, seed=1)

    def forward(self, src, tgt):
        return self.decoder(tgt, self.encoder(src), tgt_is_causal=True)


@pytest.mark.parametrize("opset", [17, 23])
def test_encoder_decoder_stack(opset, tmp_path):
    import onnx

    if opset > onnx.defs.onnx_opset_version():
        pytest.skip(f"the installed onnx {onnx.__version__} knows opsets up to {onnx.defs.onnx_opset_version()}")

    def make(batch, ls, lt):
        rng = np.random.default_rng(batch + ls + lt)
        return (
            rng.standard_normal((batch, ls, 8)).astype(np.float32),
            rng.standard_normal((batch, lt, 8)).astype(np.float32),
        )

    axes = {"input0": {0: "batch", 1: "src"}, "input1": {0: "batch", 1: "tgt"}}
    proto = assert_traced_agrees(
        Seq2Seq(), make, tmp_path / "s2s.onnx", sizes=[(1, 5, 4), (7, 5, 4), (3, 2, 6)], dynamic_axes=axes, opset=opset
    )
    from everyo.onnx.attention import runtime_runs_attention

    # 2 encoder self-attentions, 2 decoder self- and 2 cross-attentions.
    expected = 6 if opset >= 23 and runtime_runs_attention(opset) else 0
    assert [n.op_type for n in proto.graph.node].count("Attention") == expected


@pytest.mark.parametrize("which", ["17", "newest"])
def test_sequence_models_at_opset_17_and_the_newest(which, newest_runtime_opset, tmp_path):
    opset = 17 if which == "17" else newest_runtime_opset
    for model, make in [(LSTMClassifier(), token_ids(12)), (CausalLM(), token_ids(13))]:
        proto = assert_traced_agrees(
            model, make, tmp_path / "m.onnx", sizes=[(1, 5), (7, 9)], dynamic_axes=SEQ_AXES, opset=opset
        )
        assert [o.version for o in proto.opset_import] == [opset]


def test_attention_op_at_opset_23_with_causal_and_padding_masks(tmp_path):
    from everyo.onnx.attention import runtime_runs_attention

    if not runtime_runs_attention(23):
        pytest.skip("the installed ONNX Runtime does not run Attention-23 (the MatMul/Softmax form is used)")

    def make(batch, length):
        rng = np.random.default_rng(batch + length)
        pad = rng.random((batch, length)) < 0.3
        pad[0] = True  # a sequence of padding only: its rows give zeros, as in core
        return rng.standard_normal((batch, length, 8)).astype(np.float32), pad

    axes = {"input0": {0: "batch", 1: "seq"}, "input1": {0: "batch", 1: "seq"}}
    proto = assert_traced_agrees(
        PaddedEncoder(causal=True), make, tmp_path / "attn.onnx", sizes=SIZES, dynamic_axes=axes, opset=23
    )
    ops = [n.op_type for n in proto.graph.node]
    assert ops.count("Attention") == 1 and "Softmax" not in ops and "Exp" not in ops
    # MatMuls left: the in-projection, the out-projection and the two feed-forward layers.
    assert ops.count("MatMul") == 4


class SelfAttention(eo.Module):
    def __init__(self, **kwargs):
        super().__init__()
        self.mha = eo.MultiHeadAttention(8, 2, dropout=0.3, seed=0)
        self.kwargs = kwargs

    def forward(self, x):
        return self.mha(x, need_weights=True, **self.kwargs)


@pytest.mark.parametrize("kwargs", [{}, {"is_causal": True}], ids=["plain", "causal"])
def test_attention_alone_returning_its_weights(kwargs, tmp_path):
    # Dropout on the weights is the identity in the exported (inference) graph.
    proto = assert_traced_agrees(
        SelfAttention(**kwargs), sequence(8), tmp_path / "mha.onnx", sizes=SIZES, dynamic_axes=SEQ_AXES
    )
    dims = proto.graph.output[1].type.tensor_type.shape.dim
    assert [d.dim_param or d.dim_value for d in dims] == ["batch", 2, "seq", "seq"]


def test_fixed_attention_mask_constant_at_fixed_length(tmp_path):
    mask = np.random.default_rng(0).random((5, 5)) < 0.4
    additive = np.where(np.random.default_rng(1).random((5, 5)) < 0.3, -np.inf, 0.5).astype(np.float32)
    additive[2] = -np.inf  # a fully masked row: zeros in core, and in the export
    for attn_mask in (mask, additive):
        model = SelfAttention(attn_mask=attn_mask)
        assert_traced_agrees(
            model, sequence(8), tmp_path / "mask.onnx", sizes=[(1, 5), (7, 5)], dynamic_axes={"input": {0: "batch"}}
        )


def test_positional_encoding_alone_and_embedding_with_padding_idx(tmp_path):
    assert_traced_agrees(
        eo.PositionalEncoding(8, max_len=12),
        sequence(8),
        tmp_path / "pe.onnx",
        sizes=[(1, 5), (7, 12), (2, 1)],
        dynamic_axes=SEQ_AXES,
    )
    assert_traced_agrees(
        eo.Embedding(7, 3, padding_idx=0, seed=0),
        token_ids(7),
        tmp_path / "emb.onnx",
        sizes=SIZES,
        dynamic_axes=SEQ_AXES,
    )


def test_recurrent_dropout_is_the_identity_in_the_export(tmp_path):
    layer = eo.LSTM(4, 5, num_layers=3, dropout=0.5, seed=0)
    assert_traced_agrees(Recurrent(layer), sequence(4), tmp_path / "drop.onnx", sizes=SIZES, dynamic_axes=SEQ_AXES)


def test_export_under_autocast_writes_float32(tmp_path):
    # The trace runs with the precision policy off: the graph is EveryO's float32 model.
    pytest.importorskip("everyo.amp")
    model = CausalLM().eval()
    ids = token_ids(13)(2, 5)
    path = tmp_path / "lm.onnx"
    with eo.autocast():
        eo.export_onnx(model, path, example_input=ids, dynamic_axes=SEQ_AXES, verify=True)
    proto = onnx.load(str(path))
    assert {t.data_type for t in proto.graph.initializer} <= {onnx.TensorProto.FLOAT, onnx.TensorProto.INT64}
    other = token_ids(13)(7, 6)
    np.testing.assert_allclose(eo.run_onnx(path, other), model(other).data, rtol=0, atol=1e-5)


class ScanOnComputedProjection(eo.Module):
    """Calls core's scans directly on a projection that is not a plain linear:
    the ONNX node then reads xp through an identity input weight."""

    def __init__(self, op):
        super().__init__()
        self.op = op
        gates = {"rnn": 1, "lstm": 4, "gru": 3}[op]
        rng = np.random.default_rng(0)
        self.w_ih = eo.Parameter(rng.uniform(-0.5, 0.5, (4, gates * 5)).astype(np.float32))
        self.w_hh = eo.Parameter(rng.uniform(-0.5, 0.5, (5, gates * 5)).astype(np.float32))
        self.b_hh = eo.Parameter(rng.uniform(-0.5, 0.5, gates * 5).astype(np.float32))

    def forward(self, x):
        from everyo import recurrent_ops

        xp = eo.tanh(eo.linear(x, self.w_ih)) * 2.0
        h0 = x[:, 0, :1] * 0.0 + eo.zeros(5)  # a computed (dynamic) initial state
        if self.op == "lstm":
            return recurrent_ops.lstm_scan(xp, h0, h0 + 0.5, self.w_hh, reverse=True)
        if self.op == "gru":
            return recurrent_ops.gru_scan(xp, h0, self.w_hh, self.b_hh)
        return recurrent_ops.rnn_scan(xp, h0, self.w_hh, "tanh")


@pytest.mark.parametrize("op", ["rnn", "lstm", "gru"])
def test_scan_on_a_computed_projection(op, tmp_path):
    proto = assert_traced_agrees(
        ScanOnComputedProjection(op), sequence(4), tmp_path / "scan.onnx", sizes=SIZES, dynamic_axes=SEQ_AXES
    )
    assert [n.op_type for n in proto.graph.node].count(op.upper()) == 1


@pytest.mark.parametrize("norm_first", [False, True])
def test_transformer_layers_alone(norm_first, tmp_path):
    encoder = eo.TransformerEncoderLayer(8, 2, dim_feedforward=16, norm_first=norm_first, seed=0)
    assert_traced_agrees(encoder, sequence(8), tmp_path / "enc.onnx", sizes=SIZES, dynamic_axes=SEQ_AXES)

    def pair(batch, lt, ls):
        rng = np.random.default_rng(batch + lt + ls)
        return (
            rng.standard_normal((batch, lt, 8)).astype(np.float32),
            rng.standard_normal((batch, ls, 8)).astype(np.float32),
        )

    decoder = eo.TransformerDecoderLayer(8, 2, dim_feedforward=16, norm_first=norm_first, seed=1)
    axes = {"input0": {0: "batch", 1: "tgt"}, "input1": {0: "batch", 1: "src"}}
    assert_traced_agrees(
        decoder, pair, tmp_path / "dec.onnx", sizes=[(1, 4, 5), (7, 4, 5), (2, 6, 3)], dynamic_axes=axes
    )
