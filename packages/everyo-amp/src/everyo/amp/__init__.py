"""Mixed precision for EveryO: ``autocast`` and ``GradScaler``.

``eo.autocast`` and ``eo.GradScaler`` resolve here lazily from core. This
package hooks into core only through the precision policy of
:mod:`everyo.dispatch` and the converter hook of :mod:`everyo.half`
(:mod:`everyo.amp.fast_casts`); core never imports it.
"""

from everyo.amp._version import __version__  # noqa: F401
from everyo.amp.autocast import Float16Policy, autocast, get_autocast_dtype, is_autocast_enabled
from everyo.amp.fast_casts import _install, cast_backend
from everyo.amp.grad_scaler import GradScaler

__all__ = ["autocast", "GradScaler", "is_autocast_enabled", "get_autocast_dtype", "Float16Policy", "cast_backend"]

# Large float16 <-> float32 conversions through onnxruntime's Cast when it is installed (imported at
# the first such conversion, checked against NumPy first); see everyo.amp.fast_casts.
_install()
