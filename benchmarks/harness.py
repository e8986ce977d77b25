"""Shared benchmark helpers: machine/BLAS description, honest timing, tables.

Rules every benchmark here follows (issue 24):

- **What a user gets is the headline.** Nothing is tuned: malloc keeps glibc's
  defaults (``EVERYO_BENCH_TUNE_MALLOC=1`` opts in to ``eo.tune_allocator()`` for
  a labelled extra figure) and BLAS keeps its default thread count.
- **Two frameworks never share a process.** OpenBLAS's worker threads keep
  spinning for about 0.1-0.2 s after a call (measured: ``python
  benchmarks/harness.py --gap``), OpenMP's for a while too, so whatever runs next
  in the same process shares the cores with them. ``alternate_processes`` runs
  each side alone in a fresh interpreter, A B A B ... for at least 3 rounds, and
  the figure is the ratio of the medians.
- **Inside one process, only same-framework A/B** (``interleaved``), and every
  timed run starts after ``IDLE_GAP`` seconds of sleep so the previous run's
  spinning threads are asleep.
- **A verdict needs a quiet machine.** ``other_cpu`` measures how many cores
  other processes used during a comparison (from ``/proc/stat``, minus this
  process's and its children's CPU time); above ``QUIET_OTHERS`` a target is
  printed as "not judged" instead of met/missed.

The 2-core machines this project runs on also flip between a fast and a slow
state every few seconds, which is why candidates alternate instead of running
one after the other. Dependency-free: threadpoolctl is used when importable,
otherwise ``numpy.show_config``.
"""

import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time

# Measured with ``--gap`` (OpenBLAS 0.3 on 2 cores): after a burst of 256x256
# products its worker still burns a core 0.05 s later, 17 ms of a 50 ms window at
# 0.1 s, nothing from 0.2 s; PyTorch's threads are quiet within 0.01 s. 0.3 s
# leaves a margin.
IDLE_GAP = 0.3


def _tune_malloc_if_asked() -> bool:
    if os.environ.get("EVERYO_BENCH_TUNE_MALLOC") != "1":
        return False
    import everyo

    return everyo.tune_allocator()


# The headline is untuned; EVERYO_BENCH_TUNE_MALLOC=1 (set by a benchmark for a
# labelled child process) calls eo.tune_allocator() first.
MALLOC_TUNED = _tune_malloc_if_asked()


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


def interleaved(fns: dict, repeats: int = 7, warmup: int = 1, gap: float = IDLE_GAP, before=None) -> dict:
    """Time each zero-argument callable in ``fns``, alternating between them.

    Runs ``warmup`` untimed rounds, then ``repeats`` rounds of A B C ... A B C,
    each timed run after ``gap`` seconds of sleep (the previous run's BLAS
    threads stop spinning) and, untimed, ``before()`` where given (to set up
    the situation being measured). For candidates of ONE framework only: comparing two
    frameworks goes through :func:`alternate_processes`.
    Returns name -> list of seconds per run (one entry per round).
    """
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            if gap:
                time.sleep(gap)
            if before is not None:
                before()
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return times


class ProcessFailed(RuntimeError):
    """A benchmark process exited non-zero; ``name`` is its candidate, ``reason`` its last stderr line."""

    def __init__(self, name: str, argv, returncode: int, stderr: str):
        self.name = name
        lines = [line for line in stderr.strip().splitlines() if line.strip()]
        self.reason = lines[-1].strip() if lines else f"exited {returncode}"
        super().__init__(f"{name}: {' '.join(argv)} exited {returncode}:\n{stderr[-3000:]}")


def alternate_processes(commands: dict, rounds: int = 3, env=None, timeout: float = 600) -> dict:
    """Run each command alone in a fresh process, alternating A B A B ... for ``rounds``.

    ``commands`` maps a name to an argv list; each process must print one JSON
    object as its last line of standard output. ``env`` maps a name to extra
    environment variables for that command. Returns name -> list of the parsed
    objects (one per round). A failing process raises ``ProcessFailed`` with its
    standard error.
    """
    if rounds < 3:
        raise ValueError(f"alternate_processes needs at least 3 rounds for a median to mean anything; got {rounds}")
    results = {name: [] for name in commands}
    for _ in range(rounds):
        for name, argv in commands.items():
            extra = (env or {}).get(name, {})
            proc = subprocess.run(
                argv, capture_output=True, text=True, timeout=timeout, env=dict(os.environ, **extra), check=False
            )
            if proc.returncode != 0:
                raise ProcessFailed(name, argv, proc.returncode, proc.stderr)
            results[name].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return results


def has_torch(python):
    """``[version, threads]`` of torch in the interpreter ``python``, or None where it cannot import torch."""
    probe = subprocess.run(
        [python, "-c", "import torch; print(torch.__version__, torch.get_num_threads())"],
        capture_output=True,
        text=True,
        check=False,
    )
    return probe.stdout.split() if probe.returncode == 0 else None


def torch_or_say(python):
    """:func:`has_torch`, and where it is None the message a comparison script prints
    before it exits 0 without a table."""
    version = has_torch(python)
    if version is None:
        print(f"torch is not importable from {python}: nothing to compare with (pip install torch, or")
        print("pass --torch-python PATH to an interpreter that has it). Exiting without a table.")
    return version


def ratio_of_medians(a, b) -> float:
    """median(a) / median(b): the cross-process figure (each list one value per process)."""
    if not a or not b:
        raise ValueError(f"ratio_of_medians needs two non-empty lists; got {len(a)} and {len(b)}")
    return statistics.median(a) / statistics.median(b)


@contextlib.contextmanager
def cpu_hogs(n: int = 2):
    """``n`` CPU-bound processes (``python -c "while True: pass"``) for the block's duration.

    They are this call's own children, ended by their pids on exit."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        time.sleep(0.2)  # let them reach the run queue
        yield hogs
    finally:
        for hog in hogs:
            hog.kill()
        for hog in hogs:
            hog.wait()


class OtherCPU:
    """How many cores processes other than this one and its children kept busy (see ``other_cpu``)."""

    cores: float | None = None  # None: not measurable here (no /proc/stat)


def _busy_cpu_seconds():
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()[1:]
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _own_cpu_seconds():
    import resource

    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


@contextlib.contextmanager
def other_cpu():
    """Measure the block's competition: the machine's busy CPU time minus this process's and
    its (waited-for) children's, per second of wall time, in ``.cores`` of the yielded object.

    The load average cannot tell this: a benchmark's own processes keep it near the core
    count. A quiet-machine verdict is only given when the others used little (``QUIET_OTHERS``).
    """
    result = OtherCPU()
    busy0, own0, t0 = _busy_cpu_seconds(), _own_cpu_seconds(), time.perf_counter()
    yield result
    busy1, own1, t1 = _busy_cpu_seconds(), _own_cpu_seconds(), time.perf_counter()
    if busy0 is not None and busy1 is not None and t1 > t0:
        result.cores = max(0.0, ((busy1 - busy0) - (own1 - own0)) / (t1 - t0))


#: Above this many cores used by other processes, a "quiet" comparison is not judged.
QUIET_OTHERS = 0.15


def verdict(met: bool, others: OtherCPU) -> str:
    """ "met"/"MISSED", or "not judged" when other processes competed for the cores."""
    if others.cores is not None and others.cores > QUIET_OTHERS:
        return f"not judged (others used {others.cores:.2f} cores)"
    return "met" if met else "MISSED"


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


def measure_gap(work=None, gaps=(0.0, 0.01, 0.05, 0.1, 0.2, 0.3, 0.5), windows=5) -> list:
    """CPU time the process burns while its main thread sleeps 50 ms, ``gap`` s after ``work``.

    Spinning BLAS/OpenMP workers show up as CPU time during the sleep; the
    smallest gap where it is ~0 is the idle gap ``interleaved`` needs.
    Returns [(gap, median ms burnt)]."""
    import numpy as np

    if work is None:
        a = np.random.default_rng(0).standard_normal((256, 256), dtype=np.float32)

        def work():
            for _ in range(20):
                a @ a

    rows = []
    for gap in gaps:
        burnt = []
        for _ in range(windows):
            work()
            time.sleep(gap)
            c0 = time.process_time()
            time.sleep(0.05)
            burnt.append(time.process_time() - c0)
        rows.append((gap, statistics.median(burnt) * 1e3))
    return rows


if __name__ == "__main__":
    # Self-demo: python benchmarks/harness.py   (--gap: measure the idle gap)
    import numpy as np

    if "--gap" in sys.argv:
        print(machine_info())
        print(blas_info())
        print_table(
            "CPU burnt by NumPy's BLAS threads while the main thread sleeps 50 ms, after 20 256x256 products",
            ["gap s", "ms burnt (median of 5)"],
            measure_gap(),
        )
        sys.exit(0)

    print(machine_info())
    print(blas_info())
    a = np.random.default_rng(0).standard_normal((256, 256), dtype=np.float32)
    t = interleaved({"matmul": lambda: a @ a, "add": lambda: a + a}, repeats=5)
    print_table(
        "demo",
        ["op", "median ms", "ratio to add"],
        [[k, statistics.median(v) * 1e3, median_ratio(v, t["add"])] for k, v in t.items()],
    )
