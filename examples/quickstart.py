"""EveryO in one screen: a model, a training loop, a checkpoint.

python examples/quickstart.py
"""

import os
import tempfile

import numpy as np

import everyo as eo

# The spec's first model.
first = eo.Linear(8, 4, seed=0)
model = eo.Sequential(first, eo.ReLU(), eo.Linear(4, 1, seed=1))
output = model(eo.ones(3, 8))
print(f"output {output.shape} {output.dtype}; first weight {first.weight.shape} {first.weight.dtype}")

# Learn y = sum of the first four inputs minus the rest, from 2048 noisy samples.
rng = np.random.default_rng(0)
inputs = rng.standard_normal((2048, 8)).astype(np.float32)
targets = (inputs[:, :4].sum(1, keepdims=True) - inputs[:, 4:].sum(1, keepdims=True)).astype(np.float32)
targets += rng.normal(0, 0.05, targets.shape).astype(np.float32)

model = eo.Sequential(eo.Linear(8, 32, seed=0), eo.ReLU(), eo.Linear(32, 1, seed=1))
optimizer = eo.Adam(model.parameters(), lr=0.01)
criterion = eo.MSELoss()
loader = eo.DataLoader(inputs, targets, batch_size=128, shuffle=True, seed=0)

for epoch in range(1, 21):
    total = 0.0
    for batch, batch_targets in loader:
        optimizer.zero_grad()
        loss = criterion(model(batch), batch_targets)
        loss.backward()
        optimizer.step()
        total += loss.item() * len(batch)
    if epoch in (1, 5, 10, 20):
        print(f"epoch {epoch:2d}  training MSE {total / len(inputs):.4f}")

# Checkpoints hold no pickle and are written atomically.
with tempfile.TemporaryDirectory() as folder:
    path = os.path.join(folder, "model.npz")
    eo.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)
    restored = eo.Sequential(eo.Linear(8, 32), eo.ReLU(), eo.Linear(32, 1))
    restored.load_state_dict(eo.load(path)["model"])
    probe = eo.tensor(inputs[:5])
    same = np.array_equal(model(probe).data, restored(probe).data)
    print(f"checkpoint {os.path.getsize(path)} bytes; restored model gives identical outputs: {same}")
