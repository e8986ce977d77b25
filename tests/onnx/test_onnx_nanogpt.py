"""karpathy/nanoGPT's model.py as written, in EveryO, exported as a user would.

The model below keeps model.py's structure line for line (GPTConfig,
LayerNorm with optional bias, CausalSelfAttention, MLP, Block, GPT with
``transformer`` a ModuleDict, tied wte/lm_head weights, the ``assert`` on the
sequence length, ``pos = arange(0, t)``, ``forward(idx, targets=None)``
returning ``(logits, loss)`` with ``logits[:, [-1], :]`` at inference). What
differs is spelling only: ``x.shape`` for PyTorch's ``x.size()`` (EveryO's
``x.size`` is NumPy's element count), weights drawn with NumPy instead of ``torch.nn.init``,
and ``lm_head.tie_weight(wte.weight)`` for ``wte.weight = lm_head.weight``.

Both attention branches are tested: the manual one (causal-mask buffer sliced
``[:, :, :T, :T]``) and ``scaled_dot_product_attention(is_causal=True)``
("flash"). Each is exported with dynamic batch and sequence and
``verify=True``, then run by ONNX Runtime at sequence lengths 1, 5 and
block_size and compared with EveryO.
"""

import math
from dataclasses import dataclass

import numpy as np
import onnx
import pytest

import everyo as eo
from everyo.onnx.guards import read_guards


class LayerNorm(eo.Module):
    """LayerNorm but with an optional bias."""

    def __init__(self, ndim, bias):
        super().__init__()
        self.weight = eo.Parameter(np.ones(ndim, np.float32))
        self.bias = eo.Parameter(np.zeros(ndim, np.float32)) if bias else None

    def forward(self, input):
        return eo.layer_norm(input, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(eo.Module):
    def __init__(self, config):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.c_attn = eo.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = eo.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.attn_dropout = eo.Dropout(config.dropout)
        self.resid_dropout = eo.Dropout(config.dropout)
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.dropout = config.dropout
        self.flash = config.flash
        if not self.flash:
            bias = np.tril(np.ones((config.block_size, config.block_size), np.float32))
            self.register_buffer("bias", eo.tensor(bias).view(1, 1, config.block_size, config.block_size))

    def forward(self, x):
        B, T, C = x.shape  # batch size, sequence length, embedding dimensionality (n_embd)

        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)

        if self.flash:
            y = eo.scaled_dot_product_attention(
                q, k, v, attn_mask=None, dropout_p=self.dropout if self.training else 0, is_causal=True
            )
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.shape[-1]))
            att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
            att = eo.softmax(att, dim=-1)
            att = self.attn_dropout(att)
            y = att @ v  # (B, nh, T, T) x (B, nh, T, hs) -> (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # re-assemble all head outputs side by side

        y = self.resid_dropout(self.c_proj(y))
        return y


class MLP(eo.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = eo.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = eo.GELU()
        self.c_proj = eo.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = eo.Dropout(config.dropout)

    def forward(self, x):
        x = self.c_fc(x)
        x = self.gelu(x)
        x = self.c_proj(x)
        x = self.dropout(x)
        return x


class Block(eo.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_1 = LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


@dataclass
class GPTConfig:
    block_size: int = 8
    vocab_size: int = 29
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 16
    dropout: float = 0.1  # off in the exported (eval-mode) graph
    bias: bool = True
    flash: bool = False  # EveryO has scaled_dot_product_attention; the test runs both branches


class GPT(eo.Module):
    def __init__(self, config):
        super().__init__()
        assert config.vocab_size is not None
        assert config.block_size is not None
        self.config = config

        self.transformer = eo.ModuleDict(
            dict(
                wte=eo.Embedding(config.vocab_size, config.n_embd),
                wpe=eo.Embedding(config.block_size, config.n_embd),
                drop=eo.Dropout(config.dropout),
                h=eo.ModuleList([Block(config) for _ in range(config.n_layer)]),
                ln_f=LayerNorm(config.n_embd, bias=config.bias),
            )
        )
        self.lm_head = eo.Linear(config.n_embd, config.vocab_size, bias=False)
        self.lm_head.tie_weight(self.transformer.wte.weight)  # weight tying

        rng = np.random.default_rng(0)
        for pn, p in self.named_parameters():  # GPT-2's init, with random biases and norms to test them too
            std = 0.02 / math.sqrt(2 * config.n_layer) if pn.endswith("c_proj.weight") else 0.02
            p.data = (rng.standard_normal(p.shape) * (std if p.ndim == 2 else 0.1)).astype(np.float32)
            if pn.endswith("ln_1.weight") or pn.endswith("ln_2.weight") or pn.endswith("ln_f.weight"):
                p.data += 1

    def forward(self, idx, targets=None):
        b, t = idx.shape
        assert t <= self.config.block_size, (
            f"Cannot forward sequence of length {t}, block size is only {self.config.block_size}"
        )
        pos = eo.arange(0, t, dtype="int64")  # shape (t)

        tok_emb = self.transformer.wte(idx)  # token embeddings of shape (b, t, n_embd)
        pos_emb = self.transformer.wpe(pos)  # position embeddings of shape (t, n_embd)
        x = self.transformer.drop(tok_emb + pos_emb)
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)

        if targets is not None:
            logits = self.lm_head(x)
            loss = eo.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1), ignore_index=-1)
        else:
            logits = self.lm_head(x[:, [-1], :])  # note: using list [-1] to preserve the time dim
            loss = None

        return logits, loss


def _ids(batch, length, seed):
    return np.random.default_rng(seed).integers(0, GPTConfig.vocab_size, (batch, length))


def _targets(batch, length, seed):
    targets = _ids(batch, length, seed)
    targets[0, 0] = -1  # ignored (ignore_index=-1); the other rows keep the loss defined at length 1
    return targets


@pytest.mark.parametrize("flash", [False, True], ids=["manual_attention", "scaled_dot_product_attention"])
@pytest.mark.parametrize("example_length", [5, GPTConfig.block_size])
def test_nanogpt_exports_with_dynamic_batch_and_sequence(flash, example_length, tmp_path):
    config = GPTConfig(flash=flash)
    model = GPT(config).eval()
    assert model.lm_head.weight is model.transformer.wte.weight
    path = tmp_path / "gpt.onnx"
    eo.export_onnx(
        model,
        path,
        example_input=_ids(2, example_length, 1),
        input_names=["idx"],
        output_names=["logits"],
        dynamic_axes={"idx": {0: "batch", 1: "seq"}},
        verify=True,
    )
    proto = onnx.load(str(path))
    (guard,) = read_guards(proto)
    assert guard.text == f"seq <= {config.block_size}" and "test_onnx_nanogpt.py" in guard.line
    tables = [i for i in proto.graph.initializer if tuple(i.dims) == (config.vocab_size, config.n_embd)]
    assert len(tables) == 1  # wte and lm_head share one initializer
    for batch, length in [(1, 1), (3, 5), (2, config.block_size)]:
        idx = _ids(batch, length, 10 + length)
        with eo.no_grad():
            expected, loss = model(eo.tensor(idx))
        assert loss is None and expected.shape == (batch, 1, config.vocab_size)
        actual, no_loss = eo.run_onnx(path, idx)  # the file keeps forward()'s (logits, None)
        assert no_loss is None
        np.testing.assert_allclose(actual, expected.data, rtol=1e-5, atol=1e-5)


def test_nanogpt_with_targets_exports_the_loss(tmp_path):
    model = GPT(GPTConfig()).eval()
    path = tmp_path / "gpt_loss.onnx"
    axes = {"idx": {0: "batch", 1: "seq"}, "targets": {0: "batch", 1: "seq"}}
    eo.export_onnx(
        model,
        path,
        example_input=(_ids(2, 5, 1), _targets(2, 5, 2)),
        input_names=["idx", "targets"],
        output_names=["logits", "loss"],
        dynamic_axes=axes,
        verify=True,
    )
    for length in (1, 8):
        idx, targets = _ids(3, length, 3), _targets(3, length, 4)
        with eo.no_grad():
            logits, loss = model(eo.tensor(idx), eo.tensor(targets))
        got_logits, got_loss = eo.run_onnx(path, idx, targets)
        np.testing.assert_allclose(got_logits, logits.data, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(got_loss, loss.data, rtol=1e-5, atol=1e-5)


def test_nanogpt_compiled_serves_it_and_checks_the_assert():
    import warnings

    from everyo.errors import EveryOShapeError

    model = GPT(GPTConfig()).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback to EveryO: the graph runs in ONNX Runtime
        fast = eo.onnx.compile(model, _ids(1, 5, 0), input_names=["idx"], dynamic_axes={"idx": {0: "batch", 1: "seq"}})
        for batch, length in [(1, 1), (2, GPTConfig.block_size)]:
            idx = _ids(batch, length, 7)
            logits, loss = fast(idx)
            with eo.no_grad():
                expected, _ = model(eo.tensor(idx))
            assert loss is None
            np.testing.assert_allclose(logits.data, expected.data, rtol=1e-5, atol=1e-5)
    with pytest.raises(EveryOShapeError, match=r"needs seq <= 8 .*seq=9"):
        fast(_ids(2, GPTConfig.block_size + 1, 7))  # nanoGPT's assert, checked before ONNX Runtime runs
