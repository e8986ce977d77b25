"""ONNX export time, and ONNX Runtime inference against EveryO's forward pass
for the digit CNN of examples/onnx_export.py at batch 1 and 256, and for the
LSTM and the transformer of examples/sequence.py at batch 1 and 64 (exported
with dynamic batch and sequence axes, as the example does).

    python benchmarks/bench_onnx.py        (or: hatch run bench:run benchmarks/bench_onnx.py)
    python benchmarks/bench_onnx.py --compile-only     (eo.onnx.compile's table alone)

The last table compares EveryO's eager forward, ``eo.onnx.compile`` and ONNX
Runtime alone on the compiled model's own graph (same file, same session
options: one intra-op thread at batch 1, as the compiled model uses) for the digit CNN, an LSTM classifier and a small char GPT.

Candidates run interleaved (A B A B ...) because these machines flip between a
fast and a slow state; ratios are medians of pairwise ratios. Each timed call
runs the step ``inner`` times so that microsecond steps are not lost in timer
noise. The ONNX Runtime session is created once (as a server would); the
run_onnx column also pays for loading the file and building a session.
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

from harness import blas_info, interleaved, machine_info, median_ratio, print_table  # noqa: E402
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


def _both_orders(fns, repeats=8):
    """``interleaved`` run A B ... then B A ...; the rounds of both, per candidate."""
    first = interleaved(fns, repeats=repeats, warmup=1)
    second = interleaved(dict(reversed(list(fns.items()))), repeats=repeats, warmup=0)
    return {k: first[k] + second[k] for k in fns}


def compile_benchmarks(folder):
    """EveryO eager against eo.onnx.compile against ONNX Runtime alone on the
    same graph (the compiled model's own bytes, written to a file, in a session
    with the same options), for the three models of issue 26."""
    from everyo.onnx.engine import session_options

    seq = sequence_models()
    digits, length = seq["DIGITS"], seq["LENGTH"]
    rng = np.random.default_rng(0)
    cases = [
        ("digit CNN", digit_cnn().eval(), lambda b: rng.random((b, 8, 8, 1), dtype=np.float32), None),
        (
            "LSTM classifier (DigitSum)",
            seq["DigitSum"]().eval(),
            lambda b: rng.integers(0, digits, size=(b, length)),
            {"input": {0: "batch", 1: "seq"}},
        ),
        (
            "char GPT (2 layers, width 64, 32 chars)",
            CharGPT().eval(),
            lambda b: rng.integers(0, 65, size=(b, 32)),
            {"input": {0: "batch", 1: "seq"}},
        ),
    ]
    rows = []
    for name, model, make, axes in cases:
        fast = eo.onnx.compile(model, make(2), dynamic_axes=axes)
        assert fast.session is not None, fast.fallback_reason
        path = os.path.join(folder, "compiled.onnx")
        with open(path, "wb") as f:
            f.write(fast._bytes)
        for batch in (1, 256):
            # ORT alone with the options of the session the compiled model picks for this batch
            # (one intra-op thread at batch 1, ORT's choice otherwise).
            raw = ort.InferenceSession(
                path, session_options(ort, 1 if batch == 1 else None), providers=["CPUExecutionProvider"]
            )
            x = make(batch)
            feed = {"input": x}
            fast(x)  # the first call verifies the graph: not the one to size ``inner`` by
            start = time.perf_counter()
            fast(x)
            inner = min(200, max(1, int(0.02 / (time.perf_counter() - start))))  # about 20 ms per timed call

            def eager():
                with eo.no_grad():
                    return model(eo.tensor(x)).data

            # Same numbers first (the first compiled call also verifies), then timings.
            assert np.abs(eager() - fast(x).data).max() < 1e-4
            assert np.abs(raw.run(None, feed)[0] - fast(x).data).max() < 1e-4
            # Two interleaved pairs, so that neither ratio pays for a third candidate's after-effects
            # (BLAS threads still spinning after an eager call slow whatever runs next), each run in
            # both orders (A B ... then B A ...), so that neither always runs right after the other.
            n_eager = max(1, inner // 10)
            compiled_fn, ort_fn = per_call(lambda: fast(x), inner), per_call(lambda: raw.run(None, feed), inner)
            pair = _both_orders({"compiled": compiled_fn, "ort": ort_fn})
            vs = _both_orders({"eager": per_call(eager, n_eager), "compiled": per_call(lambda: fast(x), n_eager)})
            per = {k: [v / inner for v in pair[k]] for k in pair}
            per_vs = {k: [v / n_eager for v in vs[k]] for k in vs}
            rows.append(
                [
                    name,
                    batch,
                    round(statistics.median(per_vs["eager"]) * 1e6),
                    round(statistics.median(per["compiled"]) * 1e6),
                    round(statistics.median(per["ort"]) * 1e6),
                    median_ratio(per["compiled"], per["ort"]),
                    median_ratio(per_vs["eager"], per_vs["compiled"]),
                ]
            )
    print_table(
        "eo.onnx.compile: microseconds per call (medians of 16 interleaved rounds, 8 in each order; compiled/ORT and "
        "eager/compiled each from its own interleaved pair, ratios round by round)",
        ["model", "batch", "EveryO eager", "compiled", "ORT alone", "compiled / ORT", "eager / compiled"],
        rows,
    )


if __name__ == "__main__":
    if "--compile-only" in sys.argv:
        print(machine_info())
        print(f"onnxruntime {ort.__version__}; uptime: {os.popen('uptime').read().strip()}\n")
        with tempfile.TemporaryDirectory() as folder:
            compile_benchmarks(folder)
    else:
        main()
