"""Shared benchmark helpers: machine/BLAS description, interleaved timing, tables.

The 2-core machines this project runs on flip between a fast and a slow state
every few seconds, so two timings taken one after the other are not comparable.
``interleaved`` runs the candidates A B A B ... so both see the same states, and
``median_ratio`` compares them pair by pair. Dependency-free: threadpoolctl is
used when importable, otherwise ``numpy.show_config``.
"""

import os
import platform
import statistics
import sys
import time

import everyo

# Benchmarks time training loops, which opt in to the malloc tuning as training
# scripts may (importing everyo leaves malloc alone). bench_allocator.py sets
# EVERYO_BENCH_DEFAULT_MALLOC=1 in a child process to measure glibc's defaults.
MALLOC_TUNED = os.environ.get("EVERYO_BENCH_DEFAULT_MALLOC") != "1" and everyo.tune_allocator()


def blas_info() -> str:
    """BLAS library, version and thread count NumPy uses, as one line."""
    try:
        import numpy  # noqa: F401  (loads the BLAS so threadpoolctl can see it)
        from threadpoolctl import threadpool_info

        pools = [p for p in threadpool_info() if p.get("user_api") == "blas"]
        if pools:
            return "; ".join(
                f"{p.get('internal_api')} {p.get('version')} "
                f"({p.get('threading_layer', '?')} threads={p.get('num_threads')}, "
                f"arch={p.get('architecture', '?')})"
                for p in pools
            )
    except ImportError:
        pass
    import numpy as np

    try:
        cfg = np.show_config(mode="dicts")
        blas = cfg.get("Build Dependencies", {}).get("blas", {})
        return f"{blas.get('name', '?')} {blas.get('version', '?')} (threads: unknown, no threadpoolctl)"
    except Exception as exc:  # show_config's layout is not a stable API
        return f"unknown BLAS ({type(exc).__name__}: {exc})"


def machine_info() -> str:
    """One line: cores, CPU, Python, NumPy, and whether malloc is tuned."""
    return _machine_info() + (", malloc tuned (eo.tune_allocator)" if MALLOC_TUNED else ", malloc defaults")


def _machine_info() -> str:
    """Cores, Python, NumPy version and OPENBLAS_CORETYPE (if set), as one line."""
    import numpy as np

    parts = [
        f"{os.cpu_count()} cores",
        f"{platform.machine()}",
        f"Python {platform.python_version()}",
        f"NumPy {np.__version__}",
    ]
    coretype = os.environ.get("OPENBLAS_CORETYPE")
    if coretype:
        parts.append(f"OPENBLAS_CORETYPE={coretype}")
    return ", ".join(parts)


def interleaved(fns: dict, repeats: int = 7, warmup: int = 1) -> dict:
    """Time each zero-argument callable in ``fns``, alternating between them.

    Runs ``warmup`` untimed rounds, then ``repeats`` rounds of A B C ... A B C.
    Returns name -> list of seconds per run (one entry per round).
    """
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return times


def median_ratio(times_a, times_b) -> float:
    """Median of the pairwise ratios a[i] / b[i] (runs from the same round)."""
    if len(times_a) != len(times_b) or not times_a:
        raise ValueError(f"median_ratio needs two equally long, non-empty lists; got {len(times_a)} and {len(times_b)}")
    return statistics.median(a / b for a, b in zip(times_a, times_b))


def print_table(title: str, headers, rows, file=None) -> None:
    """Print ``rows`` under ``headers`` as an aligned plain-text table.

    Floats are shown with 4 significant digits; text columns are left-aligned,
    numeric ones right-aligned.
    """
    file = file or sys.stdout

    def fmt(v):
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    cells = [[fmt(v) for v in row] for row in rows]
    widths = [len(str(h)) for h in headers]
    for row in cells:
        for i, c in enumerate(row):
            widths[i] = max(widths[i], len(c))
    numeric = [all(isinstance(row[i], (int, float)) for row in rows) if rows else False for i in range(len(headers))]

    def line(values):
        return "  ".join(v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric)).rstrip()

    print(title, file=file)
    print(line([str(h) for h in headers]), file=file)
    print(line(["-" * w for w in widths]), file=file)
    for row in cells:
        print(line(row), file=file)
    print(file=file)
    if "--plot" in sys.argv:
        plot_ratios(title, headers, rows)


_plots_written = 0


def plot_ratios(title: str, headers, rows, directory=None):
    """Write a bar chart of the table's ratio columns (the benchmarks' ``--plot``).

    Every column whose header contains "ratio" (or ends in "/") is drawn, one
    group of bars per row, with a line at 1.0; the PNG goes to
    ``benchmarks/plots/<script>-<n>.png``. Needs matplotlib (the bench
    environment has it); without it a note is printed instead.
    """
    global _plots_written
    columns = [i for i, h in enumerate(headers) if "ratio" in str(h).lower() or str(h).endswith("/")]
    columns = [i for i in columns if rows and all(isinstance(r[i], (int, float)) for r in rows)]
    if not columns:
        return None
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("--plot: matplotlib is not installed (pip install matplotlib); no chart written")
        return None
    from pathlib import Path

    out_dir = Path(directory) if directory else Path(__file__).resolve().parent / "plots"
    out_dir.mkdir(exist_ok=True)
    _plots_written += 1
    path = out_dir / f"{Path(sys.argv[0]).stem}-{_plots_written}.png"
    labels = [str(r[0]) for r in rows]
    fig, ax = plt.subplots(figsize=(9, 0.5 + 0.45 * len(rows) * len(columns) + 1))
    height = 0.8 / len(columns)
    for k, i in enumerate(columns):
        ys = [j + k * height for j in range(len(rows))]
        ax.barh(ys, [float(r[i]) for r in rows], height=height, label=str(headers[i]))
    ax.set_yticks([j + height * (len(columns) - 1) / 2 for j in range(len(rows))], labels, fontsize=8)
    ax.invert_yaxis()
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xlabel("ratio (1.0 = same time)")
    ax.set_title(title, fontsize=9)
    if len(columns) > 1:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"--plot: wrote {path}")
    return path


if __name__ == "__main__":
    # Self-demo: python benchmarks/harness.py
    import numpy as np

    print(machine_info())
    print(blas_info())
    a = np.random.default_rng(0).standard_normal((256, 256), dtype=np.float32)
    t = interleaved({"matmul": lambda: a @ a, "add": lambda: a + a}, repeats=5)
    print_table(
        "demo",
        ["op", "median ms", "ratio to add"],
        [[k, statistics.median(v) * 1e3, median_ratio(v, t["add"])] for k, v in t.items()],
    )
