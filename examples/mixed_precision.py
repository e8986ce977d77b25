"""Mixed precision: what autocast changes, and why GradScaler exists.

    python examples/mixed_precision.py

A small MLP (4-32-1, 193 parameters) learns a smooth regression target. Its
loss is multiplied by LOSS_FACTOR = 2**-20 (and the learning rate divided by
it, so the float32 run trains exactly as usual): the gradients are then around
1e-8, below float16's smallest subnormal (6e-8), the regime that real
networks reach on their own in deep layers or late in training.

It prints two tables:
  1. gradient elements flushed to zero at the first step (an element counts
     as flushed when it is exactly 0 under autocast but non-zero in float32
     for the same weights and batch), without and with GradScaler;
  2. the final float32 MSE after 400 SGD steps for autocast without a
     scaler, autocast with GradScaler, and a float32 reference.
"""
import sys

import numpy as np

import everyo as eo

LOSS_FACTOR = 2.0**-20
LEARNING_RATE = 0.05
MOMENTUM = 0.9


def make_data(rows=512, seed=0):
    """Inputs (rows, 4) and a noisy smooth nonlinear target (rows, 1), float32."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, 4)).astype(np.float32)
    y = 2.0 * np.sin(1.5 * x[:, :1]) + x[:, 1:2] * x[:, 2:3] - 0.5 * x[:, 3:4] ** 2 + 1.0
    y = y + 0.2 * rng.standard_normal(y.shape)  # measurement noise: an MSE floor near 0.04
    return eo.tensor(x), eo.tensor(y.astype(np.float32))


def make_model(hidden=32, seed=0):
    return eo.Sequential(eo.Linear(4, hidden, seed=seed), eo.ReLU(), eo.Linear(hidden, 1, seed=seed + 1))


def scaled_loss(model, x, y, mode):
    """The training loss, LOSS_FACTOR times the MSE; ``mode`` is 'float32' or 'autocast'."""
    if mode == "autocast":
        with eo.autocast():
            predictions = model(x)
    else:
        predictions = model(x)
    return eo.mse_loss(predictions, y) * LOSS_FACTOR


def gradients(model, x, y, mode, scaler=None):
    """Parameter gradients (float32 arrays, unscaled) for one batch."""
    model.zero_grad()
    optimizer = eo.SGD(model.parameters(), lr=0.0)  # only to hand the parameters to the scaler
    loss = scaled_loss(model, x, y, mode)
    if scaler is None:
        loss.backward()
    else:
        scaler.backward(loss)
        scaler.unscale_(optimizer)
    grads = [p.grad.copy() for p in model.parameters()]
    model.zero_grad()
    return grads


def flush_count(model, x, y, use_scaler):
    """(flushed, total): gradient elements that are 0 under autocast but not in float32."""
    reference = gradients(model, x, y, "float32")
    scaler = eo.GradScaler() if use_scaler else None
    mixed = gradients(model, x, y, "autocast", scaler)
    flushed = sum(int(np.count_nonzero((m == 0) & (r != 0))) for m, r in zip(mixed, reference))
    return flushed, sum(r.size for r in reference)


def train(mode, use_scaler, steps=400, rows=512, hidden=32, seed=0):
    """Train a fresh model; returns (final float32 MSE, number of skipped steps)."""
    x, y = make_data(rows, seed)
    model = make_model(hidden, seed)
    # Dividing the learning rate by LOSS_FACTOR undoes the loss factor exactly
    # for SGD, so the float32 run is ordinary training.
    optimizer = eo.SGD(model.parameters(), lr=LEARNING_RATE / LOSS_FACTOR, momentum=MOMENTUM)
    scaler = eo.GradScaler() if use_scaler else None
    skipped = 0
    for _ in range(steps):
        optimizer.zero_grad()
        loss = scaled_loss(model, x, y, mode)
        if scaler is None:
            loss.backward()
            optimizer.step()
        else:
            scaler.backward(loss)
            skipped += not scaler.step(optimizer)
            scaler.update()
    with eo.no_grad():
        final = eo.mse_loss(model(x), y).item()
    return final, skipped


def main():
    x, y = make_data()
    model = make_model()
    no_scaler = flush_count(model, x, y, use_scaler=False)
    with_scaler = flush_count(model, x, y, use_scaler=True)
    total = no_scaler[1]
    print(f"Gradient elements flushed to zero ({total} total, first step, loss x 2**-20)")
    print(f"  no GradScaler ........ {no_scaler[0]:>3} / {total}")
    print(f"  with GradScaler ...... {with_scaler[0]:>3} / {total}")
    print()

    mse_plain, _ = train("autocast", use_scaler=False)
    mse_scaled, skipped = train("autocast", use_scaler=True)
    mse_ref, _ = train("float32", use_scaler=False)
    print("Final MSE after 400 steps")
    print(f"  autocast, no scaler .. {mse_plain:.4f}")
    print(f"  autocast + scaler .... {mse_scaled:.4f}      float32 reference: {mse_ref:.4f}")
    print(f"  (GradScaler skipped {skipped} of 400 steps)")
    print()
    print("On a CPU, mixed precision saves memory, not time: NumPy has no native float16\n"
          "arithmetic, so EveryO upcasts to float32 to compute and rounds back. The numerics\n"
          "are float16's; the speed is not a GPU's.")

    # The example is also a check: fail loudly if the effect is not there.
    ok = (no_scaler[0] > 0.9 * total and with_scaler[0] < 0.05 * total
          and abs(mse_scaled - mse_ref) <= 0.05 * mse_ref and mse_plain > 5 * mse_ref)
    if not ok:
        print("UNEXPECTED: the figures above do not show the loss-scaling effect", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
