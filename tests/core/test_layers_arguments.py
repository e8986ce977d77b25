"""Layer arguments are checked when the layer is built (ValueError naming the
layer and the argument); a window that cannot fit the padded input is an
EveryOShapeError naming the layer and the shapes when it is called."""

import numpy as np
import pytest

import everyo as eo

BAD_ARGUMENTS = [
    (lambda: eo.Conv2D(1, 2, 0), r"Conv2D: kernel_size must be positive, got 0"),
    (lambda: eo.Conv2D(1, 2, (3, 0)), r"Conv2D: kernel_size must be positive"),
    (lambda: eo.Conv2D(1, 2, 3, stride=0), r"Conv2D: stride must be positive, got 0"),
    (lambda: eo.Conv2D(1, 2, 3, padding=-1), r"Conv2D: padding must be non-negative, got -1"),
    (lambda: eo.Conv2D(1, 2, 3, padding=((1, -1), (0, 0))), r"Conv2D: padding must be non-negative"),
    (lambda: eo.Conv2D(1, 2, 3, padding="sme"), r"Conv2D: padding must be one of \['valid', 'same'\]"),
    (lambda: eo.Conv2D(1, 2, 3, padding=(1, 2, 3)), r"Conv2D: cannot understand padding"),
    (lambda: eo.Conv2D(1, 2, 2.5), r"Conv2D: kernel_size must be an int or a tuple of 2 ints, got 2.5"),
    (lambda: eo.Conv2D(0, 2, 3), r"Conv2D: in_channels must be positive"),
    (lambda: eo.Conv2D(1, 2, 3, dilation=0), r"Conv2D: dilation must be positive"),
    (lambda: eo.Conv2D(4, 6, 3, groups=4), r"Conv2D: groups=4 must divide out_channels=6"),
    (lambda: eo.Conv2D(3, 6, 3, groups=2), r"Conv2D: groups=2 must divide in_channels=3"),
    (lambda: eo.Conv2D(3, 6, 3, groups=0), r"Conv2D: groups must be positive"),
    (lambda: eo.Conv1D(2, 2, 0), r"Conv1D: kernel_size must be positive"),
    (lambda: eo.Conv1D(2, 2, 3, padding="full"), r"Conv1D: padding must be one of \['valid', 'same', 'causal'\]"),
    (lambda: eo.Conv1D(2, 2, 3, padding=-2), r"Conv1D: padding must be >= 0"),
    (
        lambda: eo.Conv2DTranspose(2, 2, 3, stride=2, output_padding=2),
        r"Conv2DTranspose: output_padding \(2, 2\) must be smaller",
    ),
    (lambda: eo.Conv2DTranspose(2, 2, 3, stride=0), r"Conv2DTranspose: stride must be positive"),
    (lambda: eo.MaxPool2D(0), r"MaxPool2D: pool_size must be positive, got 0"),
    (lambda: eo.MaxPool2D(2, stride=0), r"MaxPool2D: stride must be positive, got 0"),
    (lambda: eo.AvgPool2D(2, padding="full"), r"AvgPool2D: padding must be one of"),
    (lambda: eo.AvgPool2D(2, padding=2), r"AvgPool2D: padding 2 must be smaller than pool_size"),
    (lambda: eo.MaxPool2D(2, padding=-1), r"MaxPool2D: padding must be non-negative"),
    (lambda: eo.Dropout(1.5), r"Dropout: p must be in \[0, 1\], got 1.5"),
    (lambda: eo.Dropout(-0.1), r"Dropout: p must be in \[0, 1\]"),
    (lambda: eo.Dropout("half"), r"Dropout: p must be in \[0, 1\], got 'half'"),
    (lambda: eo.Linear(0, 3), r"Linear: in_features must be positive, got 0"),
    (lambda: eo.Linear(3, -1), r"Linear: out_features must be positive"),
    (lambda: eo.BatchNorm2D(0), r"BatchNorm2D: num_features must be positive"),
    (lambda: eo.BatchNorm1D(3, eps=0), r"BatchNorm1D: eps must be a positive number"),
    (lambda: eo.BatchNorm1D(3, momentum=1.5), r"BatchNorm1D: momentum must be in \[0, 1\]"),
    (lambda: eo.LayerNorm(4, eps=-1e-5), r"LayerNorm: eps must be a positive number"),
    (lambda: eo.LayerNorm((3, 0)), r"LayerNorm: normalized_shape must be positive"),
    (lambda: eo.GroupNorm(4, 6), r"GroupNorm: num_groups=4 must divide num_channels=6"),
    (lambda: eo.GroupNorm(0, 6), r"GroupNorm: num_groups must be positive"),
    (lambda: eo.UpSampling2D(0), r"UpSampling2D: size must be positive"),
    (lambda: eo.UpSampling2D(2, interpolation="cubic"), r"UpSampling2D: interpolation must be one of"),
    (
        lambda: eo.UpSampling2D(2, align_corners=True),
        r"UpSampling2D: align_corners applies to interpolation='bilinear'",
    ),
    (lambda: eo.GELU(approximate="fast"), r"GELU: approximate must be one of \['none', 'tanh'\]"),
    (lambda: eo.LeakyReLU("steep"), r"LeakyReLU: negative_slope must be a real number"),
    (lambda: eo.Softplus(beta=0), r"Softplus: beta must be a positive number"),
    (lambda: eo.ELU(alpha=float("nan")), r"ELU: alpha must be a real number"),
    (lambda: eo.Flatten(start_axis=1.5), r"Flatten: start_axis must be an int"),
]


@pytest.mark.parametrize("make,message", BAD_ARGUMENTS, ids=[m for _, m in BAD_ARGUMENTS])
def test_bad_argument_is_a_value_error_at_construction(make, message):
    with pytest.raises(ValueError, match=message):
        make()


@pytest.mark.parametrize(
    "layer,shape,message",
    [
        (
            lambda: eo.Conv2D(1, 1, 5),
            (1, 3, 3, 1),
            r"Conv2D\(1, 1, kernel_size=\(5, 5\).*window 5x5 .* padded input 3x3",
        ),
        (lambda: eo.Conv2D(1, 1, 3, dilation=3), (1, 6, 6, 1), r"window 7x7 \(kernel \(3, 3\), dilation \(3, 3\)\)"),
        (lambda: eo.MaxPool2D(4), (2, 3, 8, 1), r"MaxPool2D\(pool_size=\(4, 4\).*input shape \(2, 3, 8, 1\)"),
        (lambda: eo.AvgPool2D(4, padding=1), (1, 1, 1, 2), r"AvgPool2D.*padded input 3x3"),
        (lambda: eo.Conv1D(1, 1, 4), (2, 3, 1), r"Conv1D.*window 1x4"),
    ],
)
def test_window_larger_than_the_padded_input_is_a_shape_error(layer, shape, message):
    with pytest.raises(eo.EveryOShapeError, match=message):
        layer()(eo.ones(*shape))


def test_a_window_that_fits_only_thanks_to_padding_is_accepted():
    assert eo.AvgPool2D(3, stride=1, padding=1)(eo.ones(1, 1, 2, 2)).shape == (1, 1, 2, 2)
    assert eo.Conv2D(1, 1, 5, padding="same")(eo.ones(1, 3, 3, 1)).shape == (1, 3, 3, 1)


def test_functional_ops_name_themselves():
    x, w = eo.ones(1, 4, 4, 2), eo.ones(3, 3, 2, 2)
    with pytest.raises(ValueError, match="conv2d: kernel_size, stride and dilation must be positive"):
        eo.conv2d(x, w, stride=0)
    with pytest.raises(eo.EveryOShapeError, match="max_pool2d: window 5x5"):
        eo.max_pool2d(x, 5)
    with pytest.raises(eo.EveryOShapeError, match=r"conv2d: input \(1, 4, 4, 2\) .* weight \(3, 3, 2, 2\) .* groups=2"):
        eo.conv2d(x, w, groups=2)


def test_bad_arguments_leave_nothing_half_built():
    # a failed construction raises before any parameter is drawn: the same seed gives the same layer after
    with pytest.raises(ValueError):
        eo.Conv2D(2, 3, 3, stride=0, seed=0)
    a, b = eo.Conv2D(2, 3, 3, seed=0), eo.Conv2D(2, 3, 3, seed=0)
    np.testing.assert_array_equal(a.weight.data, b.weight.data)


@pytest.mark.parametrize(
    "make,message",
    [
        (lambda: eo.TransformerEncoderLayer(8, 3), r"TransformerEncoderLayer: num_heads=3 must divide d_model=8"),
        (
            lambda: eo.TransformerEncoderLayer(8, 2, dim_feedforward=0),
            r"TransformerEncoderLayer: dim_feedforward must be positive",
        ),
        (
            lambda: eo.TransformerDecoderLayer(8, 2, dropout=1.0),
            r"TransformerDecoderLayer: dropout must be in \[0, 1\)",
        ),
        (lambda: eo.TransformerEncoderLayer(8, 2, layer_norm_eps=0.0), r"layer_norm_eps must be a positive number"),
        (lambda: eo.TransformerEncoder(0, 8, 2), r"TransformerEncoder: num_layers must be positive"),
    ],
)
def test_transformer_arguments(make, message):
    with pytest.raises(ValueError, match=message):
        make()
