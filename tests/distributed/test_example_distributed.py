"""examples/distributed_training.py runs, prints the spec's table, and its own checks pass (short run)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "distributed_training.py"


@pytest.mark.usefixtures("no_leftovers")
@pytest.mark.parametrize("extra", [[], ["--ddp"]])
def test_example_prints_the_table_with_drift_and_agreement(extra):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), "--workers", "1", "2", "--steps", "5", "--repeats", "1"] + extra,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = re.findall(r"^\s+(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.e+-]+)\s+(True|False)$", proc.stdout, re.M)
    assert [(r[0], r[1]) for r in rows] == [("1", "4096"), ("2", "2048")], proc.stdout
    assert float(rows[0][3]) == 0.0  # one worker is the single-process computation
    assert all(float(r[3]) < 1e-5 and r[4] == "True" for r in rows)
