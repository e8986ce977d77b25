"""Small sequence tasks learned end to end (a few seconds each on 2 cores):
an LSTM learns to add up digits, a transformer encoder learns to reverse a
sequence. Accuracy is measured on fresh sequences the model never saw."""

import numpy as np

import everyo as eo


class DigitSum(eo.Module):
    """Embedding -> LSTM -> linear head on the final state."""

    def __init__(self, digits, length):
        super().__init__()
        self.embed = eo.Embedding(digits, 8, seed=0)
        self.lstm = eo.LSTM(8, 32, seed=1)
        self.head = eo.Linear(32, (digits - 1) * length + 1, seed=2)

    def forward(self, ids):
        _, (h_n, _) = self.lstm(self.embed(ids))
        return self.head(h_n[0])


class Reverser(eo.Module):
    """Embedding + positions -> transformer encoder -> a token per position."""

    def __init__(self, vocab, length):
        super().__init__()
        self.embed = eo.Embedding(vocab, 32, seed=0)
        self.positions = eo.PositionalEncoding(32, max_len=length, dropout=0.0)
        self.encoder = eo.TransformerEncoder(2, 32, 4, dim_feedforward=64, dropout=0.0, seed=1)
        self.head = eo.Linear(32, vocab, seed=2)

    def forward(self, ids):
        return self.head(self.encoder(self.positions(self.embed(ids))))


def accuracy(model, x, y):
    with eo.no_grad():
        return float((model(x).data.argmax(-1) == y).mean())


def train(model, make_batch, steps, lr, classes):
    rng = np.random.default_rng(0)
    opt = eo.Adam(model.parameters(), lr=lr)
    for _ in range(steps):
        x, y = make_batch(rng)
        loss = eo.cross_entropy(model(x).reshape(-1, classes), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return loss.item()


def test_lstm_learns_to_sum_digits():
    digits, length = 5, 4

    def make_batch(rng, n=128):
        x = rng.integers(0, digits, size=(n, length))
        return x, x.sum(axis=1)

    model = DigitSum(digits, length)
    test_x, test_y = make_batch(np.random.default_rng(123), 2000)
    assert accuracy(model, test_x, test_y) < 0.3
    train(model, make_batch, steps=400, lr=0.01, classes=(digits - 1) * length + 1)
    assert accuracy(model, test_x, test_y) > 0.95


def test_transformer_encoder_learns_to_reverse_a_sequence():
    vocab, length = 10, 8

    def make_batch(rng, n=64):
        x = rng.integers(0, vocab, size=(n, length))
        return x, x[:, ::-1]

    model = Reverser(vocab, length)
    test_x, test_y = make_batch(np.random.default_rng(123), 1000)
    assert accuracy(model, test_x, test_y) < 0.3
    train(model, make_batch, steps=150, lr=0.003, classes=vocab)
    assert accuracy(model, test_x, test_y) > 0.95
