"""Train a small CNN on real handwritten digits, export it to ONNX, and check
that ONNX Runtime gives the same answers as EveryO; then do the same for the
LSTM and the transformer of examples/sequence.py, exported with dynamic batch
and sequence axes and checked at other sizes than the traced one.

    python examples/onnx_export.py [path.onnx]

The data is scikit-learn's bundled 8x8 digits (1797 images, no download).
"""

import ast
import os
import sys
import time

import numpy as np
from sklearn.datasets import load_digits

import everyo as eo
from everyo.onnx import DEFAULT_OPSET


def digits(seed=0):
    """(train_x, train_y, test_x, test_y); images NHWC float32 in [0, 1]."""
    data = load_digits()
    x = (data.images / 16.0).astype(np.float32)[..., None]  # (1797, 8, 8, 1)
    y = data.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(x))
    test, train = order[:360], order[360:]
    return x[train], y[train], x[test], y[test]


def digit_cnn():
    return eo.Sequential(
        eo.Conv2D(1, 8, 3, padding="same", seed=0),  # 8x8x8
        eo.BatchNorm2D(8),
        eo.ReLU(),
        eo.MaxPool2D(2),  # 4x4x8
        eo.Conv2D(8, 16, 3, padding="same", seed=1),  # 4x4x16
        eo.ReLU(),
        eo.MaxPool2D(2),  # 2x2x16
        eo.Flatten(),  # 64, in NHWC order
        eo.Dropout(0.2, seed=2),
        eo.Linear(64, 10, seed=3),
    )


def train(model, x, y, epochs=8):
    optimizer = eo.Adam(model.parameters(), lr=5e-3)
    loader = eo.DataLoader(x, y, batch_size=64, shuffle=True, seed=0)
    model.train()
    for epoch in range(epochs):
        total = 0.0
        for images, labels in loader:
            optimizer.zero_grad()
            loss = eo.cross_entropy(model(images), labels)
            loss.backward()
            optimizer.step()
            total += loss.item() * len(labels.data)
        print(f"  epoch {epoch + 1}: loss {total / len(x):.4f}")


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "digits_cnn.onnx"
    train_x, train_y, test_x, test_y = digits()
    model = digit_cnn()
    print(f"Training a digit CNN on {len(train_x)} 8x8 images ...")
    start = time.perf_counter()
    train(model, train_x, train_y)
    print(f"  trained in {time.perf_counter() - start:.1f} s")

    model.eval()
    with eo.no_grad():
        expected = np.asarray(model(eo.tensor(test_x)).data)
    accuracy = (expected.argmax(axis=1) == test_y).mean()
    print(f"EveryO test accuracy: {accuracy:.1%} on {len(test_x)} held-out images")

    eo.export_onnx(model, path, input_shape=(1, 8, 8, 1), output_name="logits")
    print(f"Exported to {path} (batch axis symbolic, opset {DEFAULT_OPSET})")

    actual = eo.run_onnx(path, test_x)  # all 360 images in one ONNX Runtime call
    single = np.concatenate([eo.run_onnx(path, test_x[i : i + 1]) for i in range(5)])
    diff = np.abs(expected - actual).max()
    same = int((expected.argmax(axis=1) == actual.argmax(axis=1)).sum())
    print(f"ONNX Runtime vs EveryO, max abs difference of the logits: {diff:.2g}")
    print(
        f"  (logits range {expected.min():.1f} .. {expected.max():.1f}; "
        f"batch-1 runs differ by at most {np.abs(single - expected[:5]).max():.2g})"
    )
    print(f"Predictions matching: {same} of {len(test_x)}")
    if same != len(test_x) or diff > 1e-4:
        sys.exit("ONNX Runtime disagrees with EveryO")
    export_sequence_models(path)


def sequence_models():
    """DigitSum (LSTM) and Reverser (transformer) from examples/sequence.py.

    That script trains at import time, so only its constants and class
    definitions are taken from it (one definition of each model, not a copy).
    """
    source = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sequence.py")
    tree = ast.parse(open(source).read(), source)
    keep: list[ast.stmt] = [
        n
        for n in tree.body
        if isinstance(n, (ast.Import, ast.ImportFrom, ast.ClassDef))
        or (
            isinstance(n, ast.Assign)
            and all(isinstance(t, (ast.Name, ast.Tuple)) for t in n.targets)
            and isinstance(n.value, (ast.Constant, ast.Tuple))
        )
    ]
    namespace: dict[str, object] = {}
    exec(compile(ast.Module(body=keep, type_ignores=[]), source, "exec"), namespace)
    return namespace


def fit_briefly(model, target_of, digits, length, steps, lr):
    rng = np.random.default_rng(0)
    optimizer = eo.Adam(model.parameters(), lr=lr)
    model.train()
    for _ in range(steps):
        ids = rng.integers(0, digits, size=(64, length))
        logits = model(ids)
        loss = eo.cross_entropy(logits.reshape(-1, logits.shape[-1]), target_of(ids).reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()


def export_sequence_models(path):
    seq = sequence_models()
    digits, length = seq["DIGITS"], seq["LENGTH"]
    cases = [
        ("LSTM (DigitSum)", seq["DigitSum"](), lambda ids: ids.sum(axis=1), 150, 0.01),
        ("Transformer (Reverser)", seq["Reverser"](), lambda ids: ids[:, ::-1], 100, 0.003),
    ]
    failed = False
    for name, model, target_of, steps, lr in cases:
        start = time.perf_counter()
        fit_briefly(model, target_of, digits, length, steps, lr)
        print(f"\n{name}: trained {steps} steps in {time.perf_counter() - start:.1f} s")
        file = os.path.splitext(path)[0] + ("_lstm.onnx" if "LSTM" in name else "_transformer.onnx")
        # Traced at length - 1 so that the check trace (one longer) stays within
        # the positional table's max_len; verify=True compares every node.
        example = np.random.default_rng(2).integers(0, digits, size=(2, length - 1))
        start = time.perf_counter()
        eo.export_onnx(
            model,
            file,
            example_input=example,
            dynamic_axes={"input": {0: "batch", 1: "seq"}},
            output_name="logits",
            verify=True,
        )
        print(f"  exported to {file} with dynamic batch and sequence, verified ({time.perf_counter() - start:.2f} s)")
        for batch, steps_long in ((1, length), (64, length), (64, length - 2)):
            ids = np.random.default_rng(batch + steps_long).integers(0, digits, size=(batch, steps_long))
            with eo.no_grad():
                expected = np.asarray(model(ids).data)
            actual = eo.run_onnx(file, ids)
            diff = float(np.abs(expected - actual).max())
            same = int((expected.argmax(-1) == actual.argmax(-1)).sum())
            print(
                f"  batch {batch:2d}, length {steps_long}: max abs difference {diff:.2g}, "
                f"predictions matching {same} of {expected.argmax(-1).size}"
            )
            failed |= diff > 1e-4 or same != expected.argmax(-1).size
    if failed:
        sys.exit("ONNX Runtime disagrees with EveryO")


if __name__ == "__main__":
    main()
