"""What the opt-in malloc tuning (``eo.tune_allocator()``) buys on the spec's MLP.

Importing everyo leaves malloc alone (0.2). This script runs the MLP of
bench_core.py (64-128-128-1, 4096 rows, 60 SGD steps) against its hand-written
NumPy floor in two fresh interpreters, one with glibc's defaults and one after
``eo.tune_allocator()``, and prints both ratios with the minor page faults of
each candidate. A ratio is measured within one process (interleaved A B A B),
so the two rows compare like with like.

    python benchmarks/bench_allocator.py
"""

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from harness import blas_info, machine_info, print_table  # noqa: E402

CHILD = r"""
import json, os, resource, statistics, sys, time
sys.path.insert(0, sys.argv[1])
from harness import MALLOC_TUNED  # tunes when EVERYO_BENCH_TUNE_MALLOC=1
assert MALLOC_TUNED == (sys.argv[2] == "tuned") or sys.platform != "linux"
from bench_core import everyo_mlp, mlp_data, numpy_mlp
from harness import IDLE_GAP, median_ratio
x, y = mlp_data()
times, faults = {"everyo": [], "numpy": []}, {"everyo": [], "numpy": []}
fns = {"everyo": lambda: everyo_mlp(x, y), "numpy": lambda: numpy_mlp(x, y)}
for fn in fns.values():
    fn()
for _ in range(7):
    for name, fn in fns.items():
        time.sleep(IDLE_GAP)  # the previous run's BLAS threads stop spinning
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t0 = time.perf_counter()
        fn()
        times[name].append(time.perf_counter() - t0)
        faults[name].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
print(json.dumps({"ratio": median_ratio(times["everyo"], times["numpy"]),
                  "everyo_ms": statistics.median(times["everyo"]) * 1e3,
                  "numpy_ms": statistics.median(times["numpy"]) * 1e3,
                  "everyo_faults": statistics.median(faults["everyo"]),
                  "numpy_faults": statistics.median(faults["numpy"])}))
"""


def run(mode):
    env = dict(os.environ, EVERYO_BENCH_TUNE_MALLOC="1" if mode == "tuned" else "0")
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(HERE), mode], capture_output=True, text=True, check=True, env=env
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    print("EveryO allocator benchmark:", machine_info())
    print("BLAS:", blas_info())
    rows = []
    for mode, label in (("default", "import everyo (malloc untouched)"), ("tuned", "after eo.tune_allocator()")):
        r = run(mode)
        rows.append([label, r["everyo_ms"], r["numpy_ms"], r["ratio"], r["everyo_faults"], r["numpy_faults"]])
    print_table(
        "Spec MLP, 60 SGD steps: EveryO vs hand-written NumPy (median of interleaved runs)",
        ["malloc", "everyo ms", "numpy ms", "ratio", "everyo faults", "numpy faults"],
        rows,
    )


if __name__ == "__main__":
    main()
