"""Walk a model into the ordered list of layers to convert, refusing early.

Everything that cannot be exported is found here, before a single node is
built or a byte is written, and reported with its class and its position in
the model (``model[2][0]`` is layer 0 of the Sequential at position 2).
"""
import numpy as np

import everyo.nn as nn
from everyo.errors import EveryOSerializationError

from everyo.onnx.converters import CONVERTERS

# Core layers that are refused on purpose. They unroll into long chains of
# primitives (a loop over time steps, a gather, attention over the sequence)
# that need a tracing exporter, not a layer-by-layer one.
SEQUENCE_LAYERS = frozenset({"RNN", "LSTM", "GRU", "Embedding", "MultiHeadAttention", "PositionalEncoding"})

SUPPORTED = ", ".join(["Sequential"] + [cls.__name__ for cls in CONVERTERS])


def _is_core_sequence_layer(cls):
    name = cls.__name__
    return cls.__module__.startswith("everyo.") and (name in SEQUENCE_LAYERS or name.startswith("Transformer"))


def _refusal(layer, where):
    """Why ``layer`` cannot be exported, or None if it can."""
    cls = type(layer)
    name = cls.__name__
    if _is_core_sequence_layer(cls):
        return (
            f"{name} at {where} is not supported: recurrent, embedding, attention and transformer "
            f"layers unroll into long chains of primitives that need a tracing exporter, not a "
            f"layer-by-layer one, and a half-correct translation would be worse than none"
        )
    if cls not in CONVERTERS:
        return (
            f"{name} at {where} is not a layer the exporter knows (it converts exactly these classes: "
            f"{SUPPORTED}); a custom or subclassed Module may compute anything in forward(), so it "
            f"is refused rather than guessed at. Build the model from the supported layers"
        )
    if isinstance(layer, (nn.BatchNorm1D, nn.BatchNorm2D)) and not layer.track_running_stats:
        return (
            f"{name} at {where} was built with track_running_stats=False: it has no running "
            f"statistics, so there is no inference-time behaviour to export. Rebuild it with "
            f"track_running_stats=True and train it"
        )
    return None


def _dtype_refusal(layer, where):
    for pname, t in list(layer.named_parameters()) + list(layer.named_buffers()):
        if t is not None and np.asarray(t.data).dtype != np.float32:
            return (
                f"{type(layer).__name__} at {where} has {pname} of dtype {np.asarray(t.data).dtype}; "
                f"the exporter writes float32 graphs (ONNX Runtime's CPU Conv and AveragePool have "
                f"no float64 kernels). Call model.to('float32') before exporting"
            )
    return None


def plan(model, where="model"):
    """Return ``[(position, layer), ...]`` in execution order, or raise
    ``EveryOSerializationError`` listing every layer that cannot be exported."""
    steps, problems = [], []

    def visit(module, where):
        # Exactly Sequential: a subclass may reorder or skip layers in forward().
        if type(module) is nn.Sequential:
            for i, child in enumerate(module.layers):
                visit(child, f"{where}[{i}]")
            return
        reason = _refusal(module, where) or _dtype_refusal(module, where)
        if reason:
            problems.append(reason)
        else:
            steps.append((where, module))

    visit(model, where)
    if problems:
        head = "cannot export this model to ONNX, nothing was written"
        raise EveryOSerializationError(head + ": " + "; ".join(problems) + ".")
    return steps
