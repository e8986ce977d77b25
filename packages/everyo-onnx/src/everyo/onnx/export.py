"""export_onnx: an EveryO model to an ONNX file, layer by layer."""
import operator

import everyo
from everyo.errors import EveryOSerializationError
from everyo.io import atomic_write
from everyo.nn import Module

from everyo.onnx.converters import CONVERTERS
from everyo.onnx.graph import GraphBuilder
from everyo.onnx.plan import plan

# Opset 17 is the first with LayerNormalization and is run by every ONNX
# Runtime since 1.13 (2022) and by most other runtimes; newer opsets add
# nothing these layers need. Any opset from MIN_OPSET up to what the installed
# onnx package knows can be asked for.
DEFAULT_OPSET = 17
# Softmax/LogSoftmax normalise along one axis (not "all axes after it") from 13.
MIN_OPSET = 13

INSTALL_HINT = "Install it with: pip install everyo-core[onnx]"


def _import_onnx():
    try:
        import onnx
    except ImportError as exc:
        raise ImportError(f"export_onnx needs the onnx package, which is not installed. {INSTALL_HINT}") from exc
    return onnx


def _as_shape(input_shape):
    """``input_shape`` as a tuple of ints (None allowed), or None if it is not one."""
    if not isinstance(input_shape, (tuple, list)):
        return None
    try:
        return tuple(None if d is None else operator.index(d) for d in input_shape)
    except TypeError:
        return None


def _check_arguments(model, input_shape, input_name, output_name, opset, newest):
    if not isinstance(model, Module):
        raise TypeError(f"export_onnx expects an EveryO Module, got {type(model).__name__}")
    shape = _as_shape(input_shape)
    batch_ok = shape is not None and (shape[0] is None or shape[0] > 0)
    if not batch_ok or len(shape) < 2 or not all(d is not None and d > 0 for d in shape[1:]):
        raise ValueError(
            f"input_shape must be (batch, ...) with positive integer sizes, e.g. (1, 8, 8, 1) for an "
            f"8x8 one-channel NHWC image; got {input_shape!r}. The batch size is exported symbolic "
            f"whatever its value"
        )
    for label, name in (("input_name", input_name), ("output_name", output_name)):
        if not isinstance(name, str) or not name:
            raise ValueError(f"{label} must be a non-empty string, got {name!r}")
    if input_name == output_name:
        raise ValueError(f"input_name and output_name must differ, both are {input_name!r}")
    if not isinstance(opset, int) or not MIN_OPSET <= opset <= newest:
        raise ValueError(
            f"opset must be an integer from {MIN_OPSET} to {newest} (the newest the installed onnx "
            f"package knows), got {opset!r}; the default is {DEFAULT_OPSET}"
        )
    return (None,) + shape[1:]


def build_model(model, *, input_shape, output_name="output", input_name="input", opset=None):
    """Build and check the ``onnx.ModelProto`` for ``model`` without writing it.

    Raises ``EveryOSerializationError`` for a layer that cannot be exported and
    ``EveryOShapeError`` when ``input_shape`` does not fit a layer.
    """
    onnx = _import_onnx()
    from onnx import TensorProto, helper

    opset = DEFAULT_OPSET if opset is None else opset
    shape = _check_arguments(model, input_shape, input_name, output_name, opset, onnx.defs.onnx_opset_version())
    steps = plan(model)  # refuses unsupported layers before anything is built

    g = GraphBuilder(input_name, output_name, opset)
    value, in_shape = input_name, shape
    for where, layer in steps:
        value, shape = CONVERTERS[type(layer)](g, layer, value, shape, where)
    g.rename_output(value, output_name)

    def dims(s):
        return ["batch"] + list(s[1:])

    graph = helper.make_graph(
        g.nodes,
        "everyo",
        [helper.make_tensor_value_info(input_name, TensorProto.FLOAT, dims(in_shape))],
        [helper.make_tensor_value_info(output_name, TensorProto.FLOAT, dims(shape))],
        initializer=g.initializers,
    )
    opsets = [helper.make_opsetid("", opset)]
    # The lowest IR version that can carry this opset, so older runtimes load it.
    proto = helper.make_model(
        graph, opset_imports=opsets, ir_version=helper.find_min_ir_version_for(opsets),
        producer_name="everyo", producer_version=everyo.__version__,
        doc_string=f"Exported by everyo.onnx from {type(model).__name__}; NHWC input '{input_name}'.",
    )
    # full_check runs strict shape inference, which also cross-checks the
    # shapes tracked by the converters against ONNX's own.
    try:
        onnx.checker.check_model(proto, full_check=True)
    except onnx.checker.ValidationError as exc:
        raise EveryOSerializationError(f"the exported graph failed onnx.checker ({exc}); nothing was written") from exc
    return proto


def export_onnx(model, path, *, input_shape, output_name="output", input_name="input", opset=None):
    """Export ``model`` to an ONNX file at ``path``.

    Args:
        model: a supported layer or a ``Sequential`` of them (nesting allowed).
        path: file to write; written atomically, so a failed export leaves no file.
        input_shape: ``(batch, ...)`` channels-last, e.g. ``(1, 8, 8, 1)``. The
            batch axis is exported symbolic (``batch``) whatever its value; the
            other sizes are fixed, because 'same' padding depends on them.
        output_name, input_name: names of the graph's output and input.
        opset: ONNX opset, default ``DEFAULT_OPSET`` (17).

    The graph computes the model's inference behaviour (dropout is the
    identity, batch norm uses its running statistics) whatever mode the model
    is in; the model itself is not modified.

    Example:
        >>> model.eval()
        >>> eo.export_onnx(model, "model.onnx", input_shape=(1, 8, 8, 1), output_name="logits")
        >>> eo.run_onnx("model.onnx", batch)
    """
    proto = build_model(model, input_shape=input_shape, output_name=output_name, input_name=input_name, opset=opset)
    data = proto.SerializeToString()
    atomic_write(path, lambda f: f.write(data))
    return path
