"""Compiled kernels beside the op table.

Core's ops compute with NumPy and stay the reference. The optional
``everyo-kernels`` distribution (``pip install everyo-core[kernels]``) offers
compiled replacements for some of their inner steps (the LSTM cell's
elementwise gate math, ...); an op that has such a step asks this table for it
once per call and runs its own NumPy code when the answer is ``None``::

    step = kernel_table.get("lstm_cell_forward")   # a function, or None

Discovery is lazy: nothing is looked for at ``import everyo``. The first
:func:`get` (the first call of an op that has a kernel) or :func:`kernels`
looks for ``everyo.kernels`` and imports it (it imports numba: a few tenths of
a second, and loading the compiled code from numba's on-disk cache). With the
environment variable ``EVERYO_KERNELS=0`` (read at that first look) or without
the package, the table stays empty and every op runs its NumPy path.

A kernel is the same computation as the step it replaces: bit for bit where
the NumPy step is exact arithmetic; where it computes a function NumPy
computes with its own approximation (``tanh``), within a bound its tests check
(see the everyo-kernels README).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

__all__ = ["KernelStatus", "kernels", "get", "disabled", "FLOAT_DTYPES", "MIN_SIZE"]

ENV_VAR = "EVERYO_KERNELS"
# The float types core's ops hand to a kernel, and the fewest elements for which an op
# asks for one (below it the NumPy pass runs, and the kernels are never loaded for it).
FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
MIN_SIZE = 16384

_table: dict[str, Callable[..., Any]] | None = None  # None until discovery
_status: KernelStatus | None = None


@dataclass(frozen=True)
class KernelStatus:
    """What :func:`everyo.kernels` reports.

    Attributes:
        enabled: whether compiled kernels are in use.
        active: the names of the kernels in use (empty when not enabled).
        reason: one line saying why (the package and numba versions, or
            "disabled by EVERYO_KERNELS=0", "not installed: ...", or the error
            that stopped them from loading).
    """

    enabled: bool
    active: tuple[str, ...]
    reason: str

    def __str__(self) -> str:
        names = ", ".join(self.active) if self.active else "none"
        return f"kernels: {names} ({self.reason})"


def _discover() -> dict[str, Callable[..., Any]]:
    global _table, _status
    setting = os.environ.get(ENV_VAR, "1").strip().lower()
    table: dict[str, Callable[..., Any]] = {}
    if setting in ("0", "false", "no", "off"):
        reason = f"disabled by {ENV_VAR}={os.environ[ENV_VAR]}"
    else:
        import importlib
        import importlib.util

        try:
            found = importlib.util.find_spec("everyo.kernels") is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            reason = "not installed: pip install everyo-core[kernels]"
        else:
            try:
                package: Any = importlib.import_module("everyo.kernels")
                table = dict(package.TABLE)
                reason = package.describe()
            except Exception as exc:  # a broken numba must not break the ops: they fall back to NumPy
                table = {}
                reason = f"failed to load: {type(exc).__name__}: {exc}"
    _status = KernelStatus(bool(table), tuple(sorted(table)), reason)
    _table = table
    return table


def get(name: str) -> Callable[..., Any] | None:
    """The kernel registered as ``name``, or ``None`` (the op then runs its
    NumPy code). The first call discovers the kernels (see the module doc)."""
    table = _table if _table is not None else _discover()
    return table.get(name)


def kernels() -> KernelStatus:
    """Which compiled kernels are active, and why (or why none are).

    Loads them if nothing has yet (``everyo-kernels`` imports numba).

    >>> import everyo as eo
    >>> status = eo.kernels()
    >>> status.enabled == bool(status.active)
    True
    """
    if _status is None:
        _discover()
    assert _status is not None
    return _status


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """Run the block with every op on its NumPy path (for A/B tests and
    benchmarks in one process; not thread-safe: it swaps the table for all threads)."""
    global _table
    saved = _table if _table is not None else _discover()
    _table = {}
    try:
        yield
    finally:
        _table = saved
