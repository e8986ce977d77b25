"""Keep activation-sized allocations in the heap (glibc only).

A training step allocates the same few megabyte-sized activations and
gradients every iteration and frees them together at the end of backward().
With glibc's defaults, arrays above the dynamic mmap threshold get fresh
pages from the kernel, and a large free block at the top of the heap is
trimmed back to the OS, so the next step faults every page in again.
Measured on the spec's MLP (60 steps): 219,000 minor page faults against
20,000 for hand-written NumPy, and 1.6x its time. Raising the two thresholds
once makes those arrays reuse heap memory: the same run then takes about the
hand-written NumPy time.

The change is process-wide, affects only when freed memory is returned to the
OS (at most ``_TRIM`` bytes are kept), and is skipped when
``EVERYO_MALLOC_TUNING=0`` or when the C library is not glibc.
"""
import ctypes
import os
import sys

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_MMAP = 32 * 1024 * 1024  # glibc's maximum for the mmap threshold on 64-bit
_TRIM = 256 * 1024 * 1024

tuned = False


def tune():
    """Raise glibc's mmap and trim thresholds; returns whether it was applied."""
    global tuned
    if tuned or os.environ.get("EVERYO_MALLOC_TUNING", "1") == "0" or not sys.platform.startswith("linux"):
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
