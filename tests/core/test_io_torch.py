"""PyTorch weights into EveryO models: eo.load_torch_state_dict against
outputs recorded from real torch.nn modules (fixtures/make_torch_fixtures.py
made them with torch; this test needs only safetensors)."""

import os

import numpy as np
import pytest

import everyo as eo

pytest.importorskip("safetensors")  # the optional everyo-core[safetensors] extra

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
RECORD = np.load(os.path.join(HERE, "torch_outputs.npz"), allow_pickle=False)


def _weights(name):
    return os.path.join(HERE, f"torch_{name}.safetensors")


def _close(actual, expected):
    np.testing.assert_allclose(actual, expected, rtol=0, atol=1e-6)


def _nhwc(x):
    return x.transpose(0, 2, 3, 1)


def test_mlp_with_batchnorm():
    model = eo.Sequential(eo.Linear(5, 8), eo.BatchNorm1D(8), eo.ReLU(), eo.Linear(8, 3))
    eo.load_torch_state_dict(model, _weights("mlp"))
    model.eval()
    _close(model(RECORD["mlp.input"]).data, RECORD["mlp.output"])
    # BatchNorm's running statistics came across (they are not the fresh 0 / 1)
    assert not np.allclose(model[1].running_mean.data, 0) and not np.allclose(model[1].running_var.data, 1)


def test_cnn_kernels_go_from_oihw_to_hwio():
    model = eo.Sequential(
        eo.Conv2D(3, 4, 3),
        eo.BatchNorm2D(4),
        eo.ReLU(),
        eo.Conv2D(4, 4, 3, padding="same"),
        eo.ReLU(),
        eo.Conv2D(4, 2, 3, stride=2),
    )
    eo.load_torch_state_dict(model, _weights("cnn"))
    model.eval()
    _close(model(_nhwc(RECORD["cnn.input"])).data, _nhwc(RECORD["cnn.output"]))


def test_lstm_two_layers_bidirectional():
    lstm = eo.LSTM(4, 6, num_layers=2, bidirectional=True)
    eo.load_torch_state_dict(lstm, _weights("lstm"))
    out, (h, c) = lstm(RECORD["lstm.input"])
    _close(out.data, RECORD["lstm.output.0"])
    _close(h.data, RECORD["lstm.output.1.0"])
    _close(c.data, RECORD["lstm.output.1.1"])


@pytest.mark.parametrize(
    "name, layer", [("gru", lambda: eo.GRU(4, 5, num_layers=2)), ("rnn", lambda: eo.RNN(4, 5, nonlinearity="relu"))]
)
def test_gru_and_rnn(name, layer):
    model = layer()
    eo.load_torch_state_dict(model, _weights(name))
    out, h = model(RECORD[f"{name}.input"])
    _close(out.data, RECORD[f"{name}.output.0"])
    _close(h.data, RECORD[f"{name}.output.1"])


def test_transformer_encoder_layer():
    layer = eo.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0)
    eo.load_torch_state_dict(layer, _weights("encoder"))
    layer.eval()
    _close(layer(RECORD["encoder.input"]).data, RECORD["encoder.output"])


def test_embedding_and_layernorm():
    model = eo.Sequential(eo.Embedding(10, 4), eo.LayerNorm(4))
    eo.load_torch_state_dict(model, _weights("embed"))
    _close(model(RECORD["embed.input"]).data, RECORD["embed.output"])


def test_missing_unexpected_and_mismatched_keys_are_named():
    wrong = eo.Sequential(eo.Linear(5, 8), eo.ReLU(), eo.Linear(8, 4))  # no BatchNorm, 4 outputs
    before = wrong.state_dict()
    with pytest.raises(eo.EveryOStateDictError) as info:
        eo.load_torch_state_dict(wrong, _weights("mlp"))
    message = str(info.value)
    assert "missing keys ['2.weight', '2.bias']" in message
    assert "unexpected keys ['1.bias', '1.running_mean', '1.running_var', '1.weight', '3.bias', '3.weight']" in message
    assert "torch_mlp.safetensors" in message
    # nothing was copied
    assert all(np.array_equal(v, wrong.state_dict()[k]) for k, v in before.items())


def test_a_shape_mismatch_names_both_layouts():
    model = eo.Sequential(eo.Linear(5, 8), eo.BatchNorm1D(8), eo.ReLU(), eo.Linear(8, 3))
    with pytest.raises(eo.EveryOStateDictError, match=r"0\.weight: Linear expects \(5, 8\), the file has \(8, 5\)"):
        eo.load_torch_state_dict(model, _weights("mlp"), transpose_linear=False)


def test_non_strict_loading_fills_what_matches():
    model = eo.Sequential(eo.Linear(5, 8), eo.BatchNorm1D(8))
    eo.load_torch_state_dict(model, _weights("mlp"), strict=False)
    from safetensors.numpy import load_file

    assert np.array_equal(model[0].weight.data, load_file(_weights("mlp"))["0.weight"].T)


def test_a_mapping_of_arrays_is_accepted():
    from safetensors.numpy import load_file

    tensors = load_file(_weights("embed"))
    model = eo.Sequential(eo.Embedding(10, 4), eo.LayerNorm(4))
    eo.load_torch_state_dict(model, tensors)
    _close(model(RECORD["embed.input"]).data, RECORD["embed.output"])


def test_fixtures_are_small():
    assert sum(os.path.getsize(os.path.join(HERE, f)) for f in os.listdir(HERE)) < 200_000


def test_transpose_linear_false_reads_everyo_layout(tmp_path):
    # A file in EveryO's own (in, out) layout, e.g. written by eo.save from an EveryO model.
    source = eo.Sequential(eo.Linear(5, 8, seed=0), eo.ReLU(), eo.Linear(8, 3, seed=1))
    eo.save(source.state_dict(), tmp_path / "everyo.safetensors")
    target = eo.Sequential(eo.Linear(5, 8, seed=2), eo.ReLU(), eo.Linear(8, 3, seed=3))
    eo.load_torch_state_dict(target, tmp_path / "everyo.safetensors", transpose_linear=False)
    x = RECORD["mlp.input"]
    assert np.array_equal(target(x).data, source(x).data)
