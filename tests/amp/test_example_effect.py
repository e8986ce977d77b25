"""The loss-scaling effect of examples/mixed_precision.py, at a smaller size:
without GradScaler tiny float16 gradients flush to zero and training stalls;
with it almost none flush and training matches a float32 run."""

import importlib.util
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "mixed_precision.py"


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("mixed_precision_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # defines functions only; main() is not run
    return module


def test_flush_counts(example):
    x, y = example.make_data(rows=512, seed=3)
    model = example.make_model(hidden=16, seed=3)
    flushed, total = example.flush_count(model, x, y, use_scaler=False)
    assert total == 16 * 4 + 16 + 16 + 1
    assert flushed >= 0.9 * total
    flushed_scaled, _ = example.flush_count(model, x, y, use_scaler=True)
    assert flushed_scaled <= 0.05 * total
    flushed_bf16, _ = example.flush_count(model, x, y, use_scaler=False, mode="bfloat16")
    assert flushed_bf16 <= 0.05 * total  # float32's exponent range: nothing to flush, no scaler needed


def test_training_stalls_without_scaler_and_matches_float32_with_it(example):
    kwargs = dict(steps=120, rows=512, hidden=16, seed=3)
    x, y = example.make_data(rows=512, seed=3)
    initial = ((example.make_model(hidden=16, seed=3)(x) - y) ** 2).mean().item()
    plain, _, _ = example.train("autocast", use_scaler=False, **kwargs)
    scaled, skipped, _ = example.train("autocast", use_scaler=True, **kwargs)
    bf16, _, curve = example.train("bfloat16", use_scaler=False, **kwargs)
    reference, _, _ = example.train("float32", use_scaler=False, **kwargs)
    assert reference < 0.5 * initial  # the float32 run really trains
    assert plain > 0.9 * initial  # no scaler: (almost) nothing moved
    assert abs(scaled - reference) <= 0.05 * reference
    assert abs(bf16 - reference) <= 0.05 * reference
    assert skipped == 0
    assert len(curve) == 120 and curve[-1] < 0.5 * curve[0]


def test_loss_curves_png(example, tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "curves.png"
    curves = {
        "float16, no GradScaler": [4.0, 4.0],
        "float16 + GradScaler": [4.0, 1.0],
        "bfloat16, no GradScaler": [4.0, 1.1],
        "float32 reference": [4.0, 1.0],
    }
    assert example.plot_curves(curves, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
