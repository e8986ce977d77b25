"""Checkpoint speed: EveryO's checked .npz reader, NumPy's np.load, and safetensors.

    python benchmarks/bench_io.py [--mb 50] [--rounds 7]

A state dict of float32 matrices (256 x 256, ``--mb`` megabytes in all) is
saved once per format; then, round after round and interleaved (these
machines flip between fast and slow states), it times ``eo.load`` of the
.npz (our reader: every size checked before reading), ``np.load`` of the
same file reading every array (the unchecked baseline EveryO 0.1 used),
``eo.load`` of a .safetensors file beside safetensors' own ``load_file``,
and one ``eo.save`` per format. The table
gives medians and the median of the per-round ratios to ``np.load``.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "packages", "everyo-core", "src"))
import everyo as eo  # noqa: E402


def _blas():
    try:
        config = np.show_config(mode="dicts")
        return config["Build Dependencies"]["blas"]["name"]
    except Exception:
        return "unknown"


def _time(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=50)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    count = max(1, int(args.mb * 2**20 / (256 * 256 * 4)))
    rng = np.random.default_rng(0)
    state = {f"layer{i}.weight": rng.standard_normal((256, 256), dtype=np.float32) for i in range(count)}
    folder = tempfile.mkdtemp()
    npz, st = os.path.join(folder, "c.npz"), os.path.join(folder, "c.safetensors")
    eo.save(state, npz)
    try:
        eo.save(state, st)
    except eo.EveryOSerializationError:
        st = None

    def np_load():
        with np.load(npz, allow_pickle=False) as archive:
            return {k: archive[k] for k in archive.files}

    cases = {
        "eo.load .npz (checked)": lambda: eo.load(npz),
        "np.load .npz (unchecked)": np_load,
        "eo.save .npz": lambda: eo.save(state, npz),
    }
    if st:
        cases["eo.load .safetensors"] = lambda: eo.load(st)
        cases["eo.save .safetensors"] = lambda: eo.save(state, st)
        from safetensors.numpy import load_file

        cases["safetensors load_file"] = lambda: load_file(st)
    times = {name: [] for name in cases}
    for _ in range(args.rounds):
        for name, fn in cases.items():
            times[name].append(_time(fn))
    base = times["np.load .npz (unchecked)"]
    print(
        f"{count} float32 arrays of 256x256 ({count * 0.25:.0f} MiB), {args.rounds} interleaved rounds; "
        f"numpy {np.__version__}, BLAS {_blas()}, {os.cpu_count()} CPUs"
    )
    print(f"{'case':28s} {'median ms':>10s} {'/ np.load':>10s}")
    for name, ts in times.items():
        ratio = statistics.median(t / b for t, b in zip(ts, base))
        print(f"{name:28s} {statistics.median(ts) * 1e3:10.1f} {ratio:10.2f}x")


if __name__ == "__main__":
    main()
