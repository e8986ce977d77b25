"""ONNX export time, and ONNX Runtime inference against EveryO's forward pass
for the digit CNN of examples/onnx_export.py at batch 1 and 256, and for the
LSTM and the transformer of examples/sequence.py at batch 1 and 64 (exported
with dynamic batch and sequence axes, as the example does).

    python benchmarks/bench_onnx.py        (or: hatch run bench:run benchmarks/bench_onnx.py)
    python benchmarks/bench_onnx.py --compile-only     (eo.onnx.compile's table alone)

The last table compares EveryO's eager forward, ``eo.onnx.compile`` and ONNX
Runtime alone on the compiled model's own graph (same file, same session
options: one intra-op thread at batch 1, as the compiled model uses) for the
digit CNN, an LSTM classifier and a small char GPT, and says whether issue 26's
targets are met. As issue 24's harness rule asks of cross-library figures, each
candidate runs in its own process (``--child``), processes alternating eager,
compiled, ORT, eager ... for 3 rounds; figures are ratios of medians.

The other tables time candidates interleaved in one process (A B A B ...)
because these machines flip between a fast and a slow state; ratios are
medians of pairwise ratios. Each timed call runs the step ``inner`` times so
that microsecond steps are not lost in timer noise. The ONNX Runtime session
is created once (as a server would); the run_onnx column also pays for loading
the file and building a session.
"""

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "examples"))

from harness import (  # noqa: E402
    alternate_processes,
    blas_info,
    interleaved,
    machine_info,
    median_ratio,
    print_table,
    ratio_of_medians,
)
from onnx_export import digit_cnn, sequence_models  # noqa: E402  (the examples' models, not copies)

import everyo as eo  # noqa: E402
from everyo.onnx import build_model  # noqa: E402


def _session(path):
    options = ort.SessionOptions()
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def per_call(fn, inner):
    def run():
        for _ in range(inner):
            fn()

    return run


def main():
    print(machine_info())
    print(f"BLAS: {blas_info()}")
    print(
        f"onnxruntime {ort.__version__}, default session options (all graph optimisations, intra-op threads "
        f"chosen by ORT) except no spin-waiting: ORT's spinning threads would take the cores from the "
        f"EveryO call interleaved after it (and OpenBLAS's from ORT)\n"
    )
    model = digit_cnn().eval()
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "digits_cnn.onnx")

        t = interleaved(
            {
                "build_model (in memory, checked)": lambda: build_model(model, input_shape=(1, 8, 8, 1)),
                "export_onnx (build + atomic write)": lambda: eo.export_onnx(model, path, input_shape=(1, 8, 8, 1)),
            },
            repeats=15,
            warmup=2,
        )
        print_table(
            "Export of the digit CNN", ["step", "median ms"], [[k, statistics.median(v) * 1e3] for k, v in t.items()]
        )

        session = _session(path)
        rows = []
        for batch, inner in ((1, 200), (256, 10)):
            x = np.random.default_rng(0).random((batch, 8, 8, 1), dtype=np.float32)

            def everyo_forward():
                with eo.no_grad():
                    return model(eo.tensor(x)).data

            def ort_run():
                return session.run(None, {"input": x})[0]

            # Same numbers first, then timings.
            assert np.abs(everyo_forward() - ort_run()).max() < 1e-5
            t = interleaved(
                {
                    "everyo": per_call(everyo_forward, inner),
                    "ort": per_call(ort_run, inner),
                    "run_onnx": per_call(lambda: eo.run_onnx(path, x), max(1, inner // 10)),
                },
                repeats=9,
                warmup=1,
            )
            us = {
                k: statistics.median(v) / (inner if k != "run_onnx" else max(1, inner // 10)) * 1e6
                for k, v in t.items()
            }
            rows.append(
                [
                    batch,
                    round(us["everyo"]),
                    round(us["ort"]),
                    median_ratio(t["everyo"], t["ort"]),
                    round(us["run_onnx"]),
                ]
            )
        print_table(
            "Digit CNN inference (eval mode), microseconds per call",
            ["batch", "EveryO forward us", "ORT session.run us", "EveryO / ORT", "run_onnx us"],
            rows,
        )
        sequence_benchmarks(folder)
        compile_benchmarks(folder)


def sequence_benchmarks(folder):
    seq = sequence_models()
    digits, length = seq["DIGITS"], seq["LENGTH"]
    axes = {"input": {0: "batch", 1: "seq"}}
    example = np.random.default_rng(0).integers(0, digits, size=(2, length - 1))
    models = {"LSTM (DigitSum)": seq["DigitSum"]().eval(), "Transformer (Reverser)": seq["Reverser"]().eval()}
    export_rows, rows = [], []
    for name, model in models.items():
        path = os.path.join(folder, "seq.onnx")
        t = interleaved(
            {
                "build_model": lambda: build_model(model, example_input=example, dynamic_axes=axes),
                "export_onnx": lambda: eo.export_onnx(model, path, example_input=example, dynamic_axes=axes),
                "export_onnx(verify=True)": lambda: eo.export_onnx(
                    model, path, example_input=example, dynamic_axes=axes, verify=True
                ),
            },
            repeats=5,
            warmup=1,
        )
        export_rows += [[name, k, statistics.median(v) * 1e3] for k, v in t.items()]
        eo.export_onnx(model, path, example_input=example, dynamic_axes=axes)
        session = _session(path)
        for batch, inner in ((1, 50), (64, 5)):
            ids = np.random.default_rng(batch).integers(0, digits, size=(batch, length))

            def everyo_forward():
                with eo.no_grad():
                    return model(ids).data

            def ort_run():
                return session.run(None, {"input": ids})[0]

            assert np.abs(everyo_forward() - ort_run()).max() < 1e-5
            t = interleaved(
                {"everyo": per_call(everyo_forward, inner), "ort": per_call(ort_run, inner)}, repeats=7, warmup=1
            )
            us = {k: statistics.median(v) / inner * 1e6 for k, v in t.items()}
            rows.append([name, batch, round(us["everyo"]), round(us["ort"]), median_ratio(t["everyo"], t["ort"])])
    print_table(
        "Export of the sequence models (dynamic batch and sequence)", ["model", "step", "median ms"], export_rows
    )
    print_table(
        f"Sequence model inference (eval mode, length {length}), microseconds per call",
        ["model", "batch", "EveryO forward us", "ORT session.run us", "EveryO / ORT"],
        rows,
    )


class CharGPT(eo.Module):
    """A small character-level GPT (pre-norm causal transformer, learned positions)."""

    def __init__(self, vocab=65, block=64, width=64, layers=2, heads=4):
        super().__init__()
        self.tok = eo.Embedding(vocab, width, seed=0)
        self.pos = eo.Embedding(block, width, seed=1)
        self.blocks = eo.TransformerEncoder(
            layers, width, heads, dim_feedforward=4 * width, dropout=0.0, norm_first=True, seed=2
        )
        self.head = eo.Linear(width, vocab, seed=3)

    def forward(self, ids):
        positions = eo.arange(ids.shape[1])  # a symbolic length while exporting
        return self.head(self.blocks(self.tok(ids) + self.pos(positions), is_causal=True))


def _cases():
    """name -> (model, make(batch) -> input, dynamic axes): issue 26's three models (seeded, so a
    model built in one process has the weights of the same model built in another)."""
    seq = sequence_models()
    digits, length = seq["DIGITS"], seq["LENGTH"]
    rng = np.random.default_rng(0)
    return {
        "digit CNN": (digit_cnn().eval(), lambda b: rng.random((b, 8, 8, 1), dtype=np.float32), None),
        "LSTM classifier (DigitSum)": (
            seq["DigitSum"]().eval(),
            lambda b: rng.integers(0, digits, size=(b, length)),
            {"input": {0: "batch", 1: "seq"}},
        ),
        "char GPT (2 layers, width 64, 32 chars)": (
            CharGPT().eval(),
            lambda b: rng.integers(0, 65, size=(b, 32)),
            {"input": {0: "batch", 1: "seq"}},
        ),
    }


def child(kind, name, batch, path):
    """One candidate alone in this process: microseconds per call (median of 15 timed runs of
    about 20 ms each, after the warm-up and, for ``compiled``, its verifying first call), printed as JSON."""
    import json

    from everyo.onnx.engine import session_options

    model, make, axes = _cases()[name]
    x = make(batch)
    if kind == "eager":

        def call():
            with eo.no_grad():
                return model(eo.tensor(x))

    elif kind == "compiled":
        fast = eo.onnx.compile(model, make(2), dynamic_axes=axes)
        assert fast.session is not None, fast.fallback_reason
        call = lambda: fast(x)  # noqa: E731
    else:  # ONNX Runtime alone on the compiled model's graph, with the session options the compiled model picks
        raw = ort.InferenceSession(
            path, session_options(ort, 1 if batch == 1 else None), providers=["CPUExecutionProvider"]
        )
        feed = {"input": x}
        call = lambda: raw.run(None, feed)  # noqa: E731
    call()
    start = time.perf_counter()
    call()
    inner = min(2000, max(1, int(0.02 / (time.perf_counter() - start))))
    times = []
    for _ in range(16):
        time.sleep(0.05)
        start = time.perf_counter()
        for _ in range(inner):
            call()
        times.append((time.perf_counter() - start) / inner)
    print(json.dumps({"us": statistics.median(times[1:]) * 1e6}))


def compile_benchmarks(folder, rounds=3):
    """EveryO eager against eo.onnx.compile against ONNX Runtime alone on the
    same graph (the compiled model's own bytes, written to a file, in a session
    with the same options), for the three models of issue 26: each candidate
    in its own process, processes alternating (eager, compiled, ORT, eager ...)
    for ``rounds``; figures are medians over processes, ratios of those medians."""
    rows = []
    for name, (model, make, axes) in _cases().items():
        fast = eo.onnx.compile(model, make(2), dynamic_axes=axes)
        assert fast.session is not None, fast.fallback_reason
        x = make(3)
        assert np.abs(_eager_forward(model, x) - fast(x).data).max() < 1e-4  # same numbers before timings
        path = os.path.join(folder, "compiled.onnx")
        with open(path, "wb") as f:
            f.write(fast._bytes)
        for batch in (1, 256):
            me = [sys.executable, str(Path(__file__).resolve()), "--child"]
            commands = {kind: [*me, kind, name, str(batch), path] for kind in ("eager", "compiled", "ort")}
            got = alternate_processes(commands, rounds=rounds)
            us = {kind: [r["us"] for r in got[kind]] for kind in got}
            to_ort = ratio_of_medians(us["compiled"], us["ort"])
            speedup = ratio_of_medians(us["eager"], us["compiled"])
            rows.append(
                [
                    name,
                    batch,
                    *(round(statistics.median(us[k]), 1) for k in ("eager", "compiled", "ort")),
                    f"{to_ort:.2f} ({'met' if to_ort <= 1.2 else 'MISSED'})",
                    f"{speedup:.1f}" + (f" ({'met' if speedup >= 5 else 'MISSED'})" if batch == 1 else ""),
                ]
            )
    print_table(
        f"eo.onnx.compile: microseconds per call (each candidate in its own process, {rounds} rounds of alternating "
        "processes; ratios of medians). Targets (issue 26): compiled / ORT <= 1.2 at each batch, eager / compiled "
        ">= 5 at batch 1",
        ["model", "batch", "EveryO eager", "compiled", "ORT alone", "compiled / ORT", "eager / compiled"],
        rows,
    )


def _eager_forward(model, x):
    with eo.no_grad():
        return np.asarray(model(eo.tensor(x)).data)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        kind, name, batch, path = sys.argv[2:6]
        child(kind, name, int(batch), path)
    elif "--compile-only" in sys.argv:
        print(machine_info())
        print(f"onnxruntime {ort.__version__}; uptime: {os.popen('uptime').read().strip()}\n")
        with tempfile.TemporaryDirectory() as folder:
            compile_benchmarks(folder)
    else:
        main()
