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
  which is what makes a kernel bit-identical to NumPy's passes.
- ``parallel=False``: one thread; the arrays of a cell step are small (32 x
  512 values) and the steps are sequential. ``nogil=True``: where two threads
  pay (the LSTM's whole-loop scans, on two ranges of the batch's rows), the
  caller runs a kernel on plain Python threads (``everyo.kernels.recurrent``).

Kernels compile (or load from the cache) at their first call, for the types
and layouts they are called with: core calls each with C-contiguous arrays of
one dtype, so each kernel is compiled once per dtype it meets (float32 in
training; float64 under the gradient checker). Compiling every kernel for
every type at import took 8 s on a cold cache (0.3 s warm, most of it
``import numba``); now an LSTM's first call compiles only its own three
float32 kernels.
"""

from __future__ import annotations

from typing import Any

import numba

__all__ = ["kernel", "contracted_kernel", "helper"]


def kernel(function: Any) -> Any:
    """The decorator of a kernel entry point (compiled at its first call)."""
    return numba.njit(cache=True, error_model="numpy", boundscheck=False, nogil=True)(function)


def contracted_kernel(function: Any) -> Any:
    """:func:`kernel` that lets LLVM contract ``a * b + c`` into one fused
    multiply-add (``fastmath={"contract"}``: no reassociation, no other
    relaxation), where the CPU has FMA. Only for a kernel that is not
    bit-identical anyway and whose documented bound its tests check with the
    contraction on (``gelu_forward``, ``gelu_backward``): an FMA rounds once where the NumPy path
    rounds twice."""
    return numba.njit(cache=True, error_model="numpy", boundscheck=False, nogil=True, fastmath={"contract"})(function)


def helper(function: Any) -> Any:
    """A kernel's building block, inlined into its callers at numba's IR level
    (``inline="always"``): a call to a compiled function that takes an array
    view increments and decrements its reference count (atomic operations),
    once per row in a row loop."""
    return numba.njit(cache=True, error_model="numpy", boundscheck=False, nogil=True, inline="always")(function)
