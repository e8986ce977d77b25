"""End-to-end: the layers, losses, optimizers and DataLoader learn."""

import numpy as np
from digits import make_digits

import everyo as eo


def digit_cnn(seed=0):
    return eo.Sequential(
        eo.Conv2D(1, 16, 3, padding="same", seed=seed),
        eo.ReLU(),
        eo.MaxPool2D(2),
        eo.Flatten(),
        eo.Linear(4 * 4 * 16, 10, seed=seed + 1),
    )


def test_digit_cnn_reaches_95_percent_training_accuracy():
    x, y = make_digits(600, seed=0)
    model = digit_cnn()
    opt = eo.Adam(model.parameters(), lr=0.01)
    loss_fn = eo.CrossEntropyLoss()
    loader = eo.DataLoader(x, y, batch_size=64, shuffle=True, seed=0)
    for _ in range(40):
        for batch, targets in loader:
            opt.zero_grad()
            loss = loss_fn(model(batch), targets)
            loss.backward()
            opt.step()
    model.eval()
    with eo.no_grad():
        accuracy = (model(eo.tensor(x)).data.argmax(axis=1) == y).mean()
    assert accuracy >= 0.95, f"training accuracy {accuracy:.3f}"


def test_spec_mlp_regression_loss_decreases_with_sgd():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((256, 8)).astype(np.float32)
    y = (x[:, :1] * 0.5 - x[:, 1:2]).astype(np.float32)
    model = eo.Sequential(eo.Linear(8, 16, seed=0), eo.ReLU(), eo.Linear(16, 1, seed=1))
    opt = eo.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for _ in range(100):
        opt.zero_grad()
        residual = model(eo.tensor(x)) - eo.tensor(y)
        loss = eo.mean(residual * residual)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.05 * losses[0]


def test_bce_classifier_learns_a_linear_boundary():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((300, 2)).astype(np.float32)
    y = (x[:, :1] + x[:, 1:] > 0).astype(np.float32)
    model = eo.Sequential(eo.Linear(2, 1, seed=0))
    opt = eo.AdamW(model.parameters(), lr=0.1)
    for _ in range(100):
        opt.zero_grad()
        eo.BCEWithLogitsLoss()(model(eo.tensor(x)), eo.tensor(y)).backward()
        opt.step()
    assert ((model(eo.tensor(x)).data > 0) == (y > 0)).mean() > 0.97
