"""karpathy/nanoGPT's model.py as written, in EveryO, exported as a user would.

The model is examples/from_pytorch/nanogpt/model.py, the port of nanoGPT's
model.py (its docstring lists what differs from the original: spelling only),
loaded from its file: GPTConfig, LayerNorm with optional bias,
CausalSelfAttention, MLP, Block, GPT with ``transformer`` a ModuleDict, tied
wte/lm_head weights, the ``assert`` on the sequence length, ``pos = arange(0,
t)``, ``forward(idx, targets=None)`` returning ``(logits, loss)`` with
``logits[:, [-1], :]`` at inference. Its weights are redrawn here with random
biases and norms, so that those are tested too.

Both attention branches are tested: the manual one (causal-mask buffer sliced
``[:, :, :T, :T]``, which the port takes where ``scaled_dot_product_attention``
is missing: set up here as its ``__init__`` does) and
``scaled_dot_product_attention(is_causal=True)`` ("flash"). Each is exported
with dynamic batch and sequence and ``verify=True``, then run by ONNX Runtime
at sequence lengths 1, 5 and block_size and compared with EveryO.
"""

import importlib.util
import math
from pathlib import Path

import numpy as np
import onnx
import pytest

import everyo as eo
from everyo.onnx.guards import read_guards

MODEL = Path(__file__).resolve().parents[2] / "examples" / "from_pytorch" / "nanogpt" / "model.py"
_spec = importlib.util.spec_from_file_location("from_pytorch_nanogpt_model_for_export", MODEL)
port = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(port)

BLOCK_SIZE, VOCAB_SIZE = 8, 29


def GPT(flash=False, **config):
    """The port's GPT, small, with random weights (biases and norms too); the
    manual attention branch unless ``flash``."""
    config = port.GPTConfig(
        **{"block_size": BLOCK_SIZE, "vocab_size": VOCAB_SIZE, "n_layer": 2, "n_head": 2, "n_embd": 16, "dropout": 0.1}
        | config
    )
    model = port.GPT(config)
    if not flash:
        for block in model.transformer.h:  # the port's __init__ without scaled_dot_product_attention
            block.attn.flash = False
            mask = np.tril(np.ones((config.block_size, config.block_size), np.float32))
            block.attn.register_buffer("bias", eo.tensor(mask).view(1, 1, config.block_size, config.block_size))
    rng = np.random.default_rng(0)
    for pn, p in model.named_parameters():  # GPT-2's init, with random biases and norms to test them too
        std = 0.02 / math.sqrt(2 * config.n_layer) if pn.endswith("c_proj.weight") else 0.02
        p.data = (rng.standard_normal(p.shape) * (std if p.ndim == 2 else 0.1)).astype(np.float32)
        if pn.endswith("ln_1.weight") or pn.endswith("ln_2.weight") or pn.endswith("ln_f.weight"):
            p.data += 1
    return model


def _ids(batch, length, seed):
    return np.random.default_rng(seed).integers(0, VOCAB_SIZE, (batch, length))


def _targets(batch, length, seed):
    targets = _ids(batch, length, seed)
    targets[0, 0] = -1  # ignored (ignore_index=-1); the other rows keep the loss defined at length 1
    return targets


@pytest.mark.parametrize("flash", [False, True], ids=["manual_attention", "scaled_dot_product_attention"])
@pytest.mark.parametrize("example_length", [5, BLOCK_SIZE])
def test_nanogpt_exports_with_dynamic_batch_and_sequence(flash, example_length, tmp_path):
    model = GPT(flash=flash).eval()
    config = model.config
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
    assert guard.text == f"seq <= {config.block_size}" and "nanogpt/model.py" in guard.line
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
    model = GPT().eval()
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

    model = GPT().eval()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback to EveryO: the graph runs in ONNX Runtime
        fast = eo.onnx.compile(model, _ids(1, 5, 0), input_names=["idx"], dynamic_axes={"idx": {0: "batch", 1: "seq"}})
        for batch, length in [(1, 1), (2, BLOCK_SIZE)]:
            idx = _ids(batch, length, 7)
            logits, loss = fast(idx)
            with eo.no_grad():
                expected, _ = model(eo.tensor(idx))
            assert loss is None
            np.testing.assert_allclose(logits.data, expected.data, rtol=1e-5, atol=1e-5)
    with pytest.raises(EveryOShapeError, match=r"needs seq <= 8 .*seq=9"):
        fast(_ids(2, BLOCK_SIZE + 1, 7))  # nanoGPT's assert, checked before ONNX Runtime runs
