"""End to end: a digit CNN trained under autocast + GradScaler learns as well
as the same CNN trained in float32 (same data, seeds and steps)."""

import importlib.util
from pathlib import Path

import numpy as np

import everyo as eo

DIGITS = Path(__file__).resolve().parents[1] / "core" / "digits.py"


def load_digits(n, seed):
    spec = importlib.util.spec_from_file_location("everyo_test_digits", DIGITS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.make_digits(n, seed=seed)


def make_cnn():
    return eo.Sequential(
        eo.Conv2D(1, 16, 3, padding="same", seed=0),
        eo.ReLU(),
        eo.MaxPool2D(2),
        eo.Flatten(),
        eo.Linear(4 * 4 * 16, 10, seed=1),
    )


def train(images, labels, mixed, steps=300, batch=64):
    model = make_cnn()
    optimizer = eo.Adam(model.parameters(), lr=1e-2)
    scaler = eo.GradScaler(enabled=mixed)
    rng = np.random.default_rng(0)
    for _ in range(steps):
        idx = rng.integers(0, len(labels), batch)
        x = eo.tensor(images[idx])
        optimizer.zero_grad()
        with eo.autocast(enabled=mixed):
            logits = model(x)
            loss = eo.cross_entropy(logits, labels[idx])  # float32 even under autocast
        assert loss.dtype == "float32"
        if mixed:
            assert logits.dtype == "float16"
        scaler.backward(loss)
        scaler.step(optimizer)
        scaler.update()
    with eo.no_grad():
        predictions = model(eo.tensor(images)).data.argmax(axis=1)
    return float((predictions == labels).mean())


def test_autocast_training_matches_float32_accuracy():
    images, labels = load_digits(600, seed=1)
    accuracy32 = train(images, labels, mixed=False)
    accuracy16 = train(images, labels, mixed=True)
    assert accuracy32 > 0.95  # the float32 run really learned
    assert abs(accuracy16 - accuracy32) <= 0.05
