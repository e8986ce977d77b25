"""Every supported layer, alone and in realistic stacks: ONNX Runtime's output
against EveryO's eval-mode output at batch sizes 1 and 7, to 1e-5."""

import pytest
from onnx_agreement import assert_agrees, digit_cnn, randomize_norms

import everyo as eo
from everyo.padding import resolve_padding2d

# (id, layer factory, input_shape). Spatial sizes are odd and non-square and
# channel counts differ from them, so a wrong axis order cannot pass by symmetry.
SINGLE_LAYERS = [
    ("linear", lambda: eo.Linear(5, 3, seed=0), (1, 5)),
    ("linear_rank3", lambda: eo.Linear(5, 3, seed=1), (1, 4, 5)),
    ("linear_rank4_no_bias", lambda: eo.Linear(5, 3, bias=False, seed=2), (1, 2, 3, 5)),
    ("conv_valid", lambda: eo.Conv2D(3, 4, 3, seed=3), (1, 7, 9, 3)),
    ("conv_same", lambda: eo.Conv2D(3, 4, 3, padding="same", seed=4), (1, 7, 9, 3)),
    ("conv_rect_kernel_stride", lambda: eo.Conv2D(2, 5, (3, 2), stride=(2, 1), padding="same", seed=5), (1, 7, 9, 2)),
    ("conv_no_bias", lambda: eo.Conv2D(3, 2, 2, bias=False, seed=6), (1, 6, 5, 3)),
    ("conv_explicit_padding", lambda: eo.Conv2D(3, 2, 3, padding=1, seed=7), (1, 6, 5, 3)),
    ("maxpool", lambda: eo.MaxPool2D(2), (1, 6, 8, 3)),
    ("maxpool_same", lambda: eo.MaxPool2D(3, stride=2, padding="same"), (1, 7, 9, 3)),
    ("avgpool", lambda: eo.AvgPool2D(2), (1, 6, 8, 3)),
    ("avgpool_same", lambda: eo.AvgPool2D(3, stride=1, padding="same"), (1, 7, 9, 3)),
    ("maxpool_explicit_padding", lambda: eo.MaxPool2D(3, stride=2, padding=1), (1, 7, 8, 2)),
    ("avgpool_explicit_padding", lambda: eo.AvgPool2D(3, stride=2, padding=((0, 2), (1, 0))), (1, 7, 8, 2)),
    # count_include_pad: PyTorch's default for numeric padding, Keras' for 'same', and both overridden.
    ("avgpool_pad_counted", lambda: eo.AvgPool2D(3, stride=2, padding=1), (1, 7, 8, 2)),
    ("avgpool_pad_not_counted", lambda: eo.AvgPool2D(3, stride=2, padding=1, count_include_pad=False), (1, 7, 8, 2)),
    (
        "avgpool_same_pad_counted",
        lambda: eo.AvgPool2D(3, stride=2, padding="same", count_include_pad=True),
        (1, 7, 8, 2),
    ),
    ("flatten_nhwc", lambda: eo.Flatten(), (1, 3, 4, 2)),
    ("flatten_2d", lambda: eo.Flatten(), (1, 6)),
    ("dropout", lambda: eo.Dropout(0.5, seed=0), (1, 4, 6)),
    ("batchnorm1d", lambda: eo.BatchNorm1D(6), (1, 6)),
    ("batchnorm1d_sequence", lambda: eo.BatchNorm1D(6), (1, 5, 6)),
    ("batchnorm1d_no_affine", lambda: eo.BatchNorm1D(6, affine=False), (1, 6)),
    ("batchnorm2d", lambda: eo.BatchNorm2D(3, eps=1e-3), (1, 4, 5, 3)),
    ("layernorm", lambda: eo.LayerNorm(6), (1, 6)),
    ("layernorm_2_axes", lambda: eo.LayerNorm((4, 6)), (1, 3, 4, 6)),
    ("layernorm_no_affine", lambda: eo.LayerNorm(6, elementwise_affine=False), (1, 5, 6)),
    ("relu", lambda: eo.ReLU(), (1, 3, 5)),
    ("sigmoid", lambda: eo.Sigmoid(), (1, 3, 5)),
    ("tanh", lambda: eo.Tanh(), (1, 3, 5)),
    ("softmax", lambda: eo.Softmax(), (1, 3, 5)),
    ("softmax_axis1", lambda: eo.Softmax(axis=1), (1, 3, 5)),
    ("logsoftmax", lambda: eo.LogSoftmax(), (1, 3, 5)),
    ("logsoftmax_axis_minus2", lambda: eo.LogSoftmax(axis=-2), (1, 4, 3, 5)),
]


@pytest.mark.parametrize("factory, input_shape", [c[1:] for c in SINGLE_LAYERS], ids=[c[0] for c in SINGLE_LAYERS])
def test_single_layer_agrees_with_runtime(factory, input_shape, tmp_path):
    model = randomize_norms(factory(), input_shape)
    assert_agrees(model, input_shape, tmp_path / "layer.onnx")


def test_single_layers_cover_every_layer_the_0_1_exporter_supported():
    # The tracer replaced 0.1's per-layer converters; each of their layers is still checked here.
    layers_0_1 = {
        eo.Linear,
        eo.Conv2D,
        eo.MaxPool2D,
        eo.AvgPool2D,
        eo.Flatten,
        eo.Dropout,
        eo.BatchNorm1D,
        eo.BatchNorm2D,
        eo.LayerNorm,
        eo.ReLU,
        eo.Sigmoid,
        eo.Tanh,
        eo.Softmax,
        eo.LogSoftmax,
    }
    covered = {type(factory()) for _, factory, _ in SINGLE_LAYERS}
    assert covered == layers_0_1, layers_0_1 - covered


@pytest.mark.parametrize("kernel", [2, 3, 5])
@pytest.mark.parametrize("layer", ["conv", "maxpool", "avgpool"])
def test_same_padding_odd_sizes_stride_2(layer, kernel, tmp_path):
    # 7x9 with stride 2 makes TensorFlow's rule pad asymmetrically for every
    # kernel here (the odd pixel at the bottom/right), where auto_pad would not.
    input_shape = (1, 7, 9, 3)
    model = {
        "conv": lambda: eo.Conv2D(3, 4, kernel, stride=2, padding="same", seed=kernel),
        "maxpool": lambda: eo.MaxPool2D(kernel, stride=2, padding="same"),
        "avgpool": lambda: eo.AvgPool2D(kernel, stride=2, padding="same"),
    }[layer]()
    proto = assert_agrees(model, input_shape, tmp_path / "same.onnx")
    (top, bottom), (left, right) = resolve_padding2d("same", (7, 9), (kernel, kernel), (2, 2))
    window = [n for n in proto.graph.node if n.op_type in ("Conv", "MaxPool", "AveragePool")]
    assert len(window) == 1
    pads = {a.name: list(a.ints) for a in window[0].attribute}["pads"]
    assert pads == [top, left, bottom, right]


def test_same_padding_matches_hand_worked_tensorflow_rule():
    # Independent of the resolver's code: 7 rows, kernel 2, stride 2 -> 4 outputs,
    # total padding (4-1)*2 + 2 - 7 = 1, all of it at the end. 9 columns,
    # kernel 5, stride 2 -> 5 outputs, total (5-1)*2 + 5 - 9 = 4, split 2 / 2.
    assert resolve_padding2d("same", (7, 9), (2, 5), (2, 2)) == ((0, 1), (2, 2))


STACKS = [
    ("digit_cnn", digit_cnn, (1, 8, 8, 1)),
    (
        "nested_sequential",
        lambda: eo.Sequential(
            eo.Sequential(
                eo.Conv2D(3, 4, 5, stride=2, padding="same", seed=0), eo.Sequential(eo.BatchNorm2D(4), eo.ReLU())
            ),
            eo.MaxPool2D(3, stride=2, padding="same"),
            eo.Sequential(eo.Flatten(), eo.Linear(48, 5, seed=1), eo.Sigmoid()),
        ),
        (1, 11, 13, 3),
    ),
    (
        "mlp_bn_dropout_softmax",
        lambda: eo.Sequential(
            eo.Linear(20, 64, seed=0),
            eo.BatchNorm1D(64),
            eo.ReLU(),
            eo.Dropout(0.5, seed=1),
            eo.Linear(64, 32, seed=2),
            eo.Tanh(),
            eo.Linear(32, 4, seed=3),
            eo.Softmax(),
        ),
        (1, 20),
    ),
    (
        "sequence_features",
        lambda: eo.Sequential(
            eo.Linear(6, 8, seed=0),
            eo.BatchNorm1D(8),
            eo.LayerNorm(8),
            eo.ReLU(),
            eo.Linear(8, 3, seed=1),
            eo.LogSoftmax(axis=-1),
        ),
        (1, 5, 6),
    ),
    (
        "conv_valid_stack",
        lambda: eo.Sequential(
            eo.Conv2D(2, 6, (2, 3), seed=0),
            eo.Tanh(),
            eo.AvgPool2D((2, 1)),
            eo.Conv2D(6, 3, 2, stride=2, seed=1),
            eo.BatchNorm2D(3),
            eo.Sigmoid(),
            eo.Flatten(),
        ),
        (1, 9, 10, 2),
    ),
]


@pytest.mark.parametrize("factory, input_shape", [s[1:] for s in STACKS], ids=[s[0] for s in STACKS])
def test_stack_agrees_with_runtime(factory, input_shape, tmp_path):
    model = randomize_norms(factory(), input_shape)
    assert_agrees(model, input_shape, tmp_path / "stack.onnx")


@pytest.mark.parametrize("which", ["default", "newest", "oldest"])
def test_digit_cnn_at_each_opset(which, newest_runtime_opset, tmp_path):
    from everyo.onnx import DEFAULT_OPSET

    opset = {"default": None, "newest": newest_runtime_opset, "oldest": 17}[which]
    model = randomize_norms(digit_cnn(), (1, 8, 8, 1))
    proto = assert_agrees(model, (1, 8, 8, 1), tmp_path / "cnn.onnx", opset=opset)
    assert [o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")] == [opset or DEFAULT_OPSET]


@pytest.mark.parametrize("opset", [13, 16])
def test_opsets_before_layer_norm_work_without_it(opset, tmp_path):
    model = eo.Sequential(
        eo.Conv2D(1, 4, 3, padding="same", seed=0),
        eo.BatchNorm2D(4),
        eo.ReLU(),
        eo.AvgPool2D(2, padding="same"),
        eo.Flatten(),
        eo.Linear(64, 10, seed=1),
        eo.Softmax(),
    )
    randomize_norms(model, (1, 7, 7, 1))
    assert_agrees(model, (1, 7, 7, 1), tmp_path / "old.onnx", opset=opset)
