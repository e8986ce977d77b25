"""One converter per supported layer, in one table.

A converter takes ``(graph, layer, value, shape, where)``: the graph being
built, the EveryO layer, the name of the ONNX value holding its (channels-last)
input, that input's shape with ``None`` for the symbolic batch axis, and the
layer's position (``model[2][0]``). It returns the output value and shape.
Shapes are tracked here so that 'same' padding can be resolved from the real
spatial size and so that a wrong ``input_shape`` fails with the layer named.
"""
import numpy as np

import everyo.nn as nn
from everyo.errors import EveryOSerializationError, EveryOShapeError
from everyo.padding import output_size, resolve_padding2d

from everyo.onnx.graph import TO_NCHW, TO_NHWC

# LayerNormalization entered the default ONNX domain in opset 17.
LAYER_NORM_MIN_OPSET = 17


def _shape_error(layer, where, shape, expected):
    shown = ("batch",) + tuple(shape[1:])
    return EveryOShapeError(
        f"{type(layer).__name__} at {where} expected {expected}, but the input reaching it has shape "
        f"{shown} (from input_shape); check input_shape and the layers before it"
    )


def _need_rank(layer, where, shape, ranks, expected):
    if len(shape) not in ranks:
        raise _shape_error(layer, where, shape, expected)


def _need_last(layer, where, shape, size, expected):
    if shape[-1] != size:
        raise _shape_error(layer, where, shape, expected)


def _array(tensor):
    return np.asarray(tensor.data)


# --- dense and containers ---------------------------------------------------
def linear(g, layer, x, shape, where):
    _need_last(layer, where, shape, layer.in_features, f"input of shape (..., {layer.in_features})")
    # MatMul broadcasts over any leading axes, like core's linear; Gemm would
    # only take rank-2 input.
    y = g.node("MatMul", [x, g.weight(f"{where}.weight", _array(layer.weight))], where)
    if layer.bias is not None:
        y = g.node("Add", [y, g.weight(f"{where}.bias", _array(layer.bias))], where)
    return y, shape[:-1] + (layer.out_features,)


def flatten(g, layer, x, shape, where):
    # Flatten(axis=1) is C-order over the channels-last tensor, exactly core's
    # reshape of NHWC (N, H, W, C) -> (N, H*W*C).
    rest = int(np.prod(shape[1:], dtype=np.int64))
    return g.node("Flatten", [x], where, axis=1), (None, rest)


def dropout(g, layer, x, shape, where):
    # The exported graph is for inference, where dropout is the identity.
    return g.node("Identity", [x], where), shape


# --- convolution and pooling (NHWC around an NCHW node) -----------------------
def _window_geometry(layer, where, shape, kernel, stride, padding):
    _need_rank(layer, where, shape, (4,), "NHWC input (batch, height, width, channels)")
    (top, bottom), (left, right) = resolve_padding2d(padding, shape[1:3], kernel, stride)
    oh = output_size(shape[1], kernel[0], stride[0], top, bottom)
    ow = output_size(shape[2], kernel[1], stride[1], left, right)
    if oh <= 0 or ow <= 0:
        raise _shape_error(layer, where, shape, f"a spatial size the window {kernel} with stride {stride} fits")
    # ONNX orders pads as [x1_begin, x2_begin, x1_end, x2_end]; explicit, never
    # auto_pad, because TensorFlow's 'same' puts the odd pixel at the end.
    attrs = dict(kernel_shape=list(kernel), strides=list(stride), pads=[top, left, bottom, right])
    return attrs, (oh, ow)


def conv2d(g, layer, x, shape, where):
    attrs, (oh, ow) = _window_geometry(layer, where, shape, layer.kernel_size, layer.stride, layer.padding)
    _need_last(layer, where, shape, layer.in_channels, f"NHWC input with {layer.in_channels} channels")
    # EveryO stores kernels (kh, kw, in, out); ONNX wants (out, in, kh, kw).
    inputs = [g.transpose(x, TO_NCHW, where), g.weight(f"{where}.weight", _array(layer.weight).transpose(3, 2, 0, 1))]
    if layer.bias is not None:
        inputs.append(g.weight(f"{where}.bias", _array(layer.bias)))
    y = g.node("Conv", inputs, where, **attrs)
    return g.transpose(y, TO_NHWC, where), (None, oh, ow, layer.out_channels)


def _pool(op_type, **extra):
    def convert(g, layer, x, shape, where):
        attrs, (oh, ow) = _window_geometry(layer, where, shape, layer.pool_size, layer.stride, layer.padding)
        y = g.node(op_type, [g.transpose(x, TO_NCHW, where)], where, **attrs, **extra)
        return g.transpose(y, TO_NHWC, where), (None, oh, ow, shape[3])

    return convert


# MaxPool ignores padded cells (core pads with -inf); AveragePool must not count
# them either, which is core's (and TensorFlow's) 'same' rule.
max_pool2d = _pool("MaxPool")
avg_pool2d = _pool("AveragePool", count_include_pad=0)


# --- normalisation --------------------------------------------------------------
def batch_norm(g, layer, x, shape, where):
    # track_running_stats=False was refused before building (see plan.py).
    expected = "input (batch, C) or (batch, L, C)" if isinstance(layer, nn.BatchNorm1D) else "NHWC input"
    _need_rank(layer, where, shape, layer._ranks, expected)
    _need_last(layer, where, shape, layer.num_features, f"{layer.num_features} channels on the last axis")
    # Fold (x - mean) / sqrt(var + eps) * gamma + beta into x * scale + shift,
    # computed in float64 so that the folding adds no rounding of its own.
    mean = _array(layer.running_mean).astype(np.float64)
    var = _array(layer.running_var).astype(np.float64)
    gamma = _array(layer.weight).astype(np.float64) if layer.weight is not None else 1.0
    beta = _array(layer.bias).astype(np.float64) if layer.bias is not None else 0.0
    scale = gamma / np.sqrt(var + layer.eps)
    shift = beta - mean * scale
    # Channels are last, so (C,) vectors broadcast onto the channel axis at any rank.
    y = g.node("Mul", [x, g.weight(f"{where}.scale", scale)], where)
    return g.node("Add", [y, g.weight(f"{where}.shift", shift)], where), shape


def layer_norm(g, layer, x, shape, where):
    k = len(layer.normalized_shape)
    if len(shape) <= k or tuple(shape[-k:]) != layer.normalized_shape:
        raise _shape_error(layer, where, shape, f"input whose last {k} dimension(s) are {layer.normalized_shape}")
    if g.opset < LAYER_NORM_MIN_OPSET:
        raise EveryOSerializationError(
            f"LayerNorm at {where} needs ONNX opset {LAYER_NORM_MIN_OPSET} or later "
            f"(LayerNormalization); export with opset>={LAYER_NORM_MIN_OPSET}, not {g.opset}"
        )
    n = layer.normalized_shape
    scale = _array(layer.weight) if layer.weight is not None else np.ones(n, np.float32)
    bias = _array(layer.bias) if layer.bias is not None else np.zeros(n, np.float32)
    y = g.node("LayerNormalization", [x, g.weight(f"{where}.weight", scale), g.weight(f"{where}.bias", bias)],
               where, axis=-k, epsilon=layer.eps)
    return y, shape


# --- activations ------------------------------------------------------------------
def _elementwise(op_type):
    def convert(g, layer, x, shape, where):
        return g.node(op_type, [x], where), shape

    return convert


def _softmax(op_type):
    def convert(g, layer, x, shape, where):
        if not -len(shape) <= layer.axis < len(shape):
            raise _shape_error(layer, where, shape, f"an input with an axis {layer.axis}")
        # Opset 13+ Softmax normalises along exactly this one axis, like core.
        return g.node(op_type, [x], where, axis=int(layer.axis)), shape

    return convert


# Exact types only: a subclass may override forward(), and exporting the
# parent's maths for it would be silently wrong.
CONVERTERS = {
    nn.Linear: linear,
    nn.Conv2D: conv2d,
    nn.MaxPool2D: max_pool2d,
    nn.AvgPool2D: avg_pool2d,
    nn.Flatten: flatten,
    nn.Dropout: dropout,
    nn.BatchNorm1D: batch_norm,
    nn.BatchNorm2D: batch_norm,
    nn.LayerNorm: layer_norm,
    nn.ReLU: _elementwise("Relu"),
    nn.Sigmoid: _elementwise("Sigmoid"),
    nn.Tanh: _elementwise("Tanh"),
    nn.Softmax: _softmax("Softmax"),
    nn.LogSoftmax: _softmax("LogSoftmax"),
}
