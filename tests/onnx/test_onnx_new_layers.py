"""The layers of 0.2 (activations, Conv1D, dilated/grouped Conv2D,
Conv2DTranspose, UpSampling2D, GroupNorm, global pooling, Identity), alone
and in small models: ONNX Runtime against EveryO's eval-mode output at batch
sizes 1 and 7, to 1e-5."""

import numpy as np
import pytest
from onnx_agreement import assert_agrees, assert_traced_agrees

import everyo as eo
from everyo.errors import EveryOSerializationError


class Scaled(eo.Module):
    """Wraps an activation and spreads its input over [-8, 8] (and past
    softplus's threshold), so both branches of each piecewise form are used."""

    def __init__(self, layer, scale=4.0):
        super().__init__()
        self.layer, self.scale = layer, scale

    def forward(self, x):
        return self.layer(x * self.scale)


def _group_norm():
    m = eo.GroupNorm(2, 6)
    rng = np.random.default_rng(0)
    m.weight.data = (1 + 0.5 * rng.standard_normal(6)).astype(np.float32)
    m.bias.data = (0.5 * rng.standard_normal(6)).astype(np.float32)
    return m


LAYERS = [
    ("gelu_exact", lambda: Scaled(eo.GELU()), (1, 3, 5)),
    ("gelu_tanh", lambda: Scaled(eo.GELU(approximate="tanh")), (1, 3, 5)),
    ("silu", lambda: Scaled(eo.SiLU()), (1, 3, 5)),
    ("leaky_relu", lambda: Scaled(eo.LeakyReLU(0.2)), (1, 3, 5)),
    ("elu", lambda: Scaled(eo.ELU(0.7)), (1, 3, 5)),
    ("softplus", lambda: Scaled(eo.Softplus(), scale=10.0), (1, 3, 5)),
    ("softplus_beta", lambda: Scaled(eo.Softplus(beta=2.0, threshold=5.0)), (1, 3, 5)),
    ("conv1d_valid", lambda: eo.Conv1D(3, 4, 3, seed=0), (1, 9, 3)),
    ("conv1d_same_stride", lambda: eo.Conv1D(3, 4, 4, stride=2, padding="same", seed=1), (1, 9, 3)),
    ("conv1d_dilation_causal", lambda: eo.Conv1D(3, 4, 3, padding="causal", dilation=2, seed=2), (1, 11, 3)),
    ("conv1d_groups", lambda: eo.Conv1D(4, 6, 3, padding=1, groups=2, bias=False, seed=3), (1, 8, 4)),
    ("conv2d_dilation", lambda: eo.Conv2D(3, 4, 3, padding="same", dilation=2, seed=4), (1, 9, 11, 3)),
    ("conv2d_groups", lambda: eo.Conv2D(4, 6, 3, groups=2, seed=5), (1, 7, 9, 4)),
    ("conv2d_depthwise", lambda: eo.Conv2D(3, 6, 3, padding="same", groups=3, seed=6), (1, 7, 9, 3)),
    ("conv_transpose_valid", lambda: eo.Conv2DTranspose(3, 4, 3, seed=7), (1, 5, 6, 3)),
    (
        "conv_transpose_same_stride2",
        lambda: eo.Conv2DTranspose(3, 4, 3, stride=2, padding="same", seed=8),
        (1, 5, 6, 3),
    ),
    (
        "conv_transpose_narrow_window",
        lambda: eo.Conv2DTranspose(2, 3, 2, stride=3, padding="same", seed=9),
        (1, 4, 5, 2),
    ),
    (
        "conv_transpose_crops_output_padding",
        lambda: eo.Conv2DTranspose(2, 3, 3, stride=2, padding=1, output_padding=1, dilation=1, seed=10),
        (1, 4, 5, 2),
    ),
    ("conv_transpose_dilation", lambda: eo.Conv2DTranspose(2, 3, 3, dilation=2, bias=False, seed=11), (1, 4, 5, 2)),
    ("upsample_nearest", lambda: eo.UpSampling2D((2, 3)), (1, 3, 4, 2)),
    ("upsample_bilinear", lambda: eo.UpSampling2D((2, 3), interpolation="bilinear"), (1, 3, 4, 2)),
    (
        "upsample_bilinear_align_corners",
        lambda: eo.UpSampling2D(3, interpolation="bilinear", align_corners=True),
        (1, 3, 4, 2),
    ),
    ("group_norm", _group_norm, (1, 4, 5, 6)),
    ("global_avg_pool", lambda: eo.GlobalAveragePooling2D(), (1, 4, 5, 3)),
    ("global_max_pool", lambda: eo.GlobalMaxPooling2D(), (1, 4, 5, 3)),
    ("identity", lambda: eo.Identity(), (1, 4, 5)),
]


@pytest.mark.parametrize("factory, input_shape", [c[1:] for c in LAYERS], ids=[c[0] for c in LAYERS])
def test_new_layer_agrees_with_runtime(factory, input_shape, tmp_path):
    assert_agrees(factory(), input_shape, tmp_path / "layer.onnx")


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_as_onnx_gelu_at_opset_20(approximate, tmp_path):
    proto = assert_agrees(Scaled(eo.GELU(approximate=approximate)), (1, 3, 5), tmp_path / "g.onnx", opset=20)
    assert [n.op_type for n in proto.graph.node].count("Gelu") == 1


@pytest.mark.parametrize("opset", [13, 17, 20])
def test_upsampling_decoder_model(opset, tmp_path):
    model = eo.Sequential(
        eo.Conv2D(3, 6, 3, padding="same", groups=3, seed=0),
        _group_norm(),
        eo.SiLU(),
        eo.Conv2DTranspose(6, 4, 3, stride=2, padding="same", seed=1),
        eo.LeakyReLU(0.1),
        eo.UpSampling2D(2, interpolation="bilinear"),
        eo.Conv2D(4, 4, 3, dilation=2, seed=2),
        eo.ELU(),
        eo.UpSampling2D(2),
        eo.GELU(),
        eo.GlobalAveragePooling2D(),
        eo.Identity(),
        eo.Linear(4, 3, seed=3),
        eo.Softplus(),
    )
    assert_agrees(model, (1, 5, 6, 3), tmp_path / "decoder.onnx", opset=opset)


@pytest.mark.parametrize("opset", [13, 17])
def test_conv1d_sequence_model(opset, tmp_path):
    model = eo.Sequential(
        eo.Conv1D(3, 8, 3, padding="causal", dilation=2, seed=0),
        eo.GELU(approximate="tanh"),
        eo.Conv1D(8, 8, 3, padding="same", groups=4, seed=1),
        eo.SiLU(),
        eo.Conv1D(8, 4, 2, stride=2, seed=2),
        eo.Flatten(),
        eo.Linear(20, 3, seed=3),
    )
    assert_agrees(model, (1, 11, 3), tmp_path / "seq.onnx", opset=opset)


def test_chained_conv1d_cancels_inner_transposes(tmp_path):
    model = eo.Sequential(eo.Conv1D(3, 4, 3, seed=0), eo.LeakyReLU(), eo.Conv1D(4, 2, 3, seed=1))
    proto = assert_agrees(model, (1, 9, 3), tmp_path / "c.onnx")
    assert [n.op_type for n in proto.graph.node].count("Transpose") == 2


class PaddedGRU(eo.Module):
    """lengths computed inside the model: it would be baked into the file."""

    def __init__(self):
        super().__init__()
        self.gru = eo.GRU(3, 4, seed=0)

    def forward(self, x):
        out, _ = self.gru(x, lengths=np.full(x.shape[0], x.shape[1] - 1))
        return out


def test_recurrent_lengths_not_from_an_input_are_refused(tmp_path):
    path = tmp_path / "padded.onnx"
    with pytest.raises(EveryOSerializationError, match=r"gru_scan.*lengths= that is not one of the model's inputs"):
        eo.export_onnx(PaddedGRU(), path, input_shape=(1, 5, 3))
    assert not path.exists()


class WithLengths(eo.Module):
    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, x, lengths):
        out, last = self.layer(x, lengths=lengths)
        return out, (last[0] if isinstance(last, tuple) else last)


def _padded(batch, time):
    # Every length from 0 to time appears at batch 7 (zeros past each length,
    # each sequence's own last state, reverse runs from each own end).
    rng = np.random.default_rng(batch * 10 + time)
    lengths = np.resize(np.array([time, 0, 1, time - 1, 2, time, 3], np.int64), batch)
    return rng.standard_normal((batch, time, 3)).astype(np.float32), lengths


@pytest.mark.parametrize("kind", ["rnn", "lstm", "gru", "bilstm", "bigru_2_layers"])
def test_recurrent_lengths_become_sequence_lens(kind, tmp_path):
    layer = {
        "rnn": lambda: eo.RNN(3, 4, seed=0),
        "lstm": lambda: eo.LSTM(3, 4, seed=1),
        "gru": lambda: eo.GRU(3, 4, seed=2),
        "bilstm": lambda: eo.LSTM(3, 4, bidirectional=True, seed=3),
        "bigru_2_layers": lambda: eo.GRU(3, 4, num_layers=2, bidirectional=True, seed=4),
    }[kind]()
    proto = assert_traced_agrees(
        WithLengths(layer),
        _padded,
        tmp_path / "lengths.onnx",
        sizes=[(7, 5), (1, 5), (7, 6)],
        dynamic_axes={"input0": {0: "batch", 1: "time"}, "input1": {0: "batch"}},
    )
    scans = [n for n in proto.graph.node if n.op_type in ("RNN", "LSTM", "GRU")]
    assert scans and all(len(n.input) > 4 and n.input[4] for n in scans)
