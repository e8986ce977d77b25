"""dtype names that only ml_dtypes defines ("bfloat16") work in a fresh process (ml_dtypes is
imported where the name is resolved, never at start-up), and name the install when it is absent."""

import subprocess
import sys

import pytest

FRESH = """
import sys
import numpy as np
import everyo as eo
assert "ml_dtypes" not in sys.modules, "core imported ml_dtypes at start-up"
x = eo.tensor(np.array([1.5, -2.0], np.float32)).astype("bfloat16")
layer = eo.Linear(2, 3, seed=0).to("bfloat16")
print(x.dtype, layer.weight.dtype, eo.tensor([1.0], dtype="bfloat16").dtype, x.astype("float32").data.tolist())
"""

MISSING = """
import sys
sys.modules["ml_dtypes"] = None  # as if not installed: importing it raises ImportError
import everyo as eo
for call in (lambda: eo.tensor([1.0]).astype("bfloat16"), lambda: eo.Linear(2, 3).to("bfloat16")):
    try:
        call()
    except eo.EveryODTypeError as exc:
        print("refused:", exc)
"""


def _run(code):
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_bfloat16_by_name_in_a_fresh_process():
    pytest.importorskip("ml_dtypes")
    assert _run(FRESH).split() == ["bfloat16", "bfloat16", "bfloat16", "[1.5,", "-2.0]"]


def test_without_ml_dtypes_the_error_names_the_install():
    lines = _run(MISSING).strip().splitlines()
    assert len(lines) == 2
    for line in lines:
        assert line.startswith("refused: dtype 'bfloat16' comes from the ml_dtypes package")
        assert "pip install ml_dtypes" in line and "everyo-core[amp]" in line
