"""Opt-in malloc tuning for training loops (glibc only): ``eo.tune_allocator()``.

A training step allocates the same few megabyte-sized activations and
gradients every iteration and frees them together at the end of backward().
With glibc's defaults, a large free block at the top of the heap is trimmed
back to the OS and arrays above the mmap threshold get fresh pages from the
kernel, so the next step faults its pages in again. Measured on the spec's MLP
(60 steps, 0.1): 219,000 minor page faults against 20,000 for hand-written
NumPy, and 1.6x its time. Raising the two thresholds makes those arrays reuse
heap memory.

The change is process-wide: freed memory (up to ``_TRIM`` bytes) is kept by
the process instead of being returned to the OS, which a notebook or an
inference service may not want. So importing everyo never does it; a training
script (the benchmarks do) calls :func:`tune_allocator` once, explicitly.
"""

from __future__ import annotations

import ctypes
import sys

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_MMAP = 32 * 1024 * 1024  # glibc's maximum for the mmap threshold on 64-bit
_TRIM = 256 * 1024 * 1024

tuned = False


def tune_allocator() -> bool:
    """Raise glibc's mmap threshold to 32 MiB and its trim threshold to 256 MiB.

    Process-wide and irreversible for the process: call it once at the start of
    a training script, never from library code. Returns whether it was applied
    (False on other C libraries and operating systems, where it does nothing).

    Example, at the top of a training script::

        import everyo as eo
        eo.tune_allocator()
    """
    global tuned
    if tuned or not sys.platform.startswith("linux"):
        return tuned
    try:
        # The running process's own symbols: no ctypes.util.find_library,
        # which starts an ldconfig subprocess (milliseconds at import time).
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # musl or another libc: nothing to tune
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    tuned = bool(mallopt(_M_MMAP_THRESHOLD, _MMAP)) and bool(mallopt(_M_TRIM_THRESHOLD, _TRIM))
    return tuned
