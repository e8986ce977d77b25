"""examples/from_pytorch/word_language_model exports its trained, tied LSTM model with
--onnx-export as the original does; ONNX Runtime gives the model's outputs, and the tied table
is one initializer."""

import os
import sys

import numpy as np
import onnx

import everyo as eo

sys.path.append(os.path.join(os.path.dirname(__file__), "..", "core"))  # word_lm_port, shared with tests/core
from word_lm_port import run_main  # noqa: E402


def test_the_port_exports_what_it_trained(tmp_path, capsys):
    path = tmp_path / "lm.onnx"
    g = run_main(
        tmp_path,
        "--epochs",
        "1",
        "--emsize",
        "16",
        "--nhid",
        "16",
        "--tied",
        "--bptt",
        "6",
        "--batch_size",
        "8",
        "--log-interval",
        "10",
        "--onnx-export",
        str(path),
    )
    assert "exported in ONNX format" in capsys.readouterr().out
    model = g["model"].eval()
    ids = np.random.default_rng(0).integers(0, len(g["corpus"].dictionary), (6, 1)).astype(np.int64)
    hidden = model.init_hidden(1)
    with eo.no_grad():
        expected, (h, c) = model(ids, hidden)
    logits, (got_h, got_c) = eo.run_onnx(str(path), ids, hidden[0].data, hidden[1].data)  # forward()'s nesting
    for a, e in zip((logits, got_h, got_c), (expected, h, c)):
        np.testing.assert_allclose(a, e.data, atol=1e-5)
    table = model.encoder.weight.data.shape
    assert [tuple(i.dims) for i in onnx.load(str(path)).graph.initializer].count(table) == 1
