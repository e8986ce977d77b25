"""Mixed precision for EveryO: ``autocast`` and ``GradScaler``.

``eo.autocast`` and ``eo.GradScaler`` resolve here lazily from core. This
package hooks into core only through the precision policy of
:mod:`everyo.dispatch`; core never imports it.
"""

from everyo.amp._version import __version__  # noqa: F401
from everyo.amp.autocast import Float16Policy, autocast, get_autocast_dtype, is_autocast_enabled
from everyo.amp.grad_scaler import GradScaler

__all__ = ["autocast", "GradScaler", "is_autocast_enabled", "get_autocast_dtype", "Float16Policy"]
