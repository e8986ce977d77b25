"""Load PyTorch / Hugging Face weights (a ``.safetensors`` file) into an EveryO module.

EveryO layers use PyTorch's parameter names, so a module built like the
PyTorch one has the same state-dict keys; what differs is the layout of some
weights, because EveryO computes ``x @ W`` on channels-last data:

    ====================================  ================  ===================
    layer (EveryO)                        PyTorch layout    EveryO layout
    ====================================  ================  ===================
    Linear ``weight``                     (out, in)         (in, out)
    RNN / LSTM / GRU ``weight_ih_*``,     (gates*H, in)     (in, gates*H)
    ``weight_hh_*``
    MultiHeadAttention ``in_proj_weight`` (3E, E)           (E, 3E)
    Conv1D ``weight``                     (O, I, k)         (k, I, O)
    Conv2D ``weight``                     (O, I, kh, kw)    (kh, kw, I, O)
    Conv2DTranspose ``weight``            (I, O, kh, kw)    (kh, kw, I, O)
    Linear after a flatten of an NHWC     columns in        columns in
    map (see below)                       (C, H, W) order   (H, W, C) order
    ====================================  ================  ===================

EveryO has no 3-D convolution (no Conv3d counterpart to convert). Everything else (biases, BatchNorm's weight, bias and running statistics,
LayerNorm, Embedding) is copied as it is; PyTorch's BatchNorm
``num_batches_tracked`` counter has no EveryO counterpart and is ignored.
LSTM (i, f, g, o) and GRU (r, z, n) gate orders are PyTorch's already.

A Linear that reads a flattened convolutional feature map sees it in EveryO's
(H, W, C) order; its PyTorch weight was trained on (C, H, W). The loader
permutes those weight columns when it knows the map's shape: from
``example_input=`` (the model is run once on it and each Linear's input is
traced back to the flatten, see :mod:`everyo.io.torch_flatten`) or from
``flatten_from=``. A model with convolution-family layers and Linear layers
whose inputs are not known that way is refused, never loaded in the wrong order.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from everyo.errors import EveryOStateDictError
from everyo.io.torch_flatten import UNKNOWN, permute_rows, trace_linear_inputs
from everyo.nn.module import key_problems
from everyo.tensor import Tensor

if TYPE_CHECKING:
    from everyo._typing import TensorLike
    from everyo.nn.module import Module

_IGNORED_BUFFERS = ("num_batches_tracked",)


def _layouts():
    # Imported here: everyo.nn imports this package's parents at start-up.
    from everyo.nn import GRU, LSTM, RNN, Conv1D, Conv2D, Conv2DTranspose, Linear, MultiHeadAttention

    def matrix(transpose):
        return lambda w: w.T if transpose and w.ndim == 2 else w

    def conv(w):
        return w.transpose(2, 3, 1, 0) if w.ndim == 4 else w

    def conv1d(w):
        return w.transpose(2, 1, 0) if w.ndim == 3 else w

    def conv_transpose(w):
        return w.transpose(2, 3, 0, 1) if w.ndim == 4 else w

    def rules(transpose):
        recurrent = {p: matrix(transpose) for p in ("weight_ih", "weight_hh")}
        return {
            Linear: {"weight": matrix(transpose)},
            Conv1D: {"weight": conv1d},
            Conv2D: {"weight": conv},
            Conv2DTranspose: {"weight": conv_transpose},
            MultiHeadAttention: {"in_proj_weight": matrix(transpose)},
            RNN: recurrent,
            LSTM: recurrent,
            GRU: recurrent,
        }

    return rules


def _rule_for(module, name, rules):
    for cls, table in rules.items():
        if isinstance(module, cls):
            for prefix, convert in table.items():
                if name == prefix or name.startswith(prefix + "_l"):
                    return convert
    return None


_SPATIAL_LAYERS = ("Conv1D", "Conv2D", "Conv2DTranspose", "MaxPool2D", "AvgPool2D", "BatchNorm2D", "UpSampling2D")


def _flatten_plan(module, example_input, flatten_from):
    """Dotted Linear name -> the channels-last shape its PyTorch weight columns are permuted
    from, or None (loaded as they are); raises when an order cannot be known."""
    from everyo.nn import Linear

    linears = {name: m for name, m in module.named_modules() if isinstance(m, Linear)}
    given = dict(flatten_from or {})
    unknown_names = sorted(set(given) - set(linears))
    if unknown_names:
        raise EveryOStateDictError(
            f"flatten_from names {unknown_names}, which are not Linear layers of {type(module).__name__} "
            f"(its Linear layers: {sorted(linears)})"
        )
    spatial = sorted(n for n, m in module.named_modules() if type(m).__name__ in _SPATIAL_LAYERS)
    traced = trace_linear_inputs(module, example_input) if example_input is not None else {}
    plan, unknown = {}, []
    for name, layer in linears.items():
        if name in given:
            plan[name] = None if given[name] is None else tuple(int(d) for d in given[name])
        elif id(layer.weight) in traced:
            found = traced[id(layer.weight)]
            if found == UNKNOWN:
                unknown.append(name)
            plan[name] = found
        elif spatial:
            unknown.append(name)
        else:
            plan[name] = None
    if unknown:
        how = (
            "traced on example_input, its input is a flatten whose order cannot be recovered "
            "(not a merge of trailing axes of a convolutional map)"
            if example_input is not None
            else f"the model has convolution-family layers ({', '.join(spatial[:4])}) and PyTorch flattens "
            "their maps in (C, H, W) order where EveryO flattens (H, W, C)"
        )
        raise EveryOStateDictError(
            f"cannot tell the order of the features Linear {unknown} read: {how}. Pass "
            "example_input= (one batch in EveryO's layout, e.g. np.zeros((1, 28, 28, 1), 'float32') for "
            "28x28 one-channel images) so the flatten's shape is traced, or "
            f"flatten_from={{{unknown[0]!r}: (H, W, C)}} with the channels-last shape flattened into it "
            "(None: the features are in PyTorch's order already)"
        )
    return plan


def load_torch_state_dict(
    module: Module,
    path: str | os.PathLike[str] | Mapping[str, Any],
    *,
    transpose_linear: bool = True,
    strict: bool = True,
    example_input: TensorLike | None = None,
    flatten_from: Mapping[str, Sequence[int] | None] | None = None,
) -> Module:
    """Copy PyTorch-layout weights into ``module`` (converting layouts, see below).

    Args:
        module: an EveryO module built with the same structure (and so the
            same state-dict keys) as the PyTorch model, e.g. ``eo.Sequential``
            for ``torch.nn.Sequential``.
        path: a ``.safetensors`` file (``safetensors.torch.save_file(model.state_dict(), path)``,
            or a Hugging Face checkpoint), or a mapping of names to NumPy arrays.
        transpose_linear: transpose the (out, in) matrices of Linear, RNN/LSTM/GRU
            and MultiHeadAttention's input projection to EveryO's (in, out).
            Pass False for a file already in EveryO's layout.
        strict: every key of the module must be in the file and every key of the
            file must be used (PyTorch's ``num_batches_tracked`` excepted).
        example_input: one input batch in EveryO's layout (NHWC images); the
            model is run on it once (eval mode, no gradients, nothing
            changed) to find each Linear fed by a flattened feature map and
            that map's shape. Needed when the model has convolution-family
            layers and Linear layers.
        flatten_from: ``{"fc1": (H, W, C)}``: the channels-last shape a Linear's
            input was flattened from (its weight columns are permuted from
            PyTorch's (C, H, W) order), or None for features already in
            PyTorch's order. Overrides what ``example_input`` finds.

    Conv kernels always go to EveryO's channels-last layout. EveryO is
    channels-last, so feed NHWC input (``x.transpose(0, 2, 3, 1)``).

    Returns:
        ``module``, loaded.

    Raises:
        EveryOStateDictError: missing or unexpected keys, shapes that do not
            match (the message gives PyTorch's shape and the one expected), or
            a Linear after a flatten whose order cannot be known (the message
            says what to pass). Nothing is copied then.
        EveryOSerializationError: the file cannot be read.

    Examples:
        >>> model = eo.Sequential(eo.Linear(4, 8), eo.ReLU(), eo.Linear(8, 2))  # doctest: +SKIP
        >>> eo.load_torch_state_dict(model, "torch_mlp.safetensors")  # doctest: +SKIP
        >>> cnn = eo.Sequential(eo.Conv2D(1, 8, 3), eo.Flatten(), eo.Linear(8 * 26 * 26, 10))  # doctest: +SKIP
        >>> eo.load_torch_state_dict(cnn, "cnn.safetensors", example_input=np.zeros((1, 28, 28, 1), "float32"))  # doctest: +SKIP
    """
    from everyo.nn import Linear

    if isinstance(path, Mapping):
        tensors = {k: (v.data if isinstance(v, Tensor) else np.asarray(v)) for k, v in path.items()}
        source = "the given state dict"
    else:
        from everyo.io.safetensors_format import read_flat

        tensors, _ = read_flat(path)
        source = str(path)
    rules = _layouts()(transpose_linear)
    flatten = _flatten_plan(module, example_input, flatten_from) if transpose_linear else {}
    converted, missing, mismatched, used, seen = {}, [], [], set(), set()
    for prefix, owner in module.named_modules():
        for name, target in list(owner._parameters.items()) + list(owner._buffers.items()):
            key = f"{prefix}.{name}" if prefix else name
            if target is None or id(target) in seen:
                if target is not None and key in tensors:
                    used.add(key)  # a tied weight: PyTorch saves it under each name, EveryO loads it once
                continue
            seen.add(id(target))
            if key not in tensors:
                missing.append(key)
                continue
            used.add(key)
            value = tensors[key]
            merged = flatten.get(prefix) if isinstance(owner, Linear) and name == "weight" else None
            if merged is not None:
                if value.ndim != 2 or value.shape[1] != int(np.prod(merged)):
                    mismatched.append(
                        f"{key}: Linear reads a flattened {tuple(merged)} map ({int(np.prod(merged))} features), "
                        f"the file has {value.shape}"
                    )
                    continue
                value = permute_rows(value, tuple(merged))
            tied = isinstance(owner, Linear) and owner.weight_transposed and name == "weight"
            convert = None if tied else _rule_for(owner, name, rules)  # a tied weight is PyTorch's layout already
            value = value if convert is None else convert(value)
            if value.shape != target.data.shape:
                how = "" if convert is None else f" (PyTorch's {tensors[key].shape}, converted to {value.shape})"
                mismatched.append(
                    f"{key}: {type(owner).__name__} expects {target.data.shape}, the file has {value.shape}{how}"
                )
                continue
            converted[key] = value
    unexpected = sorted(k for k in tensors if k not in used and k.rsplit(".", 1)[-1] not in _IGNORED_BUFFERS)
    problems = key_problems(missing, unexpected, mismatched, strict)
    if problems:
        raise EveryOStateDictError(
            f"cannot load PyTorch weights from {source} into {type(module).__name__}: "
            + "; ".join(problems)
            + ". Is the EveryO model built with the same layers, sizes and names?"
        )
    return module.load_state_dict(converted, strict=False)
