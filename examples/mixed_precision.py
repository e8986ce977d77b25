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
     for the same weights and batch): float16 without and with GradScaler,
     and bfloat16 without one;
  2. the final float32 MSE after 400 SGD steps, three ways: float16 autocast
     without a scaler, float16 with GradScaler, bfloat16 autocast without a
     scaler (float32's exponent range: nothing to flush), beside a float32
     reference.

When matplotlib imports it also writes the four loss curves to
mixed_precision_loss.png (or the path given as the first argument).
"""

import os
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


MODES = {"autocast": "float16", "bfloat16": "bfloat16"}  # autocast modes and their 16-bit type


def scaled_loss(model, x, y, mode):
    """The training loss, LOSS_FACTOR times the MSE; ``mode`` is 'float32',
    'autocast' (float16) or 'bfloat16'."""
    if mode in MODES:
        with eo.autocast(dtype=MODES[mode]):
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


def flush_count(model, x, y, use_scaler, mode="autocast"):
    """(flushed, total): gradient elements that are 0 under autocast but not in float32."""
    reference = gradients(model, x, y, "float32")
    scaler = eo.GradScaler() if use_scaler else None
    mixed = gradients(model, x, y, mode, scaler)
    flushed = sum(int(np.count_nonzero((m == 0) & (r != 0))) for m, r in zip(mixed, reference))
    return flushed, sum(r.size for r in reference)


def train(mode, use_scaler, steps=400, rows=512, hidden=32, seed=0):
    """Train a fresh model; returns (final float32 MSE, number of skipped steps,
    the MSE at every step)."""
    x, y = make_data(rows, seed)
    model = make_model(hidden, seed)
    # Dividing the learning rate by LOSS_FACTOR undoes the loss factor exactly
    # for SGD, so the float32 run is ordinary training.
    optimizer = eo.SGD(model.parameters(), lr=LEARNING_RATE / LOSS_FACTOR, momentum=MOMENTUM)
    scaler = eo.GradScaler() if use_scaler else None
    skipped, curve = 0, []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = scaled_loss(model, x, y, mode)
        curve.append(loss.item() / LOSS_FACTOR)
        if scaler is None:
            loss.backward()
            optimizer.step()
        else:
            scaler.backward(loss)
            skipped += not scaler.step(optimizer)
            scaler.update()
    with eo.no_grad():
        final = eo.mse_loss(model(x), y).item()
    return final, skipped, curve


def plot_curves(curves, path):
    """Write the loss curves to a PNG; returns False when matplotlib is not installed."""
    try:
        from matplotlib.figure import Figure  # no pyplot: no global backend state
    except ImportError:
        return False
    fig = Figure(figsize=(7, 4.2), dpi=110)
    ax = fig.subplots()
    styles = {
        "float16, no GradScaler": ("tab:red", "-"),
        "float16 + GradScaler": ("tab:blue", "-"),
        "bfloat16, no GradScaler": ("tab:green", "--"),
        "float32 reference": ("black", ":"),
    }
    for label, curve in curves.items():
        color, line = styles[label]
        ax.plot(range(1, len(curve) + 1), curve, color=color, linestyle=line, label=label, linewidth=1.6)
    ax.set_yscale("log")
    ax.set_xlabel("SGD step")
    ax.set_ylabel("training MSE (float32)")
    ax.set_title(f"Loss x 2**{int(np.log2(LOSS_FACTOR))}: float16 gradients flush without loss scaling")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    return True


def main():
    x, y = make_data()
    model = make_model()
    no_scaler = flush_count(model, x, y, use_scaler=False)
    with_scaler = flush_count(model, x, y, use_scaler=True)
    bf16 = flush_count(model, x, y, use_scaler=False, mode="bfloat16")
    total = no_scaler[1]
    print(f"Gradient elements flushed to zero ({total} total, first step, loss x 2**-20)")
    print(f"  float16, no GradScaler ... {no_scaler[0]:>3} / {total}")
    print(f"  float16 + GradScaler ..... {with_scaler[0]:>3} / {total}")
    print(f"  bfloat16, no GradScaler .. {bf16[0]:>3} / {total}")
    print()

    mse_plain, _, curve_plain = train("autocast", use_scaler=False)
    mse_scaled, skipped, curve_scaled = train("autocast", use_scaler=True)
    mse_bf16, _, curve_bf16 = train("bfloat16", use_scaler=False)
    mse_ref, _, curve_ref = train("float32", use_scaler=False)
    print("Final MSE after 400 steps")
    print(f"  float16, no GradScaler ... {mse_plain:.4f}")
    print(f"  float16 + GradScaler ..... {mse_scaled:.4f}      float32 reference: {mse_ref:.4f}")
    print(f"  bfloat16, no GradScaler .. {mse_bf16:.4f}")
    print(f"  (GradScaler skipped {skipped} of 400 steps)")
    print()
    path = sys.argv[1] if len(sys.argv) > 1 else "mixed_precision_loss.png"
    curves = {
        "float16, no GradScaler": curve_plain,
        "float16 + GradScaler": curve_scaled,
        "bfloat16, no GradScaler": curve_bf16,
        "float32 reference": curve_ref,
    }
    if plot_curves(curves, path):
        print(f"Loss curves written to {os.path.abspath(path)}")
    else:
        print("(matplotlib is not installed: no loss-curve PNG)")
    print()
    print(
        "On a CPU, mixed precision saves memory, not time: NumPy has no native float16\n"
        "arithmetic, so EveryO upcasts to float32 to compute and rounds back. The numerics\n"
        "are float16's; the speed is not a GPU's."
    )

    # The example is also a check: fail loudly if the effect is not there.
    ok = (
        no_scaler[0] > 0.9 * total
        and with_scaler[0] < 0.05 * total
        and bf16[0] < 0.05 * total
        and abs(mse_scaled - mse_ref) <= 0.05 * mse_ref
        and abs(mse_bf16 - mse_ref) <= 0.05 * mse_ref
        and mse_plain > 5 * mse_ref
    )
    if not ok:
        print("UNEXPECTED: the figures above do not show the loss-scaling effect", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
