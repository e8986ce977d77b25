"""Embedding, PositionalEncoding and the transformer blocks: gradients against
central differences, the layer equations against a composition of the
already-tested parts, the causal mask, and the errors."""

import math

import numpy as np
import pytest

import everyo as eo
from everyo.testing import check_gradients, check_module_gradients

D, HEADS, FF = 4, 2, 6


def data(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


# --- Embedding -------------------------------------------------------------------------
def test_embedding_lookup_and_gradient():
    emb = eo.Embedding(6, 3, seed=0)
    ids = np.array([[1, 5, 1], [0, 3, 5]])
    np.testing.assert_array_equal(emb(ids).data, emb.weight.data[ids])
    check_module_gradients(emb, ids)


def test_embedding_padding_row_starts_at_zero_and_learns_nothing():
    emb = eo.Embedding(6, 3, padding_idx=-1, seed=0)
    assert emb.padding_idx == 5
    np.testing.assert_array_equal(emb.weight.data[5], 0)
    plain = eo.Embedding(6, 3, seed=0)
    ids = np.array([[1, 5, 1], [0, 3, 5]])
    w = data(2, 3, 3)
    (emb(ids) * eo.tensor(w)).sum().backward()
    (plain(ids) * eo.tensor(w)).sum().backward()
    np.testing.assert_array_equal(emb.weight.grad[5], 0)
    np.testing.assert_allclose(emb.weight.grad[:5], plain.weight.grad[:5])
    assert np.abs(plain.weight.grad[5]).max() > 0


def test_embedding_errors():
    emb = eo.Embedding(4, 2, seed=0)
    with pytest.raises(IndexError, match="index 4 is out of range"):
        emb(np.array([0, 4]))
    with pytest.raises(eo.EveryOError, match="index -2 is out of range"):
        emb(np.array([[-2]]))
    with pytest.raises(eo.EveryODTypeError):
        emb(np.array([1.0]))
    with pytest.raises(ValueError, match="padding_idx"):
        eo.Embedding(4, 2, padding_idx=4)


# --- PositionalEncoding ------------------------------------------------------------------
def test_positional_encoding_values_and_errors():
    pe = eo.PositionalEncoding(5, max_len=9, dropout=0.0)
    y = pe(eo.zeros(2, 7, 5, dtype="float64")).data
    for p in (0, 3, 6):
        for i in range(5):
            angle = p / 10000 ** (2 * (i // 2) / 5)
            assert y[1, p, i] == pytest.approx(math.sin(angle) if i % 2 == 0 else math.cos(angle), abs=1e-12)
    assert pe.state_dict() == {}
    with pytest.raises(eo.EveryOShapeError, match="longer than max_len=9"):
        pe(eo.zeros(1, 10, 5))
    check_module_gradients(pe, data(2, 3, 5))


def test_positional_encoding_dropout_only_in_training():
    pe = eo.PositionalEncoding(4, max_len=10, dropout=0.5, seed=0)
    x = eo.ones(2, 6, 4)
    assert (pe(x).data == 0).any()
    pe.eval()
    assert not (pe(x).data == 0).any()


# --- layer equations, against the parts --------------------------------------------------
def _ff(layer, x):
    return layer.linear2(eo.relu(layer.linear1(x)))


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_layer_is_the_documented_composition(norm_first):
    layer = eo.TransformerEncoderLayer(D, HEADS, FF, dropout=0.0, norm_first=norm_first, seed=0).to("float64")
    x = eo.tensor(data(2, 5, D))
    if norm_first:
        h = x + layer.self_attn(layer.norm1(x), is_causal=True)
        ref = h + _ff(layer, layer.norm2(h))
    else:
        h = layer.norm1(x + layer.self_attn(x, is_causal=True))
        ref = layer.norm2(h + _ff(layer, h))
    np.testing.assert_allclose(layer(x, is_causal=True).data, ref.data, rtol=1e-12, atol=1e-12)


def test_decoder_layer_is_the_documented_composition():
    layer = eo.TransformerDecoderLayer(D, HEADS, FF, dropout=0.0, seed=1).to("float64")
    x, mem = eo.tensor(data(2, 3, D)), eo.tensor(data(2, 5, D, seed=1))
    pad = np.array([[False] * 4 + [True], [False] * 5])
    h = layer.norm1(x + layer.self_attn(x, is_causal=True))
    h = layer.norm2(h + layer.multihead_attn(h, mem, mem, key_padding_mask=pad))
    ref = layer.norm3(h + _ff(layer, h))
    out = layer(x, mem, tgt_is_causal=True, memory_key_padding_mask=pad)
    np.testing.assert_allclose(out.data, ref.data, rtol=1e-12, atol=1e-12)


# --- gradients ------------------------------------------------------------------------------
@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_layer_gradients(norm_first):
    layer = eo.TransformerEncoderLayer(D, HEADS, FF, dropout=0.0, norm_first=norm_first, seed=2)
    pad = np.array([[False, False, True], [False, False, False]])
    layer.to("float64")
    check_gradients(
        lambda x: layer(x, src_key_padding_mask=pad),
        [data(2, 3, D)],
        layer.parameters(),
        name="TransformerEncoderLayer",
    )


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_layer_gradients(norm_first):
    layer = eo.TransformerDecoderLayer(D, HEADS, FF, dropout=0.0, norm_first=norm_first, seed=3)
    layer.to("float64")
    check_gradients(
        lambda t, m: layer(t, m, tgt_is_causal=True),
        [data(2, 2, D), data(2, 3, D, seed=1)],
        layer.parameters(),
        name="TransformerDecoderLayer",
    )


def test_encoder_and_decoder_stack_gradients():
    enc = eo.TransformerEncoder(2, D, HEADS, FF, dropout=0.0, norm_first=True, seed=4)
    dec = eo.TransformerDecoder(2, D, HEADS, FF, dropout=0.0, seed=5)
    assert enc.norm is not None and dec.norm is None
    enc.to("float64")
    dec.to("float64")

    def seq2seq(src, tgt):
        return dec(tgt, enc(src), tgt_is_causal=True)

    check_gradients(
        seq2seq, [data(1, 3, D), data(1, 2, D, seed=1)], enc.parameters() + dec.parameters(), name="encoder-decoder"
    )


# --- the causal mask through whole stacks -----------------------------------------------------
def test_causal_stacks_hide_the_future_bit_for_bit():
    enc = eo.TransformerEncoder(2, 8, 2, 16, dropout=0.0, seed=6)
    dec = eo.TransformerDecoder(2, 8, 2, 16, dropout=0.0, seed=7)
    x = data(2, 6, 8).astype("float32")
    mem = data(2, 4, 8, seed=1).astype("float32")
    later = x.copy()
    later[:, 3:] = data(2, 3, 8, seed=2)
    for model in (lambda s: enc(s, is_causal=True), lambda s: dec(s, mem, tgt_is_causal=True)):
        a, b = model(x).data, model(later).data
        np.testing.assert_array_equal(a[:, :3], b[:, :3])
        assert not np.allclose(a[:, 3:], b[:, 3:])


# --- stacks: structure ------------------------------------------------------------------------
def test_stack_layers_have_their_own_initialisation_and_seed_reproduces_them():
    a = eo.TransformerEncoder(2, 8, 2, 16, seed=8)
    b = eo.TransformerEncoder(2, 8, 2, 16, seed=8)
    sa = a.state_dict()
    assert "layers.1.self_attn.in_proj_weight" in sa and "layers.0.linear1.weight" in sa
    assert not np.array_equal(sa["layers.0.linear1.weight"], sa["layers.1.linear1.weight"])
    assert all(np.array_equal(v, b.state_dict()[k]) for k, v in sa.items())


def test_dropout_in_layers_only_in_training():
    layer = eo.TransformerEncoderLayer(8, 2, 16, dropout=0.3, seed=9)
    x = data(2, 5, 8).astype("float32")
    assert not np.array_equal(layer(x).data, layer(x).data)
    layer.eval()
    np.testing.assert_array_equal(layer(x).data, layer(x).data)


def test_activation_must_be_known():
    with pytest.raises(ValueError, match="activation"):
        eo.TransformerEncoderLayer(8, 2, activation="swish")


def test_sequence_models_round_trip_through_a_checkpoint(tmp_path):
    def build(seed):
        return eo.Sequential(eo.TransformerEncoder(1, 8, 2, 16, dropout=0.0, seed=seed))

    lstm, model = eo.LSTM(8, 4, num_layers=2, bidirectional=True, seed=1), build(0)
    eo.save({"lstm": lstm.state_dict(), "model": model.state_dict()}, tmp_path / "seq.npz")
    state = eo.load(tmp_path / "seq.npz")
    lstm2, model2 = eo.LSTM(8, 4, num_layers=2, bidirectional=True, seed=2), build(3)
    lstm2.load_state_dict(state["lstm"])
    model2.load_state_dict(state["model"])
    x = data(2, 5, 8).astype("float32")
    np.testing.assert_array_equal(lstm(x)[0].data, lstm2(x)[0].data)
    np.testing.assert_array_equal(model(x).data, model2(x).data)
