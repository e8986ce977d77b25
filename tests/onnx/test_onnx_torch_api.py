"""The PyTorch-style composites (everyo.composites, scaled_dot_product_attention,
layer_norm, LayerNorm(bias=False), batch_first=False recurrences, einsum with
'...' and diagonals) export through the existing rules and agree with ONNX
Runtime at batch 1 (traced) and 7 (the symbolic batch axis)."""

import numpy as np
import pytest
from onnx_agreement import assert_traced_agrees
from test_onnx_ops import Fn, floats

import everyo as eo

RNG = np.random.default_rng(5)
CAUSAL_KEYS = np.tril(np.ones((4, 4), bool))
ADDITIVE = RNG.standard_normal((4, 4)).astype(np.float32)
LN_W = RNG.standard_normal(4).astype(np.float32)

CASES = [
    ("sdpa", lambda m, x: eo.scaled_dot_product_attention(x, x, x), {}),
    ("sdpa_causal", lambda m, x: eo.scaled_dot_product_attention(x, x * 2, x, is_causal=True), {}),
    ("sdpa_bool_mask", lambda m, x: eo.scaled_dot_product_attention(x, x, x, attn_mask=CAUSAL_KEYS), {}),
    ("sdpa_float_mask", lambda m, x: eo.scaled_dot_product_attention(x, x, x, attn_mask=ADDITIVE, scale=0.7), {}),
    ("permute", lambda m, x: x.permute(2, 0, 1), {}),
    ("transpose_swap", lambda m, x: x.transpose(1, 2), {}),
    ("split_size", lambda m, x: x.split(3, dim=2), {}),
    ("chunk", lambda m, x: eo.chunk(x, 2, dim=-1), {}),
    ("view", lambda m, x: x.view(-1, 16), {}),
    ("sum_dim", lambda m, x: x.sum(dim=1, keepdim=True), {}),
    ("einsum_diagonal", lambda m, x: eo.einsum("bii->bi", x), {}),
    ("einsum_ellipsis", lambda m, x: eo.einsum("...ij,jk->...ik", x, m.w), {"w": RNG.standard_normal((4, 3))}),
    ("layer_norm_weight_only", lambda m, x: eo.layer_norm(x, 4, m.w), {"w": LN_W}),
]


@pytest.mark.parametrize("fn, params", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_torch_style_ops_agree_with_runtime(fn, params, tmp_path):
    params = {k: v.astype(np.float32) for k, v in params.items()}
    assert_traced_agrees(Fn(fn, **params), floats(4, 4), tmp_path / "op.onnx", sizes=[(1,), (7,)])


def test_layer_norm_without_bias_module(tmp_path):
    model = eo.Sequential(eo.Linear(4, 6, seed=0), eo.LayerNorm(6, bias=False))
    model[1].weight.data = RNG.standard_normal(6).astype(np.float32)
    assert_traced_agrees(model, floats(3, 4), tmp_path / "ln.onnx", sizes=[(1,), (7,)])


def test_lstm_time_major(tmp_path):
    lstm = eo.LSTM(4, 5, batch_first=False, seed=0)

    class Net(eo.Module):
        def __init__(self):
            super().__init__()
            self.lstm = lstm

        def forward(self, x):
            return self.lstm(x)[0]

    # (time, batch, features): the traced time length is fixed, the batch axis is 1.
    def make(batch):
        return np.random.default_rng(batch).standard_normal((6, batch, 4)).astype(np.float32)

    assert_traced_agrees(Net(), make, tmp_path / "lstm.onnx", sizes=[(1,)], dynamic_axes={})
