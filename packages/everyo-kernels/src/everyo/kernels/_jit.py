"""How every kernel is compiled: numba's ``njit`` with one set of options.

- ``cache=True``: the machine code is kept on disk, beside the module
  (``__pycache__``) or, where that folder is not writable (a system-wide
  site-packages), in numba's per-user cache (``~/.cache/numba`` or
  ``NUMBA_CACHE_DIR``); numba picks the first that works.
- ``error_model="numpy"``: a float division by zero gives inf/nan as in NumPy
  instead of a Python exception; the check that raises would also stop LLVM
  from vectorising the loops.
- ``boundscheck=False`` and no ``fastmath``: the arithmetic is IEEE, operation
  by operation, in the order written (no FMA contraction, no reassociation),
  which is what makes a kernel bit-identical to NumPy's passes. Only
  :mod:`everyo.kernels._math` allows contraction, inside the ``tanh`` it
  documents.
- ``parallel=False``: one thread; the arrays of a cell step are small (32 x
  512 values) and the steps are sequential.

Kernels are compiled for explicit signatures, at import, so that loading from
the cache (or compiling) happens when core discovers the package, not in the
middle of a training step.
"""

from __future__ import annotations

from typing import Any

import numba

__all__ = ["kernel", "inline"]


def kernel(signature: Any) -> Any:
    """The decorator of a kernel entry point compiled for ``signature``."""
    return numba.njit(signature, cache=True, error_model="numpy", boundscheck=False, nogil=True)


def inline(**options: Any) -> Any:
    """The decorator of a helper inlined into the kernels that call it."""
    return numba.njit(inline="always", error_model="numpy", boundscheck=False, **options)
