"""examples/from_pytorch/nanogpt/model.py (nanoGPT's GPT, ported) exports as written: dynamic
batch and sequence, ONNX Runtime gives the port's logits, and the tied table is one initializer.
(tests/onnx/test_onnx_nanogpt.py exports a copy of the same structure in more ways.)"""

import importlib.util
import os

import numpy as np
import onnx

import everyo as eo

MODEL = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "from_pytorch", "nanogpt", "model.py")


def test_the_ported_gpt_exports_and_runs_in_onnx_runtime(tmp_path):
    spec = importlib.util.spec_from_file_location("from_pytorch_nanogpt_model", MODEL)
    port = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(port)
    eo.manual_seed(0)
    config = port.GPTConfig(block_size=12, vocab_size=26, n_layer=2, n_head=2, n_embd=32, dropout=0.1, bias=False)
    model = port.GPT(config).eval()
    path = tmp_path / "gpt.onnx"
    rng = np.random.default_rng(1)
    eo.export_onnx(
        model,
        path,
        example_input=rng.integers(0, 26, (2, 5)),
        input_names=["idx"],
        output_names=["logits"],
        dynamic_axes={"idx": {0: "batch", 1: "seq"}},
        verify=True,
    )
    for batch, length in [(1, 1), (3, 7), (2, 12)]:
        idx = rng.integers(0, 26, (batch, length))
        with eo.no_grad():
            expected, _ = model(eo.tensor(idx))
        actual, no_loss = eo.run_onnx(path, idx)
        assert no_loss is None and actual.shape == (batch, 1, 26)
        np.testing.assert_allclose(actual, expected.data, rtol=1e-5, atol=1e-5)
    tables = [i for i in onnx.load(str(path)).graph.initializer if tuple(i.dims) == (26, 32)]
    assert len(tables) == 1  # wte and lm_head share one initializer
