"""EveryO: a deep-learning framework on NumPy.

``import everyo as eo`` gives the core API. The add-ons (``everyo.amp``,
``everyo.onnx``, ``everyo.distributed``) are separate distributions that share
this namespace; their headline names are reachable from here lazily, and only
when the add-on is installed.
"""

# Lets add-ons installed from other src/ folders (editable installs) join
# this package's namespace. Must stay the first statement.
__path__ = __import__("pkgutil").extend_path(__path__, __name__)

__version__ = "0.3.0"

import typing as _typing  # noqa: E402

from everyo import (  # noqa: E402
    autograd,
    data,
    dispatch,
    io,
    nn,
    optim,
)
from everyo import comparisons as _comparisons  # noqa: E402
from everyo import composites as _composites  # noqa: E402
from everyo import elementwise as _elementwise  # noqa: E402
from everyo import functional as _functional  # noqa: E402
from everyo import indexing as _indexing  # noqa: E402
from everyo import low_precision as _low_precision  # noqa: E402,F401  (binds dispatch's 16-bit route)
from everyo import reductions as _reductions  # noqa: E402
from everyo import shape_ops as _shape_ops  # noqa: E402
from everyo import sorting as _sorting  # noqa: E402
from everyo._allocator import tune_allocator  # noqa: E402
from everyo.activations import elu, gelu, leaky_relu, silu, softplus  # noqa: E402
from everyo.attention_ops import scaled_dot_product_attention  # noqa: E402
from everyo.autograd import enable_grad, grad, is_grad_enabled, no_grad  # noqa: E402
from everyo.comparisons import *  # noqa: E402,F401,F403
from everyo.composites import *  # noqa: E402,F401,F403
from everyo.contraction import einsum  # noqa: E402
from everyo.conv import (  # noqa: E402
    avg_pool2d,
    conv1d,
    conv2d,
    max_pool2d,
)
from everyo.conv_transpose import conv_transpose2d  # noqa: E402
from everyo.data import DataLoader, Dataset, TensorDataset, pad_sequences  # noqa: E402
from everyo.elementwise import *  # noqa: E402,F401,F403
from everyo.errors import (  # noqa: E402
    EveryODistributedError,
    EveryODTypeError,
    EveryOError,
    EveryOIndexError,
    EveryOInPlaceError,
    EveryOSerializationError,
    EveryOShapeError,
    EveryOSpellingError,
    EveryOStateDictError,
)
from everyo.functional import *  # noqa: E402,F401,F403
from everyo.indexing import *  # noqa: E402,F401,F403
from everyo.io import (  # noqa: E402
    load,
    load_torch_state_dict,
    save,
)
from everyo.kernel_table import kernels  # noqa: E402
from everyo.losses import (  # noqa: E402
    binary_cross_entropy,
    binary_cross_entropy_with_logits,
    cross_entropy,
    huber_loss,
    kl_div,
    l1_loss,
    mse_loss,
    nll_loss,
    smooth_l1_loss,
)
from everyo.nn import *  # noqa: E402,F401,F403
from everyo.optim import SGD, Adadelta, Adagrad, Adam, AdamW, NAdam, RMSprop, clip_grad_norm  # noqa: E402
from everyo.padding import resolve_padding2d  # noqa: E402
from everyo.random import get_rng_state, manual_seed, set_rng_state  # noqa: E402
from everyo.reductions import *  # noqa: E402,F401,F403
from everyo.shape_ops import *  # noqa: E402,F401,F403
from everyo.sorting import *  # noqa: E402,F401,F403
from everyo.tensor import Parameter, Tensor, arange, ones, randn, tensor, zeros  # noqa: E402
from everyo.upsampling import upsample2d  # noqa: E402

# The public names, explicitly (so `from everyo import *` and type checkers
# agree on them); the star-imported modules contribute their own __all__.
__all__ = [
    "EveryOError",
    "EveryOShapeError",
    "EveryODTypeError",
    "EveryOStateDictError",
    "EveryOIndexError",
    "EveryOSerializationError",
    "EveryODistributedError",
    "EveryOInPlaceError",
    "EveryOSpellingError",
    "Tensor",
    "Parameter",
    "tensor",
    "ones",
    "zeros",
    "randn",
    "arange",
    "autograd",
    "no_grad",
    "enable_grad",
    "is_grad_enabled",
    "grad",
    "einsum",
    "scaled_dot_product_attention",
    "conv2d",
    "max_pool2d",
    "avg_pool2d",
    "conv1d",
    "conv_transpose2d",
    "upsample2d",
    "gelu",
    "silu",
    "leaky_relu",
    "elu",
    "softplus",
    "mse_loss",
    "cross_entropy",
    "binary_cross_entropy_with_logits",
    "nll_loss",
    "l1_loss",
    "smooth_l1_loss",
    "huber_loss",
    "binary_cross_entropy",
    "kl_div",
    "resolve_padding2d",
    "SGD",
    "Adam",
    "AdamW",
    "RMSprop",
    "Adadelta",
    "Adagrad",
    "NAdam",
    "clip_grad_norm",
    "DataLoader",
    "Dataset",
    "TensorDataset",
    "pad_sequences",
    "manual_seed",
    "get_rng_state",
    "set_rng_state",
    "save",
    "load",
    "load_torch_state_dict",
    "tune_allocator",
    "kernels",
    "nn",
    "optim",
    "data",
    "io",
    "dispatch",
]
__all__ += _functional.__all__
__all__ += _comparisons.__all__
__all__ += _composites.__all__
__all__ += _reductions.__all__
__all__ += _sorting.__all__
__all__ += _elementwise.__all__
__all__ += _shape_ops.__all__
__all__ += _indexing.__all__
__all__ += nn.__all__

if _typing.TYPE_CHECKING:  # the add-ons' headline names, resolved lazily at run time (below)
    from everyo.amp.autocast import autocast as autocast
    from everyo.amp.grad_scaler import GradScaler as GradScaler
    from everyo.onnx import export_onnx as export_onnx
    from everyo.onnx import onnx_available as onnx_available
    from everyo.onnx import run_onnx as run_onnx
    from everyo.onnx import verify_onnx as verify_onnx

# name -> (module, distribution extra). Resolved on first attribute access
# (PEP 562) so that importing core never imports an add-on.
_ADDON_NAMES = {
    "autocast": ("everyo.amp", "amp"),
    "GradScaler": ("everyo.amp", "amp"),
    "export_onnx": ("everyo.onnx", "onnx"),
    "run_onnx": ("everyo.onnx", "onnx"),
    "onnx_available": ("everyo.onnx", "onnx"),
    "verify_onnx": ("everyo.onnx", "onnx"),
    # the add-ons' namespaces themselves: ``eo.onnx.compile`` right after ``import everyo as eo``
    "amp": ("everyo.amp", "amp"),
    "onnx": ("everyo.onnx", "onnx"),
    "distributed": ("everyo.distributed", "distributed"),
}


def __getattr__(name: str) -> object:
    try:
        module_name, extra = _ADDON_NAMES[name]
    except KeyError:
        raise AttributeError(f"module 'everyo' has no attribute {name!r}") from None
    import importlib

    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name not in (module_name, "everyo." + extra):
            raise
        raise ImportError(
            f"eo.{name} needs the {module_name} add-on, which is not installed. "
            f"Install it with: pip install everyo-core[{extra}]"
        ) from exc
    value = module if module_name == f"everyo.{name}" else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_ADDON_NAMES))
