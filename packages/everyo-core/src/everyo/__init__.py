"""EveryO: a deep-learning framework on NumPy.

``import everyo as eo`` gives the core API. The add-ons (``everyo.amp``,
``everyo.onnx``, ``everyo.distributed``) are separate distributions that share
this namespace; their headline names are reachable from here lazily, and only
when the add-on is installed.
"""

# Lets add-ons installed from other src/ folders (editable installs) join
# this package's namespace. Must stay the first statement.
__path__ = __import__("pkgutil").extend_path(__path__, __name__)

__version__ = "0.2.0"

from everyo.errors import (  # noqa: E402
    EveryOError,
    EveryOShapeError,
    EveryODTypeError,
    EveryOStateDictError,
    EveryOIndexError,
    EveryOSerializationError,
    EveryODistributedError,
    EveryOInPlaceError,
)
from everyo.tensor import Tensor, Parameter, tensor, ones, zeros, randn, arange  # noqa: E402
from everyo import autograd  # noqa: E402
from everyo.autograd import no_grad, enable_grad, is_grad_enabled, grad  # noqa: E402
from everyo.functional import *  # noqa: E402,F401,F403
from everyo.comparisons import *  # noqa: E402,F401,F403
from everyo.reductions import *  # noqa: E402,F401,F403
from everyo.sorting import *  # noqa: E402,F401,F403
from everyo.elementwise import *  # noqa: E402,F401,F403
from everyo.shape_ops import *  # noqa: E402,F401,F403
from everyo.indexing import *  # noqa: E402,F401,F403
from everyo.contraction import einsum  # noqa: E402
from everyo.conv import conv2d, max_pool2d, avg_pool2d  # noqa: E402
from everyo.conv import conv1d  # noqa: E402
from everyo.conv_transpose import conv_transpose2d  # noqa: E402
from everyo.upsampling import upsample2d  # noqa: E402
from everyo.activations import gelu, silu, leaky_relu, elu, softplus  # noqa: E402
from everyo.losses import mse_loss, cross_entropy, binary_cross_entropy_with_logits  # noqa: E402
from everyo.padding import resolve_padding2d  # noqa: E402
from everyo.nn import *  # noqa: E402,F401,F403
from everyo.optim import SGD, Adam, AdamW, RMSprop, clip_grad_norm  # noqa: E402
from everyo.data import DataLoader, Dataset, TensorDataset, pad_sequences  # noqa: E402
from everyo.random import manual_seed, get_rng_state, set_rng_state  # noqa: E402
from everyo.io import save, load  # noqa: E402
from everyo.io import load_torch_state_dict  # noqa: E402
from everyo._allocator import tune_allocator  # noqa: E402

# name -> (module, distribution extra). Resolved on first attribute access
# (PEP 562) so that importing core never imports an add-on.
_ADDON_NAMES = {
    "autocast": ("everyo.amp", "amp"),
    "GradScaler": ("everyo.amp", "amp"),
    "export_onnx": ("everyo.onnx", "onnx"),
    "run_onnx": ("everyo.onnx", "onnx"),
    "onnx_available": ("everyo.onnx", "onnx"),
    "verify_onnx": ("everyo.onnx", "onnx"),
}


def __getattr__(name):
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
    value = getattr(module, name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_ADDON_NAMES))
