"""Where a training step's CPU time goes, EveryO and PyTorch (issue 24, item 5).

    python benchmarks/profile_step.py [--workload lstm[,gpt,...]] [--framework everyo,torch]
        [--torch-python PATH] [--period-us 250]

The workloads are ``bench_vs_torch.py``'s (``everyo_step`` / ``torch_step``, float32).
Each (framework, workload) runs in its own process under ``perf record -e task-clock``
(user-space samples, one every ``--period-us`` of CPU time of any thread of the
process), enabled only around the timed steps (perf's control fifo), so the split
below is a share of CPU time and survives a loaded machine: a sample is taken only
while the process runs. Every sample is put in one bucket by its shared object and
symbol:

- ``blas``: GEMM kernels and packing (OpenBLAS; MKL / oneDNN inside torch);
- ``blas sync``: BLAS / OpenMP worker threads waiting or spinning between products;
- ``elementwise``: NumPy ufunc loops and reductions (ATen's vectorised kernels);
- ``copy``: memcpy, NumPy's strided/contiguous copy and cast loops (transposes,
  ``astype``, im2col gathers, ``ascontiguousarray``);
- ``alloc``: malloc/free/memset;
- ``python``: the interpreter (EveryO's layers, autograd, dispatch; torch's Python side);
- ``dispatch``: NumPy's per-call C overhead (argument parsing, ufunc setup, array
  creation) -- torch: the C++ dispatcher and autograd engine;
- ``jit``: code without a shared object (numba kernels, oneDNN's JIT);
- ``kernel``: kernel samples (page faults, munmap, futex) plus any CPU time
  ``time.process_time`` counted beyond the samples.

For EveryO a second process runs the same steps under cProfile for per-step counts:
ops dispatched, graph nodes, BLAS products, and the fixed CPU cost of one op forward +
backward on a 1-element tensor (so ``python + dispatch`` can be read as ops x cost).
Without perf the script prints only that part; without torch under ``--torch-python``
(default: this interpreter) it profiles EveryO alone and says so.
"""

import argparse
import cProfile
import json
import os
import pstats
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_vs_torch import WORKLOADS, everyo_step, torch_step  # noqa: E402

STEPS = {"mlp": 20, "cnn": 4, "lstm": 6, "encoder": 4, "gpt": 4}
BUCKETS = ("blas", "blas sync", "elementwise", "copy", "alloc", "python", "dispatch", "jit", "other", "kernel")

_SYNC = re.compile(r"blas_thread_server|exec_blas|inner_thread|sched_yield|gomp|kmp|__kmp|omp_|pthread|futex|spin")
_GEMM = re.compile(r"gemm|gblock|mkl_|dnnl|brgemm|_kernel_|oncopy|otcopy|itcopy|incopy|conv|sdot|saxpy|cblas")
_COPY = re.compile(r"memcpy|memmove|contig_to|strided_to|_cast|cast_|copy|transpose|take|assign", re.I)
_ALLOC = re.compile(r"malloc|free|calloc|realloc|memset|_int_|mmap|munmap|brk|consolidate|unlink_chunk|tcache|alloc")
_LOOP = re.compile(
    r"^(FLOAT|DOUBLE|HALF|BOOL|LONG|INT|UINT|BYTE|UBYTE|SHORT|LONGLONG)_|simd|npyv|avx|AVX|sse|pairwise|"
    r"reduce|sum|exp|tanh|log|maximum|minimum|sqrt|multiply|add|subtract|divide|where|argmax|erf|power|square|"
    r"vec::|Vectorized|cpu_kernel|_loop|unary|binary|softmax|layer_norm|norm_kernel|gelu|relu|threshold|sigmoid|"
    r"invoke_parallel|parallel_for|function_ref|LayerNorm|flash_atten|pool|unfold|col2im|im2col",
)


def bucket(dso, sym):
    """The bucket of one perf sample (shared object, symbol)."""
    d, s = dso.lower(), sym
    if d in ("[unknown]", "[jit]") or d.startswith("perf-") or "anon" in d:
        return "jit"
    if "kernel" in d and d.startswith("["):
        return "kernel"
    if _SYNC.search(s) or "gomp" in d or "iomp" in d:
        return "blas sync"
    if "openblas" in d or "mkl" in d or "dnnl" in d:
        return "blas"
    if d.startswith("libc") or d.startswith("ld-"):
        if _ALLOC.search(s):
            return "alloc"
        if _COPY.search(s):
            return "copy"
        return "other"
    if "torch_python" in d:
        return "python"
    if "torch" in d or "c10" in d:
        if _GEMM.search(s):
            return "blas"
        if _ALLOC.search(s) and "Tensor" not in s:
            return "alloc"
        if "copy_" in s or "memcpy" in s:
            return "copy"
        if _LOOP.search(s):
            return "elementwise"
        return "dispatch"
    if "multiarray_umath" in d or "numpy" in d:
        if _ALLOC.search(s) and "_cast" not in s:
            return "alloc"
        if _COPY.search(s):
            return "copy"
        if _LOOP.search(s):
            return "elementwise"
        return "dispatch"
    if "python" in d:
        return "python"
    if "libm" in d or "svml" in d:
        return "elementwise"
    return "other"


# --- the child: one framework, one workload -----------------------------------------------
def child(framework, workload, steps):
    step = everyo_step(workload, "float32") if framework == "everyo" else torch_step(workload, "float32")
    for _ in range(2):
        step()
    ctl, ack = os.environ.get("PROFILE_CTL"), os.environ.get("PROFILE_ACK")

    def control(word):
        if ctl:
            with open(ctl, "w") as c:
                c.write(word + "\n")
            with open(ack) as a:
                a.readline()

    control("enable")
    f0, c0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.process_time(), time.perf_counter()
    for _ in range(steps):
        step()
    cpu, wall = time.process_time() - c0, time.perf_counter() - t0
    f1 = resource.getrusage(resource.RUSAGE_SELF)
    control("disable")
    faults, sys_ms = (f1.ru_minflt - f0.ru_minflt) / steps, (f1.ru_stime - f0.ru_stime) * 1e3 / steps
    print(json.dumps({"cpu_ms": cpu * 1e3 / steps, "wall_ms": wall * 1e3 / steps, "faults": faults, "sys_ms": sys_ms}))


def perf_split(python, framework, workload, steps, period_us, env):
    """Run one child under perf: per-step CPU ms and {bucket: ms}, top symbols per bucket."""
    with tempfile.TemporaryDirectory() as tmp:
        ctl, ack, data = (os.path.join(tmp, n) for n in ("ctl", "ack", "perf.data"))
        os.mkfifo(ctl)
        os.mkfifo(ack)
        cmd = ["perf", "record", "-q", "-e", "task-clock", "-c", str(period_us * 1000), "--control"]
        cmd += [f"fifo:{ctl},{ack}", "-D", "-1", "-o", data, "--", python, __file__, "--child"]
        cmd += [framework, workload, str(steps)]
        run = subprocess.run(
            cmd, env={**os.environ, **env, "PROFILE_CTL": ctl, "PROFILE_ACK": ack}, capture_output=True, text=True
        )
        lines = [ln for ln in run.stdout.splitlines() if ln.startswith("{")]
        if run.returncode or not lines:
            raise SystemExit(f"{framework} {workload} failed:\n{run.stdout}\n{run.stderr}")
        timing = json.loads(lines[-1])
        report = subprocess.run(
            ["perf", "report", "-i", data, "--stdio", "--no-children", "-g", "none", "--sort", "dso,sym"]
            + ["--percent-limit", "0", "-F", "sample,dso,sym"],
            capture_output=True,
            text=True,
        ).stdout
    samples, symbols = dict.fromkeys(BUCKETS, 0), {}
    for line in report.splitlines():
        m = re.match(r"\s*(\d+)\s+(\S+)\s+\[.\]\s+(.*)$", line)
        if not m:
            continue
        n, dso, sym = int(m.group(1)), m.group(2), m.group(3).strip()
        b = bucket(dso, sym)
        samples[b] += n
        symbols.setdefault(b, []).append((n, f"{dso[:18]}:{sym[:50]}"))
    per_step = period_us / 1e3 / steps
    ms = {b: n * per_step for b, n in samples.items()}
    ms["kernel"] += max(0.0, timing["cpu_ms"] - sum(ms.values()))
    top = {b: sorted(v, reverse=True)[:4] for b, v in symbols.items()}
    return timing, ms, top, per_step


# --- EveryO counts (cProfile) --------------------------------------------------------------
def op_cost():
    """CPU seconds of one op forward + backward on a 1-element tensor (EveryO's fixed cost)."""
    import numpy as np

    import everyo as eo

    x = eo.tensor(np.ones(1, np.float32), requires_grad=True)
    best = float("inf")
    for _ in range(5):
        c0 = time.process_time()
        y = x
        for _ in range(200):
            y = y * x
        eo.sum(y).backward()
        best = min(best, (time.process_time() - c0) / 201)
    return best


def everyo_counts(workload, steps):
    step = everyo_step(workload, "float32")
    for _ in range(2):
        step()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        step()
    prof.disable()
    stats = pstats.Stats(prof).stats
    ops = nodes = blas = conv = 0
    for (file, _line, name), (_cc, nc, _tt, _ct, _callers) in stats.items():
        if file.endswith("dispatch.py") and name == "function":
            ops += nc
        elif name == "_from_op":
            nodes += nc
        elif file.endswith("_blas.py") and name == "matmul":
            blas += nc
        elif name in ("conv2d", "_im2col", "im2col"):
            conv += nc
    return {"ops": ops / steps, "nodes": nodes / steps, "blas_matmul": blas / steps, "op_cost_us": op_cost() * 1e6}


# --- the composite ops of a workload, each framework in its own process ---------------------
# name -> (shape, how many per step); CPU of forward + backward, best of 5, one thread (no spin).
OPS = {
    "cnn": {
        "conv2d 32->64 3x3 b128 14x14": ((128, 14, 14, 32), 1),
        "max_pool2d 2 b128 28x28x32": ((128, 28, 28, 32), 1),
    },
    "encoder": {"layer_norm (2048,128)": ((2048, 128), 4), "softmax (32,4,64,64)": ((32, 4, 64, 64), 2)},
    "gpt": {
        "gelu (2048,512)": ((2048, 512), 4),
        "layer_norm (2048,128)": ((2048, 128), 9),
        "softmax (32,4,64,64)": ((32, 4, 64, 64), 4),
        "cross_entropy (2048,65)": ((2048, 65), 1),
    },
}


def child_ops(framework, workload):
    import numpy as np

    rng = np.random.default_rng(0)
    if framework == "everyo":
        import everyo as eo

        conv, ln = eo.Conv2D(32, 64, 3, padding="same"), eo.LayerNorm(128)
        target = rng.integers(0, 65, 2048)
        fns = {
            "conv2d": conv,
            "max_pool2d": lambda x: eo.max_pool2d(x, 2),
            "layer_norm": ln,
            "softmax": lambda x: eo.softmax(x, axis=-1),
            "gelu": eo.gelu,
            "cross_entropy": lambda x: eo.cross_entropy(x, target),
        }

        def make(shape):
            return eo.tensor(rng.standard_normal(shape, dtype=np.float32), requires_grad=True)

        def total(y):
            return eo.sum(y)
    else:
        import torch

        nn, F = torch.nn, torch.nn.functional
        conv, ln = nn.Conv2d(32, 64, 3, padding="same"), nn.LayerNorm(128)
        target = torch.randint(0, 65, (2048,))
        fns = {
            "conv2d": conv,
            "max_pool2d": lambda x: F.max_pool2d(x, 2),
            "layer_norm": ln,
            "softmax": lambda x: F.softmax(x, -1),
            "gelu": F.gelu,
            "cross_entropy": lambda x: F.cross_entropy(x, target),
        }

        def make(shape):
            if len(shape) == 4 and shape[-1] == 32:  # NHWC in EveryO, NCHW in torch
                shape = (shape[0], shape[3], shape[1], shape[2])
            return torch.randn(shape, requires_grad=True)

        def total(y):
            return y.sum()

    out = {}
    for label, (shape, _count) in OPS[workload].items():
        fn, best = fns[label.split()[0]], float("inf")
        for _ in range(5):
            x = make(shape)
            c0 = time.process_time()
            total(fn(x)).backward()
            best = min(best, time.process_time() - c0)
        out[label] = best * 1e3
    print(json.dumps(out))


def op_table(workload, torch_python):
    got = {}
    for fw, python in (("everyo", sys.executable), ("torch", torch_python)):
        one = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        run = subprocess.run([python, __file__, "--child-ops", fw, workload], capture_output=True, text=True, env=one)
        got[fw] = json.loads(run.stdout.splitlines()[-1]) if run.returncode == 0 else {}
    print(f"  composite ops of {workload}, one thread each (CPU ms fwd+bwd, best of 5; x count = per step):")
    for label, (_shape, count) in OPS[workload].items():
        e, t = got["everyo"].get(label, float("nan")), got["torch"].get(label, float("nan"))
        print(
            f"    {label:<32} x{count}: everyo {e:6.2f} ({e * count:6.1f}/step)  torch {t:6.2f} ({t * count:6.1f}/step)"
        )


# --- the driver ---------------------------------------------------------------------------
def table(workload, results, counts):
    names = list(results)
    print(f"\n== {workload} (float32, per step; CPU ms of all threads; perf task-clock samples) ==")
    print(f"{'bucket':<12}" + "".join(f"{n:>22}" for n in names))
    for b in BUCKETS:
        cells = []
        for n in names:
            timing, ms, _top, _ = results[n]
            cells.append(f"{ms[b]:8.2f} ms {100 * ms[b] / max(timing['cpu_ms'], 1e-9):5.1f}%")
        print(f"{b:<12}" + "".join(f"{c:>22}" for c in cells))
    print(f"{'CPU total':<12}" + "".join(f"{results[n][0]['cpu_ms']:>19.2f} ms" for n in names))
    work = {n: results[n][0]["cpu_ms"] - results[n][1]["blas sync"] for n in names}
    print(f"{'work':<12}" + "".join(f"{work[n]:>19.2f} ms" for n in names) + "   (CPU less blas sync)")
    print(f"{'wall':<12}" + "".join(f"{results[n][0]['wall_ms']:>19.2f} ms" for n in names))
    print(f"{'sys (rusage)':<12}" + "".join(f"{results[n][0]['sys_ms']:>19.2f} ms" for n in names))
    print(f"{'page faults':<12}" + "".join(f"{results[n][0]['faults']:>22.0f}" for n in names))
    if len(names) > 1:
        a, b = results[names[0]][0]["cpu_ms"], results[names[-1]][0]["cpu_ms"]
        w = results[names[0]][0]["wall_ms"] / results[names[-1]][0]["wall_ms"]
        print(
            f"{names[0]} / {names[-1]}: CPU {a / b:.2f}x, work {work[names[0]] / work[names[-1]]:.2f}x, wall {w:.2f}x"
        )
    if counts:
        print(
            f"EveryO per step: {counts['ops']:.0f} ops dispatched, {counts['nodes']:.0f} graph nodes, "
            f"{counts['blas_matmul']:.0f} products through _blas.matmul; one op fwd+bwd on 1 element "
            f"costs {counts['op_cost_us']:.0f} us -> ops x cost = {counts['ops'] * counts['op_cost_us'] / 1e3:.1f} ms"
        )
    for n in names:
        top = results[n][2]
        per = results[n][3]
        for b in ("blas", "blas sync", "elementwise", "copy", "alloc", "dispatch", "jit", "other"):
            if top.get(b):
                syms = ", ".join(f"{s} {c * per:.1f}" for c, s in top[b][:3])
                print(f"  {n} {b}: {syms}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default=",".join(WORKLOADS))
    parser.add_argument("--framework", default="everyo,torch")
    parser.add_argument("--torch-python", default=sys.executable)
    parser.add_argument("--period-us", type=int, default=250)
    parser.add_argument("--kernels", action="store_true", help="EveryO twice: EVERYO_KERNELS=0 and =1")
    parser.add_argument("--one-thread", action="store_true", help="OPENBLAS/OMP_NUM_THREADS=1 in the children")
    parser.add_argument("--no-ops", action="store_true", help="skip the per-op table")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--child-ops", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child[0], args.child[1], int(args.child[2]))
    if args.child_ops:
        return child_ops(*args.child_ops)
    if args.one_thread:
        os.environ.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    has_perf = shutil.which("perf") is not None
    print(f"{time.strftime('%Y-%m-%d %H:%M')}, load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs")
    threads = {v: os.environ.get(v, "default") for v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}
    print("threads:", ", ".join(f"{k}={v}" for k, v in threads.items()), "(torch follows OMP_NUM_THREADS)")
    if not has_perf:
        print("perf is not installed: printing EveryO's op counts only (apt-get install linux-perf)")
    frameworks = args.framework.split(",")
    if (
        "torch" in frameworks
        and subprocess.run([args.torch_python, "-c", "import torch"], capture_output=True).returncode
    ):
        print(f"torch is not importable from {args.torch_python}: EveryO only (pass --torch-python PATH)")
        frameworks.remove("torch")
    for workload in args.workload.split(","):
        counts = everyo_counts(workload, STEPS[workload])
        results = {}
        if has_perf:
            for fw in frameworks:
                python = args.torch_python if fw == "torch" else sys.executable
                if fw == "everyo" and args.kernels:
                    for k in ("0", "1"):
                        env = {"EVERYO_KERNELS": k}
                        results[f"everyo K={k}"] = perf_split(
                            python, fw, workload, STEPS[workload], args.period_us, env
                        )
                else:
                    results[fw] = perf_split(python, fw, workload, STEPS[workload], args.period_us, {})
            table(workload, results, counts)
        else:
            print(workload, json.dumps(counts))
        if not args.no_ops and workload in OPS and "torch" in frameworks:
            op_table(workload, args.torch_python)
    return 0


if __name__ == "__main__":
    sys.exit(main())
