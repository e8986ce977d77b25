"""Run EveryO's examples in order, each as a subprocess of this interpreter.

    python examples/tour.py            (or: hatch run tour:run)

Every example must exist and exit 0; the tour exits non-zero otherwise and
lists what failed. Nothing is skipped silently.
"""

import os
import subprocess
import sys
import time
from pathlib import Path

EXAMPLES_DIR = Path(__file__).resolve().parent

# (script, extra environment). The distributed example needs OMP_NUM_THREADS=1
# set before Python starts: each worker's BLAS would otherwise start a thread
# pool per process and oversubscribe the cores (see the spec).
TOUR = [
    ("quickstart.py", {}),
    ("mixed_precision.py", {}),
    ("onnx_export.py", {}),
    ("distributed_training.py", {"OMP_NUM_THREADS": "1"}),
    ("sequence.py", {}),
]


def run_example(script: str, extra_env: dict) -> tuple[int | None, float]:
    """Run one example, streaming its output; return (exit code or None if missing, seconds)."""
    path = EXAMPLES_DIR / script
    env_note = " ".join(f"{k}={v}" for k, v in extra_env.items())
    print("=" * 72)
    print(f"== {script}" + (f"   ({env_note})" if env_note else ""))
    print("=" * 72, flush=True)
    if not path.is_file():
        print(f"MISSING: {path} does not exist", flush=True)
        return None, 0.0
    env = {**os.environ, **extra_env}
    start = time.perf_counter()
    # Output is inherited, so it streams as the example prints it.
    code = subprocess.call([sys.executable, str(path)], cwd=EXAMPLES_DIR.parent, env=env)
    return code, time.perf_counter() - start


def main() -> int:
    results = []
    for script, extra_env in TOUR:
        code, seconds = run_example(script, extra_env)
        results.append((script, code, seconds))
        print(flush=True)

    print("=" * 72)
    print("Tour summary")
    failed = 0
    for script, code, seconds in results:
        if code is None:
            status = "MISSING"
        elif code == 0:
            status = "ok"
        else:
            status = f"FAILED (exit {code})"
        failed += status != "ok"
        print(f"  {script:<26} {status:<18} {seconds:6.1f} s")
    print(f"{len(results) - failed} of {len(results)} examples ran successfully")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
