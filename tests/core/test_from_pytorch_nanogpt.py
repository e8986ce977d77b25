"""examples/from_pytorch/nanogpt (karpathy/nanoGPT's model.py and train.py, ported): prepare.py
and train.py run as scripts on a generated corpus and learn, the checkpoint resumes, and -- where
torch is installed -- the port's GPT matches a torch GPT written after model.py (logits, loss,
both attention branches) from the same starting weights, and follows it through AdamW steps
with train.py's parameter groups, lr schedule, gradient accumulation and clipping."""

import importlib.util
import math
import os
import re
import runpy
import sys

import numpy as np
import pytest

import everyo as eo

PORT = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "from_pytorch", "nanogpt")


def _run(script, *argv):
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv, sys.path[:0] = [script, *argv], [PORT]
    try:
        return runpy.run_path(os.path.join(PORT, script), run_name="__main__")
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
        sys.modules.pop("model", None)  # the port's module, not to be found by another test


def _model_module():
    spec = importlib.util.spec_from_file_location("from_pytorch_nanogpt_model", os.path.join(PORT, "model.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_port_trains_resumes_and_samples(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    _run(os.path.join("data", "generated_char", "prepare.py"), os.path.join("data", "generated_char"))
    config = os.path.join(PORT, "config", "train_generated_char.py")
    g = _run("train.py", config)
    out = capsys.readouterr().out
    evals = [
        (int(s), float(t), float(v))
        for s, t, v in re.findall(r"step (\d+): train loss ([0-9.]+), val loss ([0-9.]+)", out)
    ]
    assert [e[0] for e in evals] == [0, 60]
    vocab = g["meta_vocab_size"]
    assert abs(evals[0][2] - math.log(vocab)) < 0.3  # starts near the uniform guess
    assert evals[1][2] < 0.6 * evals[0][2]  # and learns the grammar's characters
    model = g["model"]
    assert model.lm_head.weight is model.transformer.wte.weight
    checkpoint = eo.load(tmp_path / "out-generated-char" / "ckpt.npz")
    assert sorted(checkpoint["model"]) == sorted(model.state_dict()) and checkpoint["iter_num"] == 60

    g2 = _run("train.py", config, "--init_from=resume", "--max_iters=64", "--eval_interval=64")
    assert g2["iter_num"] == 65 and g2["model_args"] == g["model_args"]
    out = capsys.readouterr().out
    assert "Resuming training from out-generated-char" in out and "iter 60: loss" in out and "step 64:" in out

    model.eval()
    start = eo.tensor(np.array([[g["meta"]["stoi"]["t"]]], np.int64))
    eo.manual_seed(7)
    sample = model.generate(start, 40, temperature=0.8, top_k=5)
    eo.manual_seed(7)
    assert np.array_equal(model.generate(start, 40, temperature=0.8, top_k=5).data, sample.data)
    assert sample.shape == (1, 41) and sample.data.min() >= 0 and sample.data.max() < vocab
    text = "".join(g["meta"]["itos"][int(i)] for i in sample.data[0])
    assert set(text) <= set(g["meta"]["stoi"])


def test_from_pretrained_refuses_clearly():
    with pytest.raises(NotImplementedError, match="load_torch_state_dict"):
        _model_module().GPT.from_pretrained("gpt2")


class _NoFlash:
    """``everyo`` without scaled_dot_product_attention: model.py then takes its manual branch."""

    def __getattr__(self, name):
        if name == "scaled_dot_product_attention":
            raise AttributeError(name)
        return getattr(eo, name)


def _torch_gpt(torch, cfg, flash):
    nn, F = torch.nn, torch.nn.functional

    class Block(nn.Module):  # karpathy/nanoGPT model.py (MIT, (c) 2022 Andrej Karpathy), condensed
        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
            self.attn = nn.Module()
            self.attn.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)
            self.attn.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
            self.ln_2 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
            self.mlp = nn.Module()
            self.mlp.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias)
            self.mlp.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias)

        def attend(self, x):
            B, T, C = x.size()
            q, k, v = self.attn.c_attn(x).split(cfg.n_embd, dim=2)
            q, k, v = (t.view(B, T, cfg.n_head, C // cfg.n_head).transpose(1, 2) for t in (q, k, v))
            if flash:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
                att = att.masked_fill(torch.tril(torch.ones(T, T)) == 0, float("-inf"))
                y = F.softmax(att, dim=-1) @ v
            return self.attn.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))

        def forward(self, x):
            x = x + self.attend(self.ln_1(x))
            return x + self.mlp.c_proj(F.gelu(self.mlp.c_fc(self.ln_2(x))))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.transformer = nn.ModuleDict(
                dict(
                    wte=nn.Embedding(cfg.vocab_size, cfg.n_embd),
                    wpe=nn.Embedding(cfg.block_size, cfg.n_embd),
                    h=nn.ModuleList([Block() for _ in range(cfg.n_layer)]),
                    ln_f=nn.LayerNorm(cfg.n_embd, bias=cfg.bias),
                )
            )
            self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
            self.transformer.wte.weight = self.lm_head.weight
            for name, p in self.named_parameters():  # _init_weights, random norms and biases to test them too
                std = 0.02 / math.sqrt(2 * cfg.n_layer) if name.endswith("c_proj.weight") else 0.02
                torch.nn.init.normal_(p, mean=1.0 if ".ln_" in name and name.endswith("weight") else 0.0, std=std)

        def forward(self, idx, targets=None):
            t = idx.size(1)
            x = self.transformer.wte(idx) + self.transformer.wpe(torch.arange(0, t))
            for block in self.transformer.h:
                x = block(x)
            x = self.transformer.ln_f(x)
            if targets is None:
                return self.lm_head(x[:, [-1], :]), None
            logits = self.lm_head(x)
            return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)

    return GPT()


def _pair(torch, flash, monkeypatch, bias=True):
    port = _model_module()
    if not flash:
        monkeypatch.setattr(port, "F", _NoFlash())
    cfg = port.GPTConfig(block_size=16, vocab_size=29, n_layer=2, n_head=2, n_embd=32, dropout=0.0, bias=bias)
    torch.manual_seed(0)
    reference = _torch_gpt(torch, cfg, flash)
    state = {k: v.detach().numpy().copy() for k, v in reference.state_dict().items() if k != "lm_head.weight"}
    model = eo.load_torch_state_dict(port.GPT(cfg), state, strict=False)
    assert model.lm_head.weight is model.transformer.wte.weight
    return port, model, reference


def _eo_layout(name, tensor):
    """A torch parameter (or gradient) in EveryO's layout: Linear weights are (in, out) there."""
    array = tensor.detach().numpy()
    return array.T if array.ndim == 2 and ".wte." not in name and ".wpe." not in name else array


def _batch(seed, batch=4, length=16, vocab=29):
    rng = np.random.default_rng(seed)  # runs of consecutive ids (learnable), with some noise
    x = (rng.integers(0, vocab, (batch, 1)) + np.arange(length)) % vocab
    x = np.where(rng.random(x.shape) < 0.2, rng.integers(0, vocab, x.shape), x)
    y = (x + 1) % vocab
    y[0, :3] = -1  # ignored targets (cross_entropy's ignore_index=-1 in model.py)
    return x, y


@pytest.mark.parametrize("flash", [True, False], ids=["scaled_dot_product_attention", "manual_attention"])
def test_logits_and_loss_match_torch_from_the_same_weights(flash, monkeypatch):
    torch = pytest.importorskip("torch")
    port, model, reference = _pair(torch, flash, monkeypatch)
    assert model.transformer.h[0].attn.flash is flash
    x, y = _batch(1)
    logits, loss = model(eo.tensor(x), eo.tensor(y))
    t_logits, t_loss = reference(torch.from_numpy(x), torch.from_numpy(y))
    np.testing.assert_allclose(logits.data, t_logits.detach().numpy(), atol=1e-5, rtol=0)
    np.testing.assert_allclose(loss.item(), t_loss.item(), rtol=1e-6)
    last, none = model(eo.tensor(x[:, :7]))  # inference: the last position only
    t_last, _ = reference(torch.from_numpy(x[:, :7]))
    assert none is None and last.shape == (4, 1, 29)
    np.testing.assert_allclose(last.data, t_last.detach().numpy(), atol=1e-5, rtol=0)

    loss.backward()
    t_loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    for name, p in reference.named_parameters():
        np.testing.assert_allclose(grads[name], _eo_layout(name, p.grad), atol=2e-6, rtol=1e-4, err_msg=name)

    greedy = model.generate(eo.tensor(x[:2, :5]), 20, top_k=1)  # top_k=1: no randomness left
    t_greedy = reference_generate(torch, reference, torch.from_numpy(x[:2, :5]), 20)
    assert np.array_equal(greedy.data, t_greedy.numpy())


def reference_generate(torch, reference, idx, n):
    with torch.no_grad():
        for _ in range(n):
            logits, _ = reference(idx[:, -16:])
            idx = torch.cat((idx, logits[:, -1, :].argmax(-1, keepdim=True)), dim=1)
    return idx


def test_adamw_steps_follow_torch(monkeypatch, capsys):
    # train.py's step: param groups from configure_optimizers, warmup/cosine lr, two micro-batches
    # of accumulated gradient, clipping at 1.0, AdamW(betas=(0.9, 0.95), weight_decay=0.1).
    torch = pytest.importorskip("torch")
    port, model, reference = _pair(torch, True, monkeypatch)
    optimizer = model.configure_optimizers(0.1, 6e-3, (0.9, 0.95), "cpu")
    assert "num decayed parameter tensors: 10," in capsys.readouterr().out  # 2D: 4 per block, wte, wpe
    decay = [p for n, p in reference.named_parameters() if p.dim() >= 2]
    nodecay = [p for n, p in reference.named_parameters() if p.dim() < 2]
    names = {id(p): n for n, p in model.named_parameters()}
    assert [[names[id(p)] for p in g["params"]] for g in optimizer.param_groups] == [
        [n for n, p in reference.named_parameters() if p.dim() >= 2],
        [n for n, p in reference.named_parameters() if p.dim() < 2],
    ]
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.1, 0.0]
    t_optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": nodecay, "weight_decay": 0.0}], lr=6e-3, betas=(0.9, 0.95)
    )

    def lr_at(it, warmup=2, decay_iters=6, lr=6e-3, min_lr=6e-4):
        if it < warmup:
            return lr * (it + 1) / (warmup + 1)
        return min_lr + 0.5 * (1.0 + math.cos(math.pi * (it - warmup) / (decay_iters - warmup))) * (lr - min_lr)

    losses, t_losses = [], []
    for it in range(6):
        for group in optimizer.param_groups + t_optimizer.param_groups:
            group["lr"] = lr_at(it)
        for micro in range(2):
            x, y = _batch(10 * it + micro)
            _, loss = model(eo.tensor(x), eo.tensor(y))
            (loss / 2).backward()
            _, t_loss = reference(torch.from_numpy(x), torch.from_numpy(y))
            (t_loss / 2).backward()
            losses.append(loss.item())
            t_losses.append(t_loss.item())
        eo.clip_grad_norm(model.parameters(), 1.0)
        torch.nn.utils.clip_grad_norm_(reference.parameters(), 1.0)
        optimizer.step()
        t_optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        t_optimizer.zero_grad(set_to_none=True)
    # float32 rounding makes the gradients differ in their last digits (4e-8 absolute measured);
    # measured: losses within 1.4e-7 relative, weights within 9e-6. Adam divides by sqrt(v), so
    # an element whose gradient is near zero can move by a different fraction of lr: the weights
    # are held to 1% of the peak lr (6e-5), the losses to 1e-5 relative.
    np.testing.assert_allclose(losses, t_losses, rtol=1e-5)
    assert t_losses[-1] < t_losses[0] - 0.1  # the steps did move the model
    weights = dict(model.named_parameters())
    for name, p in reference.named_parameters():
        np.testing.assert_allclose(weights[name].data, _eo_layout(name, p), atol=6e-5, rtol=0, err_msg=name)


def test_crop_block_size_keeps_the_logits(monkeypatch):
    port = _model_module()
    for flash in (True, False):
        if not flash:
            monkeypatch.setattr(port, "F", _NoFlash())
        eo.manual_seed(0)
        model = port.GPT(port.GPTConfig(block_size=16, vocab_size=29, n_layer=1, n_head=2, n_embd=16, dropout=0.0))
        x, _ = _batch(2, length=8)
        before, _ = model(eo.tensor(x))
        model.crop_block_size(8)
        after, _ = model(eo.tensor(x))
        assert model.transformer.wpe.weight.shape == (8, 16)
        np.testing.assert_array_equal(after.data, before.data)
        if not flash:  # the cropped mask stays a buffer, saved with the model (as in PyTorch)
            assert model.state_dict()["transformer.h.0.attn.bias"].shape == (1, 1, 8, 8)
        with pytest.raises(AssertionError, match="block size is only 8"):
            model(eo.tensor(np.zeros((1, 9), np.int64)))
