"""Rules for the activations, 1-D and transposed convolutions and up-sampling
added to core's op table in 0.2 (their own file for size; one table).

Also the fused normalisation op behind BatchNorm, LayerNorm and GroupNorm.

Each rule writes the op with standard ONNX ops valid from opset 13, step for
step as core computes it, so ONNX Runtime agrees to float32 rounding.
"""

from __future__ import annotations

import numpy as np

from everyo.onnx.graph import TO_NCHW, TO_NHWC
from everyo.onnx.registry import rule

_SQRT_2_OVER_PI = float(np.sqrt(2.0 / np.pi))
_INV_SQRT_2 = float(1.0 / np.sqrt(2.0))


def _x(t, node):
    return t.name(node.inputs[0], np.float32, 0)


def _c(t, value, base):
    return t.g.scalar(value, np.float32, base)


@rule("gelu")
def gelu(t, node):
    g, x = t.g, _x(t, node)
    approximate = node.attrs.get("approximate", "none")
    if g.opset >= 20:
        t.set(node.outputs[0], g.node("Gelu", [x], approximate=approximate))
        return
    if approximate == "tanh":
        # Core: x * sigmoid(2 sqrt(2/pi) (x + 0.044715 x^3)), which is 0.5 x (1 + tanh(u)).
        cube = g.node("Mul", [g.node("Mul", [x, x]), x])
        inner = g.node("Add", [x, g.node("Mul", [cube, _c(t, 0.044715, "gelu_c")])])
        s = g.node("Sigmoid", [g.node("Mul", [inner, _c(t, 2 * _SQRT_2_OVER_PI, "gelu_k")])])
        t.set(node.outputs[0], g.node("Mul", [x, s]))
        return
    # Exact: x * Phi(x), Phi(x) = 0.5 (1 + erf(x / sqrt 2)).
    erf = g.node("Erf", [g.node("Mul", [x, _c(t, _INV_SQRT_2, "inv_sqrt2")])])
    cdf = g.node("Mul", [g.node("Add", [erf, _c(t, 1.0, "one")]), _c(t, 0.5, "half")])
    t.set(node.outputs[0], g.node("Mul", [x, cdf]))


@rule("silu")
def silu(t, node):
    x = _x(t, node)
    t.set(node.outputs[0], t.g.node("Mul", [x, t.g.node("Sigmoid", [x])]))


@rule("leaky_relu")
def leaky_relu(t, node):
    t.set(node.outputs[0], t.g.node("LeakyRelu", [_x(t, node)], alpha=float(node.attrs.get("negative_slope", 0.01))))


@rule("elu")
def elu(t, node):
    t.set(node.outputs[0], t.g.node("Elu", [_x(t, node)], alpha=float(node.attrs.get("alpha", 1.0))))


@rule("softplus")
def softplus(t, node):
    # Core: where(beta x > threshold, x, softplus(beta x) / beta).
    g, x = t.g, _x(t, node)
    beta, threshold = float(node.attrs.get("beta", 1.0)), float(node.attrs.get("threshold", 20.0))
    bx = x if beta == 1.0 else g.node("Mul", [x, _c(t, beta, "beta")])
    smooth = g.node("Softplus", [bx])
    if beta != 1.0:
        smooth = g.node("Div", [smooth, _c(t, beta, "beta")])
    linear = g.node("Greater", [bx, _c(t, threshold, "threshold")])
    t.set(node.outputs[0], g.node("Where", [linear, x, smooth]))


def _weight(t, w, perm):
    if w.kind == "const":
        return t.g.constant(np.asarray(w.data, np.float32).transpose(perm), (w.name or "weight"))
    return t.g.transpose(t.name(w, np.float32, 1), perm)


@rule("conv1d")
def conv1d(t, node):
    x, w, b = node.inputs
    a = node.attrs
    # EveryO: x (N, L, C), weight (k, C // groups, O); ONNX Conv: (N, C, L) and (O, C // groups, k).
    inputs = [t.g.transpose(t.name(x, np.float32, 0), (0, 2, 1)), _weight(t, w, (2, 1, 0))]
    inputs += [] if b is None else [t.name(b, np.float32, 2)]
    left, right = a["pads"]
    y = t.g.node(
        "Conv",
        inputs,
        kernel_shape=[int(w.shape[0])],
        strides=[int(a["stride"])],
        dilations=[int(a["dilation"])],
        pads=[int(left), int(right)],
        group=int(a.get("groups", 1)),
    )
    t.set(node.outputs[0], t.g.transpose(y, (0, 2, 1)))


@rule("conv_transpose2d")
def conv_transpose2d(t, node):
    x, w, b = node.inputs
    a = node.attrs
    (top, bottom), (left, right) = a["pads"]
    # EveryO's weight is (kh, kw, C_in, C_out); ONNX ConvTranspose wants (C_in, C_out, kh, kw).
    inputs = [t.g.transpose(t.name(x, np.float32, 0), TO_NCHW), _weight(t, w, (2, 3, 0, 1))]
    inputs += [] if b is None else [t.name(b, np.float32, 2)]
    y = t.g.node(
        "ConvTranspose",
        inputs,
        kernel_shape=[int(k) for k in a["kernel_size"]],
        strides=[int(s) for s in a["stride"]],
        dilations=[int(d) for d in a["dilation"]],
        pads=[int(top), int(left), int(bottom), int(right)],
        output_padding=[int(e) for e in a["output_padding"]],
    )
    t.set(node.outputs[0], t.g.transpose(y, TO_NHWC))


@rule("upsample2d")
def upsample2d(t, node):
    a = node.attrs
    sh, sw = (int(s) for s in a["size"])
    interpolation = a.get("interpolation", "nearest")
    if interpolation == "nearest":
        # Output p copies input p // scale: asymmetric coordinates p / scale, floored.
        mode = dict(mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    elif a.get("align_corners"):
        mode = dict(mode="linear", coordinate_transformation_mode="align_corners")
    else:
        # (p + 0.5) / scale - 0.5, clamped at 0 (ONNX Runtime clamps like core).
        mode = dict(mode="linear", coordinate_transformation_mode="half_pixel")
    scales = t.g.constant(np.array([1, 1, sh, sw], np.float32), "scales")
    y = t.g.node("Resize", [t.g.transpose(t.name(node.inputs[0]), TO_NCHW), "", scales], **mode)
    t.set(node.outputs[0], t.g.transpose(y, TO_NHWC))


@rule("normalize")
def normalize(t, node):
    # Core: (x - mean) / sqrt(var + eps) * weight + bias; the statistics are
    # x's own (ReduceMean over the axes, variance with ddof 0) or, for a batch
    # norm in eval mode, its running statistics, baked in with sqrt(var + eps)
    # folded into one constant as core computes it.
    g, a = t.g, node.attrs
    x, weight, bias = node.inputs
    dtype = node.outputs[0].dtype
    name = t.name(x, dtype, 0)
    axes = sorted(int(i) % x.data.ndim for i in np.atleast_1d(a["axis"]))
    eps = np.asarray(a["eps"], dtype)
    if _fits_layer_normalization(g, a, x, weight, bias, axes, dtype):
        # One node instead of nine: ONNX's LayerNormalization (opset 17)
        # normalises over the trailing axes, as core does here.
        inputs = [name, t.name(weight, dtype, 1), t.name(bias, dtype, 2)]
        t.set(node.outputs[0], g.node("LayerNormalization", inputs, axis=axes[0], epsilon=float(eps)))
        return
    if a.get("mean") is None:
        mean = g.reduce("ReduceMean", name, axes, True)
        centered = g.node("Sub", [name, mean])
        var = g.reduce("ReduceMean", g.node("Mul", [centered, centered]), axes, True)
        y = g.node("Div", [centered, g.node("Sqrt", [g.node("Add", [var, g.scalar(eps, dtype, "eps")])])])
    else:
        mean = np.asarray(a["mean"], np.float32).astype(dtype)
        std = np.sqrt(np.asarray(a["var"], np.float32).astype(dtype) + eps)
        y = g.node("Div", [g.node("Sub", [name, g.constant(mean, "mean")]), g.constant(std, "std")])
    if weight is not None:
        y = g.node("Add", [g.node("Mul", [y, t.name(weight, dtype, 1)]), t.name(bias, dtype, 2)])
    t.set(node.outputs[0], y)


def _fits_layer_normalization(g, attrs, x, weight, bias, axes, dtype):
    """Whether ``normalize`` is ONNX's LayerNormalization: x's own statistics
    over its trailing axes, float32, an affine weight and bias of exactly the
    normalised shape, and an opset that has the op."""
    rank = x.data.ndim
    return (
        g.opset >= 17
        and attrs.get("mean") is None
        and dtype == np.float32
        and axes == list(range(axes[0], rank))
        and weight is not None
        and bias is not None
        and tuple(weight.shape) == tuple(x.shape[axes[0] :])
        and tuple(bias.shape) == tuple(weight.shape)
    )
