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
    Conv2D ``weight``                     (O, I, kh, kw)    (kh, kw, I, O)
    ====================================  ================  ===================

Everything else (biases, BatchNorm's weight, bias and running statistics,
LayerNorm, Embedding) is copied as it is; PyTorch's BatchNorm
``num_batches_tracked`` counter has no EveryO counterpart and is ignored.
LSTM (i, f, g, o) and GRU (r, z, n) gate orders are PyTorch's already.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from everyo.errors import EveryOStateDictError
from everyo.nn.module import key_problems
from everyo.tensor import Tensor

if TYPE_CHECKING:
    from everyo.nn.module import Module

_IGNORED_BUFFERS = ("num_batches_tracked",)


def _layouts():
    # Imported here: everyo.nn imports this package's parents at start-up.
    from everyo.nn import GRU, LSTM, RNN, Conv2D, Linear, MultiHeadAttention

    def matrix(transpose):
        return lambda w: w.T if transpose and w.ndim == 2 else w

    def conv(w):
        return w.transpose(2, 3, 1, 0) if w.ndim == 4 else w

    def rules(transpose):
        recurrent = {p: matrix(transpose) for p in ("weight_ih", "weight_hh")}
        return {
            Linear: {"weight": matrix(transpose)},
            Conv2D: {"weight": conv},
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


def load_torch_state_dict(
    module: Module,
    path: str | os.PathLike[str] | Mapping[str, Any],
    *,
    transpose_linear: bool = True,
    strict: bool = True,
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

    Conv2D kernels always go from (O, I, kh, kw) to (kh, kw, I, O). EveryO is
    channels-last, so feed NHWC input (``x.transpose(0, 2, 3, 1)``); a Linear
    after a ``Flatten`` of conv features sees them in (H, W, C) order, not
    PyTorch's (C, H, W), and its weight rows need that permutation too.

    Returns:
        ``module``, loaded.

    Raises:
        EveryOStateDictError: missing or unexpected keys, or shapes that do not
            match (the message gives PyTorch's shape and the one expected).
        EveryOSerializationError: the file cannot be read.

    Examples:
        >>> model = eo.Sequential(eo.Linear(4, 8), eo.ReLU(), eo.Linear(8, 2))  # doctest: +SKIP
        >>> eo.load_torch_state_dict(model, "torch_mlp.safetensors")  # doctest: +SKIP
    """
    if isinstance(path, Mapping):
        tensors = {k: (v.data if isinstance(v, Tensor) else np.asarray(v)) for k, v in path.items()}
        source = "the given state dict"
    else:
        from everyo.io.safetensors_format import read_flat

        tensors, _ = read_flat(path)
        source = str(path)
    rules = _layouts()(transpose_linear)
    converted, missing, mismatched, used, seen = {}, [], [], set(), set()
    for prefix, owner in module.named_modules():
        for name, target in list(owner._parameters.items()) + list(owner._buffers.items()):
            if target is None or id(target) in seen:
                continue
            seen.add(id(target))
            key = f"{prefix}.{name}" if prefix else name
            if key not in tensors:
                missing.append(key)
                continue
            used.add(key)
            convert = _rule_for(owner, name, rules)
            value = tensors[key] if convert is None else convert(tensors[key])
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
