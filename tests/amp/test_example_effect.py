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


def test_training_stalls_without_scaler_and_matches_float32_with_it(example):
    kwargs = dict(steps=120, rows=512, hidden=16, seed=3)
    x, y = example.make_data(rows=512, seed=3)
    initial = ((example.make_model(hidden=16, seed=3)(x) - y) ** 2).mean().item()
    plain, _ = example.train("autocast", use_scaler=False, **kwargs)
    scaled, skipped = example.train("autocast", use_scaler=True, **kwargs)
    reference, _ = example.train("float32", use_scaler=False, **kwargs)
    assert reference < 0.5 * initial  # the float32 run really trains
    assert plain > 0.9 * initial  # no scaler: (almost) nothing moved
    assert abs(scaled - reference) <= 0.05 * reference
    assert skipped == 0
