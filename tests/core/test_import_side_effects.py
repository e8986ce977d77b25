"""`import everyo` changes nothing process-wide; the malloc tuning is opt-in.

The measurable effect of the tuning is memory the process keeps after freeing
it: with glibc's defaults, freed 4 MiB arrays (mmapped, or trimmed from the top
of the heap) go back to the OS; with the tuning they stay in the heap. Each case
runs in a fresh interpreter so that nothing else in the test session counts.
"""

import subprocess
import sys

import pytest

PROBE = r"""
import sys
import numpy as np
import everyo as eo
if sys.argv[1] == "tuned":
    assert eo.tune_allocator()

def rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20

before = rss_mib()
arrays = [np.ones(1 << 20, dtype=np.float32) for _ in range(48)]  # 48 x 4 MiB = 192 MiB
del arrays
print(rss_mib() - before)
"""

linux_glibc = pytest.mark.skipif(
    not sys.platform.startswith("linux") or "glibc" not in " ".join(__import__("platform").libc_ver()),
    reason="the tuning exists only on Linux with glibc",
)


def _kept_after_free(mode):
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True)
    return float(out.stdout.strip())


@linux_glibc
def test_import_leaves_malloc_alone():
    # Freed memory goes back to the OS: well under the 192 MiB allocated.
    assert _kept_after_free("default") < 32


@linux_glibc
def test_tune_allocator_is_the_opt_in():
    # The same probe with the tuning keeps the freed arrays: this is what the
    # first test would see if importing everyo still tuned malloc.
    assert _kept_after_free("tuned") > 150


def test_import_sets_no_environment_and_imports_only_numpy():
    code = (
        "import os, sys; before = dict(os.environ); import everyo; "
        "assert dict(os.environ) == before; "
        "heavy = [m for m in ('onnx', 'onnxruntime', 'mpi4py', 'ml_dtypes', 'safetensors', 'torch', "
        "'everyo.amp', 'everyo.onnx', 'everyo.distributed') if m in sys.modules]; "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
