"""Mixed precision on this CPU: time of one training step and memory held by
saved activations, autocast against float32, for the four workloads of issue 14.

    python benchmarks/bench_amp.py [repeats]     (or: hatch run bench:run benchmarks/bench_amp.py)

Workloads (one SGD step: forward, loss, backward, optimizer step):

- seed MLP 64-128-128-1 on 4096 rows, MSE; float16 (+ GradScaler) and bfloat16 (no scaler);
- digit CNN with BatchNorm and Dropout: Conv2D(1,16,3,'same')-BatchNorm2D-ReLU-MaxPool2D-
  Conv2D(16,32,3,'same')-BatchNorm2D-ReLU-MaxPool2D-Flatten-Dropout(0.25)-Linear(128,10),
  8x8x1 images, batch 512, cross-entropy; float16 (+ GradScaler);
- 2-layer transformer encoder (d_model 64, 4 heads, feed-forward 128, dropout 0.1) with a
  hand-written tanh GELU (``eo.tanh``, ``*``, ``+``), batch 32 x 32 tokens, MSE; float16.

Steps run interleaved (float32, autocast, float32, ...) and a ratio is the median of
the pairwise ratios, because these 2-core machines flip between a fast and a slow
state every few seconds. Times are taken with BLAS as configured and limited to one
thread (threadpoolctl). PyTorch's CPU autocast runs in its own process:
``benchmarks/bench_vs_torch.py``.
Memory: bytes NumPy still holds after forward + loss with the graph alive
(tracemalloc), i.e. the saved activations.

Where the time goes: a third copy of each model steps under autocast with its large
16-bit <-> float32 conversions replaced by precomputed arrays of the right shape and
type (``free_conversions``: the values are wrong, so that copy trains on garbage, but
everything else a step does, the inf/NaN scans around the converter included, takes its
real time), in the same rounds. "autocast, free conversions / float32" is then what the
step would cost if converting cost nothing; the difference to the real ratio is what
the conversions cost. A fourth copy skips the inf/NaN scans too (what is left is the
float32 work and the Python of the 16-bit path).

The table says which float16 <-> float32 converter large arrays went through:
everyo-kernels' compiled conversions when it is installed and active, else
onnxruntime's Cast when onnxruntime is installed (``everyo-amp[fast]``, see
``everyo.amp.fast_casts``), else NumPy's; ``EVERYO_KERNELS=0 EVERYO_AMP_CASTS=numpy
python benchmarks/bench_amp.py`` times the same steps with NumPy's conversions
(``EVERYO_AMP_CASTS=numpy`` alone leaves the compiled kernels on).
"""

import contextlib
import math
import os
import statistics
import sys
import tracemalloc

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import blas_info, interleaved, machine_info, median_ratio, print_table  # noqa: E402

import everyo as eo  # noqa: E402

GELU_C = math.sqrt(2.0 / math.pi)


def gelu(x):
    """The tanh GELU, written by hand from primitives (what a user would write)."""
    return 0.5 * x * (1.0 + eo.tanh(GELU_C * (x + 0.044715 * x * x * x)))


def mlp_case():
    rng = np.random.default_rng(0)
    x = eo.tensor(rng.standard_normal((4096, 64)).astype(np.float32))
    y = eo.tensor(rng.standard_normal((4096, 1)).astype(np.float32))

    def make():
        return eo.Sequential(
            eo.Linear(64, 128, seed=0), eo.ReLU(), eo.Linear(128, 128, seed=1), eo.ReLU(), eo.Linear(128, 1, seed=2)
        )

    return make, x, y, eo.mse_loss


def cnn_case():
    rng = np.random.default_rng(1)
    x = eo.tensor(rng.standard_normal((512, 8, 8, 1)).astype(np.float32))
    y = rng.integers(0, 10, size=512)

    def make():
        return eo.Sequential(
            eo.Conv2D(1, 16, 3, padding="same", seed=0),
            eo.BatchNorm2D(16),
            eo.ReLU(),
            eo.MaxPool2D(2),
            eo.Conv2D(16, 32, 3, padding="same", seed=1),
            eo.BatchNorm2D(32),
            eo.ReLU(),
            eo.MaxPool2D(2),
            eo.Flatten(),
            eo.Dropout(0.25, seed=3),
            eo.Linear(32 * 2 * 2, 10, seed=2),
        )

    return make, x, y, eo.cross_entropy


def transformer_case():
    rng = np.random.default_rng(2)
    x = eo.tensor(rng.standard_normal((32, 32, 64)).astype(np.float32))
    y = eo.tensor(rng.standard_normal((32, 32, 64)).astype(np.float32))

    def make():
        return eo.TransformerEncoder(2, 64, 4, dim_feedforward=128, dropout=0.1, activation=gelu, seed=0)

    return make, x, y, eo.mse_loss


# (name, case, autocast dtype, GradScaler?, the target for autocast/float32: issue 24's
# for the transformer (<= 1.3) and the bfloat16 MLP (<= 1.15), issue 14's for the others)
WORKLOADS = [
    ("seed MLP, float16", mlp_case, "float16", True, 1.5),
    ("digit CNN + BN + Dropout, float16", cnn_case, "float16", True, 1.5),
    ("2-layer transformer, tanh GELU, float16", transformer_case, "float16", True, 1.3),
    ("seed MLP, bfloat16", mlp_case, "bfloat16", False, 1.15),
]


class _FreeCasts:
    """A float16 converter for core (``everyo.half.set_cast_kernel``) that converts
    nothing: it returns a precomputed array of the right size and type (0.01 in every
    place). Only for timing: see the module docstring."""

    def __init__(self):
        self._cache = {}

    def array(self, n, dtype):
        key = (n, np.dtype(dtype))
        if key not in self._cache:
            self._cache[key] = np.full(n, 0.01, dtype)
        return self._cache[key]

    def down(self, x):
        return self.array(x.size, np.float16)

    def up(self, h):
        return self.array(h.size, np.float32)


@contextlib.contextmanager
def free_conversions(free, scans=True):
    """Large float16 and bfloat16 conversions (4,096 values or more, the arrays the
    converter gets) replaced by the precomputed arrays of ``free`` (a :class:`_FreeCasts`
    kept across steps, so that no step pays for making them), for the "free conversions"
    column; ``scans=False`` also skips core's inf/NaN scans of what the converter returns."""
    import everyo.casting as casting
    import everyo.half as half

    large = half._KERNEL_MIN

    def stand_in(original, make):
        def run(x, *rest):
            return original(x, *rest) if x.size < large else make(x, *rest).reshape(x.shape)

        return run

    patches = [
        (half, "_bfloat16_to_float", lambda b: free.array(b.size, np.float32)),
        (half, "_round_to_bfloat16", lambda x: free.array(x.size, np.float32)),
        (half, "_bfloat16_codes", lambda x: free.array(x.size, np.uint16)),
        (half, "_exact_to_bfloat16", lambda x, dtype: free.array(x.size, np.uint16).view(dtype)),
        (casting, "_bfloat16_to_float", lambda b: free.array(b.size, np.float32)),
        (casting, "_float_to_bfloat16", lambda x, dtype: free.array(x.size, np.uint16).view(dtype)),
    ]
    saved = [(module, name, getattr(module, name)) for module, name, _ in patches]
    saved.append((half, "_special_codes", half._special_codes))
    saved.append((half, "_compiled_half", half._compiled_half))
    # everyo-kernels' float16 conversions come before an installed converter: off, so ``free`` is asked
    half._compiled_half = lambda name, x, *rest: (None, None, None)
    previous = half.set_cast_kernel(free)
    for module, name, make in patches:
        setattr(module, name, stand_in(getattr(module, name), make))
    if not scans:
        half._special_codes = lambda h: False
    try:
        yield
    finally:
        half.set_cast_kernel(previous)
        for module, name, original in saved:
            setattr(module, name, original)


def float32_step(model, optimizer, x, y, loss_fn):
    optimizer.zero_grad()
    loss_fn(model(x), y).backward()
    optimizer.step()


def autocast_step(model, optimizer, x, y, loss_fn, scaler, dtype):
    optimizer.zero_grad()
    with eo.autocast(dtype=dtype):
        out = model(x)
    scaler.backward(loss_fn(out, y))
    scaler.step(optimizer)
    scaler.update()


def saved_activation_bytes(model, x, y, loss_fn, dtype):
    """Bytes NumPy holds after forward + loss (graph alive)."""
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    with eo.autocast(enabled=dtype is not None, dtype=dtype or "float16"):
        out = model(x)
    loss = loss_fn(out, y)
    held = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del loss, out
    return held - base


def blas_threads(n):
    """Context limiting BLAS (and torch) to ``n`` threads (None: as configured)."""
    if n is None:
        return contextlib.nullcontext()
    from threadpoolctl import threadpool_limits

    return threadpool_limits(n, user_api="blas")


def time_workload(name, case, dtype, scaled, repeats):
    """Interleaved step times (each after harness.IDLE_GAP): EveryO float32 and autocast,
    and the free-conversion copies. PyTorch runs in its own process (bench_vs_torch.py)."""
    make, x, y, loss_fn = case()
    model32, modelmp = make(), make()  # separate identical copies, each trains its own weights
    opt32 = eo.SGD(model32.parameters(), lr=1e-3)
    optmp = eo.SGD(modelmp.parameters(), lr=1e-3)
    scaler = eo.GradScaler(enabled=scaled)

    def free_step(scans):
        model = make()  # trains on garbage values: a copy of its own
        opt, free_scaler = eo.SGD(model.parameters(), lr=1e-3), eo.GradScaler(enabled=scaled)
        free = _FreeCasts()  # its arrays are made in the warm-up rounds, not timed

        def step():
            with free_conversions(free, scans):
                autocast_step(model, opt, x, y, loss_fn, free_scaler, dtype)

        return step

    fns = {
        "float32": lambda: float32_step(model32, opt32, x, y, loss_fn),
        "autocast": lambda: autocast_step(modelmp, optmp, x, y, loss_fn, scaler, dtype),
        "free conversions": free_step(scans=True),
        "free conversions and scans": free_step(scans=False),
    }
    times = interleaved(fns, repeats=repeats, warmup=2)
    return (
        {k: statistics.median(v) for k, v in times.items()},
        {k: median_ratio(v, times["float32"]) for k, v in times.items()},
        times,
    )


def memory_ratio(case, dtype):
    """Saved activations under autocast / float32, counted with NumPy's own conversions.

    tracemalloc sees only what NumPy allocates: arrays onnxruntime's converter
    returns live in its memory, invisible to it, and would make the ratio look
    smaller than it is. The arrays kept are the same (shapes and dtypes) with
    either converter, so the count is made without it."""
    import everyo.amp  # noqa: F401  (first: importing it installs the converter when none is set)
    import everyo.half as half
    from everyo import _buffers

    previous = half.set_cast_kernel(None)
    try:
        with _buffers.suspended():  # a recycled buffer is no allocation tracemalloc could count
            make, x, y, loss_fn = case()
            model = make()
            saved_activation_bytes(model, x, y, loss_fn, dtype)  # warm-up: first-use imports are not activations
            held = saved_activation_bytes(model, x, y, loss_fn, dtype)
            return held / saved_activation_bytes(model, x, y, loss_fn, None)
    finally:
        half.set_cast_kernel(previous)


def main(repeats=9):
    print(machine_info())
    print("BLAS:", blas_info())
    print("PyTorch's CPU autocast, each framework alone in its own process: python benchmarks/bench_vs_torch.py")
    print()
    rows = []
    for threads in (None, 1):
        label = "default" if threads is None else "1"
        with blas_threads(threads):
            for name, case, dtype, scaled, target in WORKLOADS:
                medians, ratios, _ = time_workload(name, case, dtype, scaled, repeats)
                ratio = ratios["autocast"]
                row = [
                    name,
                    label,
                    medians["float32"] * 1e3,
                    medians["autocast"] * 1e3,
                    ratio,
                    f"<= {target}",
                    "yes" if ratio <= target else "NO",
                    ratios["free conversions"],
                    ratios["free conversions and scans"],
                ]
                rows.append(row)
    headers = [
        "workload",
        "BLAS threads",
        "float32 ms",
        "autocast ms",
        "ratio",
        "target",
        "met",
        "free conv.",
        "+ free scans",
    ]
    print_table(
        "One SGD training step, autocast vs float32 (float16 steps include GradScaler)\n"
        "times: medians of interleaved runs; ratio: median of pairwise ratios autocast/float32;\n"
        "free conv.: the same ratio for a copy whose large 16-bit conversions cost nothing (see docstring);\n"
        "+ free scans: and whose inf/NaN scans of the converter's results are skipped too",
        headers,
        rows,
    )
    import everyo.amp

    # Large float16 <-> float32 conversions: everyo-kernels' when active, else onnxruntime's Cast
    # when installed (everyo-amp[fast]), else NumPy; EVERYO_KERNELS=0 EVERYO_AMP_CASTS=numpy
    # forces NumPy's for a side-by-side run.
    print(f"float16 <-> float32 conversions of large arrays: {everyo.amp.cast_backend()}")
    print()
    mem = [[name, memory_ratio(case, dtype), "<= 0.6"] for name, case, dtype, _, _ in WORKLOADS]
    print_table(
        "Saved activations under autocast / float32 (bytes NumPy holds after forward + loss)",
        ["workload", "ratio", "target"],
        mem,
    )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 9)
