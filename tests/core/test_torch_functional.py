"""scaled_dot_product_attention, functional layer_norm, LayerNorm(bias=False)
and the recurrent layers' batch_first=: NumPy references and central
differences everywhere, torch's values and gradients where torch is installed."""

import math

import numpy as np
import pytest

import everyo as eo
from everyo.testing import check_gradients

RNG = np.random.default_rng(1)


def reference_attention(q, k, v, blocked=None, added=None, scale=None):
    """Plain NumPy, float64: softmax over keys of the scaled scores."""
    scores = q @ np.swapaxes(k, -1, -2) * (1 / math.sqrt(q.shape[-1]) if scale is None else scale)
    if added is not None:
        scores = scores + added
    if blocked is not None:
        scores = np.where(blocked, -np.inf, scores)
    peak = np.max(scores, -1, keepdims=True)
    e = np.exp(scores - np.where(np.isfinite(peak), peak, 0))
    total = e.sum(-1, keepdims=True)
    return (e / np.where(total > 0, total, 1)) @ v


ALLOWED = RNG.random((5, 6)) > 0.4
ALLOWED[:, 0] = True
ADDITIVE = RNG.standard_normal((3, 5, 6))
CASES = {
    "plain": ({}, {}),
    "causal": ({"is_causal": True}, {"blocked": np.triu(np.ones((5, 6), bool), 1)}),
    "bool mask": ({"attn_mask": ALLOWED}, {"blocked": ~ALLOWED}),
    "float mask": ({"attn_mask": ADDITIVE}, {"added": ADDITIVE}),
    "scale": ({"scale": 0.3}, {"scale": 0.3}),
}


def qkv(batch=(2, 3)):
    return (
        RNG.standard_normal(batch + (5, 8)),
        RNG.standard_normal(batch + (6, 8)),
        RNG.standard_normal(batch + (6, 4)),
    )


@pytest.mark.parametrize("case", sorted(CASES))
def test_sdpa_forward_and_gradients(case):
    kwargs, ref = CASES[case]
    q, k, v = qkv()
    out = eo.scaled_dot_product_attention(eo.tensor(q), eo.tensor(k), eo.tensor(v), **kwargs)
    np.testing.assert_allclose(out.data, reference_attention(q, k, v, **ref), rtol=1e-12, atol=1e-12)
    check_gradients(lambda a, b, c: eo.scaled_dot_product_attention(a, b, c, **kwargs), [q, k, v], name=case)


@pytest.mark.parametrize("case", sorted(CASES))
def test_sdpa_matches_torch(case):
    torch = pytest.importorskip("torch")
    kwargs, _ = CASES[case]
    q, k, v = qkv()
    ours = [eo.tensor(a, requires_grad=True) for a in (q, k, v)]
    theirs = [torch.tensor(a, requires_grad=True) for a in (q, k, v)]
    tkw = {n: torch.tensor(m) if isinstance(m, np.ndarray) else m for n, m in kwargs.items()}
    out = eo.scaled_dot_product_attention(*ours, **kwargs)
    ref = torch.nn.functional.scaled_dot_product_attention(*theirs, **tkw)
    np.testing.assert_allclose(out.data, ref.detach().numpy(), rtol=1e-10, atol=1e-12)
    w = RNG.standard_normal(out.shape)
    (out * eo.tensor(w)).sum().backward()
    (ref * torch.tensor(w)).sum().backward()
    for o, r in zip(ours, theirs):
        np.testing.assert_allclose(o.grad, r.grad.numpy(), rtol=1e-9, atol=1e-12)


def test_sdpa_dropout_is_the_seeded_mask():
    q, k, v = qkv((2,))
    p = 0.3
    out = eo.scaled_dot_product_attention(eo.tensor(q), eo.tensor(k), eo.tensor(v), dropout_p=p, seed=4)
    weights = reference_attention(q, k, np.eye(6))  # the attention weights themselves
    keep = np.random.default_rng(4).random(weights.shape) >= p
    np.testing.assert_allclose(out.data, (weights * keep / (1 - p)) @ v, rtol=1e-12)
    again = eo.scaled_dot_product_attention(eo.tensor(q), eo.tensor(k), eo.tensor(v), dropout_p=p, seed=4)
    np.testing.assert_array_equal(out.data, again.data)


def test_sdpa_fully_blocked_rows_and_refusals():
    q, k, v = qkv((1,))
    allowed = np.ones((5, 6), bool)
    allowed[2] = False
    out = eo.scaled_dot_product_attention(eo.tensor(q), eo.tensor(k), eo.tensor(v), attn_mask=allowed)
    assert np.all(out.data[0, 2] == 0) and np.isfinite(out.data).all()
    with pytest.raises(ValueError, match="not both"):
        eo.scaled_dot_product_attention(q, k, v, attn_mask=allowed, is_causal=True)
    with pytest.raises(eo.EveryOShapeError, match="does not broadcast"):
        eo.scaled_dot_product_attention(q, k, v, attn_mask=np.ones((4, 6), bool))
    with pytest.raises(eo.EveryOShapeError, match="disagree"):
        eo.scaled_dot_product_attention(q, k, v[..., :5, :])
    with pytest.raises(eo.EveryODTypeError, match="boolean .True = attend. or floating"):
        eo.scaled_dot_product_attention(q, k, v, attn_mask=np.ones((5, 6), np.int64))


# --- layer_norm ------------------------------------------------------------------------------
def reference_layer_norm(x, k, w=None, b=None, eps=1e-5):
    axes = tuple(range(x.ndim - k, x.ndim))
    y = (x - x.mean(axes, keepdims=True)) / np.sqrt(x.var(axes, keepdims=True) + eps)
    return y * (1 if w is None else w) + (0 if b is None else b)


@pytest.mark.parametrize("affine", ["both", "weight", "bias", "none"])
def test_functional_layer_norm(affine):
    x = RNG.standard_normal((3, 4, 5))
    w, b = RNG.standard_normal((4, 5)), RNG.standard_normal((4, 5))
    w = w if affine in ("both", "weight") else None
    b = b if affine in ("both", "bias") else None
    params = [a for a in (w, b) if a is not None]

    def f(x, *ps):
        it = iter(ps)
        return eo.layer_norm(x, (4, 5), next(it) if w is not None else None, next(it) if b is not None else None)

    np.testing.assert_allclose(
        f(eo.tensor(x), *map(eo.tensor, params)).data, reference_layer_norm(x, 2, w, b), atol=1e-12
    )
    check_gradients(f, [x] + params, name=f"layer_norm-{affine}")
    torch = pytest.importorskip("torch")
    ref = torch.nn.functional.layer_norm(
        torch.tensor(x), (4, 5), None if w is None else torch.tensor(w), None if b is None else torch.tensor(b)
    )
    np.testing.assert_allclose(f(eo.tensor(x), *map(eo.tensor, params)).data, ref.numpy(), atol=1e-12)


def test_layer_norm_refusals():
    with pytest.raises(eo.EveryOShapeError, match=r"normalized_shape \(4,\) must be the input's trailing shape"):
        eo.layer_norm(eo.zeros(2, 3), 4)
    with pytest.raises(eo.EveryOShapeError, match=r"weight must have shape \(3,\)"):
        eo.layer_norm(eo.zeros(2, 3), 3, eo.ones(2))


def test_layer_norm_module_without_bias():
    layer = eo.LayerNorm(6, bias=False, dtype="float64")
    assert layer.bias is None and [n for n, _ in layer.named_parameters()] == ["weight"]
    assert "bias=False" in repr(layer)
    layer.weight.data = RNG.standard_normal(6)
    x = RNG.standard_normal((2, 3, 6))
    np.testing.assert_allclose(layer(eo.tensor(x)).data, reference_layer_norm(x, 1, layer.weight.data), atol=1e-12)
    check_gradients(lambda t: layer(t), [x], params=[layer.weight], name="LayerNorm(bias=False)")
    assert eo.LayerNorm(6).bias is not None
    torch = pytest.importorskip("torch")
    ref = torch.nn.LayerNorm(6, bias=False, dtype=torch.float64)
    with torch.no_grad():
        ref.weight.copy_(torch.tensor(layer.weight.data))
    np.testing.assert_allclose(layer(eo.tensor(x)).data, ref(torch.tensor(x)).detach().numpy(), atol=1e-12)


# --- batch_first -----------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["RNN", "LSTM", "GRU"])
def test_recurrent_batch_first_false_is_time_major(kind):
    kwargs = dict(num_layers=2, bidirectional=True, seed=0, dtype="float64")
    major = getattr(eo, kind)(3, 4, batch_first=False, **kwargs)
    first = getattr(eo, kind)(3, 4, **kwargs)  # the same weights (same seed), batch-first
    assert first.batch_first and not major.batch_first and "batch_first=False" in repr(major)
    x = RNG.standard_normal((7, 2, 3))  # (time, batch, features)
    out, state = major(eo.tensor(x))
    out_bf, state_bf = first(eo.tensor(np.swapaxes(x, 0, 1)))
    assert out.shape == (7, 2, 8)
    np.testing.assert_array_equal(out.data, np.swapaxes(out_bf.data, 0, 1))
    h, h_bf = (state[0], state_bf[0]) if kind == "LSTM" else (state, state_bf)
    np.testing.assert_array_equal(h.data, h_bf.data)
    check_gradients(lambda t: major(t)[0], [x[:3]], name=f"{kind}(batch_first=False)")
    with pytest.raises(TypeError, match="batch_first must be True or False"):
        getattr(eo, kind)(3, 4, batch_first=0)


def test_lstm_batch_first_false_matches_torch():
    torch = pytest.importorskip("torch")
    ref = torch.nn.LSTM(3, 4, num_layers=2, dtype=torch.float64)  # batch_first=False: PyTorch's default
    ours = eo.LSTM(3, 4, num_layers=2, batch_first=False, dtype="float64")
    for name, p in ref.named_parameters():
        getattr(ours, name).data = p.detach().numpy().T.copy()  # EveryO stores (in, gates * hidden)
    x = RNG.standard_normal((6, 2, 3))
    out, (h, c) = ours(eo.tensor(x))
    rout, (rh, rc) = ref(torch.tensor(x))
    np.testing.assert_allclose(out.data, rout.detach().numpy(), atol=1e-12)
    np.testing.assert_allclose(c.data, rc.detach().numpy(), atol=1e-12)
