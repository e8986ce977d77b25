"""Sequence models in EveryO: an LSTM adds up digits, a transformer reverses them.

    python examples/sequence.py

Both train from scratch in a few seconds on a laptop CPU and are scored on
sequences they never saw.
"""

import time

import numpy as np

import everyo as eo

DIGITS, LENGTH = 5, 6


class DigitSum(eo.Module):
    """Read a sequence of digits, output their sum (a class 0 .. (DIGITS - 1) * LENGTH)."""

    def __init__(self):
        super().__init__()
        self.embed = eo.Embedding(DIGITS, 16, seed=0)
        self.lstm = eo.LSTM(16, 64, seed=1)
        self.head = eo.Linear(64, (DIGITS - 1) * LENGTH + 1, seed=2)

    def forward(self, ids):
        outputs, (h_n, c_n) = self.lstm(self.embed(ids))  # outputs: every step; h_n: the last
        return self.head(h_n[0])


class Reverser(eo.Module):
    """Read a sequence of digits, output it backwards (one class per position)."""

    def __init__(self):
        super().__init__()
        self.embed = eo.Embedding(DIGITS, 32, seed=0)
        self.positions = eo.PositionalEncoding(32, max_len=LENGTH, dropout=0.0)
        self.encoder = eo.TransformerEncoder(2, 32, num_heads=4, dim_feedforward=64, dropout=0.0, seed=1)
        self.head = eo.Linear(32, DIGITS, seed=2)

    def forward(self, ids):
        return self.head(self.encoder(self.positions(self.embed(ids))))


def fit(name, model, target_of, steps, lr, batch_size):
    rng = np.random.default_rng(0)
    optimizer = eo.Adam(model.parameters(), lr=lr)
    start = time.perf_counter()
    for step in range(1, steps + 1):
        ids = rng.integers(0, DIGITS, size=(batch_size, LENGTH))
        logits = model(ids)
        targets = target_of(ids)
        loss = eo.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % (steps // 4) == 0:
            print(f"  {name}: step {step:4d}  loss {loss.item():.4f}")
    seconds = time.perf_counter() - start

    test = np.random.default_rng(1).integers(0, DIGITS, size=(2000, LENGTH))
    model.eval()
    with eo.no_grad():
        predicted = model(test).data.argmax(-1)
    accuracy = (predicted == target_of(test)).mean()
    print(f"  {name}: {accuracy:.1%} right on 2000 unseen sequences after {seconds:.1f} s of training\n")
    return accuracy


print(f"Sequences of {LENGTH} digits from 0 to {DIGITS - 1}.\n")
lstm_acc = fit("LSTM, sum", DigitSum(), lambda ids: ids.sum(axis=1), steps=500, lr=0.01, batch_size=128)
transformer_acc = fit("Transformer, reverse", Reverser(), lambda ids: ids[:, ::-1], steps=200, lr=0.003, batch_size=64)

# A causal mask keeps each position blind to later ones: changing the last
# digit leaves every earlier output bit-for-bit unchanged.
encoder = Reverser().encoder
x = eo.randn(1, LENGTH, 32, seed=3)
changed = x.data.copy()
changed[0, -1] += 1.0
same = np.array_equal(encoder(x, is_causal=True).data[0, :-1], encoder(changed, is_causal=True).data[0, :-1])
print(f"causal encoder: earlier outputs unchanged when the last input changes: {same}")

if lstm_acc < 0.9 or transformer_acc < 0.9 or not same:
    raise SystemExit("a sequence model did not learn its task")
