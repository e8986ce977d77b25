"""MultiHeadAttention against a direct NumPy computation (with and without
masks), gradients against central differences, the causal mask against the
future, and fully masked rows."""

import numpy as np
import pytest

import everyo as eo
from everyo.testing import check_gradients, check_module_gradients

E, HEADS = 8, 2


def numpy_attention(mha, q_in, k_in, v_in, blocked=None, additive=None):
    """softmax(Q K^T / sqrt(d) + mask) V per head, written out directly."""
    sd = mha.state_dict()
    w, b = sd["in_proj_weight"], sd["in_proj_bias"]
    q, k, v = (x @ w[:, i * E : (i + 1) * E] + b[i * E : (i + 1) * E] for i, x in enumerate((q_in, k_in, v_in)))
    d = E // HEADS
    batch, lq, lk = q.shape[0], q.shape[1], k.shape[1]
    out = np.zeros((batch, lq, E))
    weights = np.zeros((batch, HEADS, lq, lk))
    for n in range(batch):
        for h in range(HEADS):
            cols = slice(h * d, (h + 1) * d)
            s = q[n, :, cols] @ k[n, :, cols].T / np.sqrt(d)
            if additive is not None:
                s = s + additive
            allowed = np.ones_like(s, dtype=bool) if blocked is None else ~blocked[n]
            allowed &= np.isfinite(s)
            for i in range(lq):
                row = np.where(allowed[i], np.exp(s[i] - s[i][allowed[i]].max()) if allowed[i].any() else 0, 0)
                weights[n, h, i] = row / row.sum() if row.sum() > 0 else 0
            out[n, :, cols] = weights[n, h] @ v[n, :, cols]
    return out @ sd["out_proj.weight"] + sd["out_proj.bias"], weights


def make(seed=0, **kw):
    mha = eo.MultiHeadAttention(E, HEADS, seed=seed, **kw).to("float64")
    rng = np.random.default_rng(seed + 100)
    for p in mha.parameters():  # non-zero biases, so the reference is exercised fully
        p.data = p.data + 0.1 * rng.standard_normal(p.data.shape)
    return mha


def data(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


def test_self_attention_matches_numpy():
    mha = make()
    x = data(2, 5, E)
    out, w = mha(eo.tensor(x), need_weights=True)
    ref_out, ref_w = numpy_attention(mha, x, x, x)
    np.testing.assert_allclose(out.data, ref_out, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(w.data, ref_w, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(w.data.sum(-1), 1)


def test_cross_attention_with_different_lengths_matches_numpy():
    mha = make(seed=1)
    q, k, v = data(2, 3, E), data(2, 6, E, seed=1), data(2, 6, E, seed=2)
    out, w = mha(eo.tensor(q), eo.tensor(k), eo.tensor(v), need_weights=True)
    assert out.shape == (2, 3, E) and w.shape == (2, HEADS, 3, 6)
    ref_out, ref_w = numpy_attention(mha, q, k, v)
    np.testing.assert_allclose(out.data, ref_out, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(w.data, ref_w, rtol=1e-10, atol=1e-12)


def test_key_padding_and_attention_masks_match_numpy():
    mha = make(seed=2)
    q, kv = data(2, 4, E), data(2, 6, E, seed=1)
    padding = np.zeros((2, 6), dtype=bool)
    padding[0, 4:] = True
    padding[1, 5] = True
    attn = data(4, 6, seed=3) > 1.0
    out, w = mha(eo.tensor(q), eo.tensor(kv), key_padding_mask=padding, attn_mask=attn, need_weights=True)
    blocked = padding[:, None, :] | attn[None]
    ref_out, ref_w = numpy_attention(mha, q, kv, kv, blocked=blocked)
    np.testing.assert_allclose(out.data, ref_out, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(w.data, ref_w, rtol=1e-10, atol=1e-12)
    assert np.all(w.data[0, :, :, 4:] == 0)


def test_float_mask_is_added_to_the_scores():
    mha = make(seed=3)
    x = data(1, 4, E)
    additive = data(4, 4, seed=4)
    additive[0, 2] = -np.inf
    out, w = mha(eo.tensor(x), attn_mask=additive, need_weights=True)
    ref_out, ref_w = numpy_attention(mha, x, x, x, additive=additive)
    np.testing.assert_allclose(out.data, ref_out, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(w.data, ref_w, rtol=1e-10, atol=1e-12)


def test_fully_masked_query_gives_zero_weights_not_nan():
    mha = make(seed=4)
    x = data(2, 3, E)
    padding = np.array([[True, True, True], [False, True, False]])
    out, w = mha(eo.tensor(x, requires_grad=False), key_padding_mask=padding, need_weights=True)
    assert np.all(np.isfinite(out.data)) and np.all(np.isfinite(w.data))
    np.testing.assert_array_equal(w.data[0], 0)
    # No keys to attend to: the context is zero, so the output is the out-projection's bias.
    np.testing.assert_allclose(out.data[0], np.broadcast_to(mha.out_proj.bias.data, (3, E)))
    xt = eo.tensor(x, requires_grad=True)
    mha(xt, key_padding_mask=padding).sum().backward()
    assert np.all(np.isfinite(xt.grad)) and all(np.all(np.isfinite(p.grad)) for p in mha.parameters())


def test_causal_mask_hides_the_future_bit_for_bit():
    mha = eo.MultiHeadAttention(E, HEADS, seed=5)
    x = data(2, 7, E).astype("float32")
    changed = x.copy()
    changed[:, 4:] = data(2, 3, E, seed=9)
    a, b = mha(x, is_causal=True).data, mha(changed, is_causal=True).data
    np.testing.assert_array_equal(a[:, :4], b[:, :4])
    assert not np.allclose(a[:, 4:], b[:, 4:])
    # Without the mask the change reaches every position.
    assert not np.allclose(mha(x).data[:, :4], mha(changed).data[:, :4])


def test_causal_mask_is_the_same_as_an_explicit_mask():
    mha = make(seed=6)
    x = data(2, 5, E)
    explicit = np.triu(np.ones((5, 5), dtype=bool), k=1)
    np.testing.assert_array_equal(eo.causal_mask(5), explicit)
    np.testing.assert_array_equal(mha(x, is_causal=True).data, mha(x, attn_mask=explicit).data)
    ref_out, _ = numpy_attention(mha, x, x, x, blocked=np.broadcast_to(explicit, (2, 5, 5)))
    np.testing.assert_allclose(mha(x, is_causal=True).data, ref_out, rtol=1e-10, atol=1e-12)


# --- gradients ------------------------------------------------------------------------
def test_self_attention_gradients_with_causal_and_padding_masks():
    mha = eo.MultiHeadAttention(4, 2, seed=7)
    padding = np.array([[False, False, True], [False, False, False]])
    mha.to("float64")
    check_gradients(
        lambda x: mha(x, key_padding_mask=padding, is_causal=True, need_weights=True),
        [data(2, 3, 4)],
        mha.parameters(),
        name="MultiHeadAttention self",
    )


def test_cross_attention_gradients_separate_key_and_value():
    mha = eo.MultiHeadAttention(4, 2, seed=8)
    check_module_gradients(mha, data(2, 2, 4), data(2, 3, 4, seed=1), data(2, 3, 4, seed=2))


def test_cross_attention_gradients_shared_key_value_and_a_fully_masked_row():
    mha = eo.MultiHeadAttention(4, 1, seed=9)
    attn = np.array([[True, True, True], [False, True, False]])
    mha.to("float64")
    check_gradients(
        lambda q, kv: mha(q, kv, attn_mask=attn),
        [data(2, 2, 4), data(2, 3, 4, seed=1)],
        mha.parameters(),
        name="MultiHeadAttention kv",
    )


# --- behaviour and errors --------------------------------------------------------------------
def test_attention_dropout_only_in_training_and_seeded():
    x = data(2, 5, E).astype("float32")
    a, b = eo.MultiHeadAttention(E, HEADS, dropout=0.5, seed=1), eo.MultiHeadAttention(E, HEADS, dropout=0.5, seed=1)
    np.testing.assert_array_equal(a(x).data, b(x).data)  # same seed, same masks
    assert not np.array_equal(a(x).data, a(x).data)
    a.eval()
    np.testing.assert_allclose(a(x).data, eo.MultiHeadAttention(E, HEADS, seed=1)(x).data, rtol=1e-6)


def test_mask_and_shape_errors():
    mha = eo.MultiHeadAttention(E, HEADS, seed=0)
    x = np.zeros((2, 5, E), dtype="float32")
    with pytest.raises(eo.EveryOShapeError, match=r"key_padding_mask has shape \(2, 4\), expected \(2, 5\)"):
        mha(x, key_padding_mask=np.zeros((2, 4), dtype=bool))
    with pytest.raises(eo.EveryOShapeError, match=r"attn_mask has shape \(5, 4\), expected \(5, 5\)"):
        mha(x, attn_mask=np.zeros((5, 4), dtype=bool))
    with pytest.raises(eo.EveryODTypeError, match="boolean"):
        mha(x, attn_mask=np.zeros((5, 5), dtype=int))
    with pytest.raises(eo.EveryOShapeError, match="last dimension 8"):
        mha(np.zeros((2, 5, 4), dtype="float32"))
    with pytest.raises(eo.EveryOShapeError, match="batch size"):
        mha(x, np.zeros((3, 5, E), dtype="float32"))
    with pytest.raises(ValueError, match="not divisible"):
        eo.MultiHeadAttention(10, 3)
