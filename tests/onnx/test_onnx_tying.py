"""A decoder tied to its embedding exports one initializer for the shared table (read by
Gather and, through a Transpose, by MatMul) and agrees with ONNX Runtime."""

import numpy as np
from onnx_agreement import assert_traced_agrees

import everyo as eo


class TiedLSTM(eo.Module):
    def __init__(self, vocab=11, dim=6):
        super().__init__()
        self.encoder = eo.Embedding(vocab, dim, seed=0)
        self.rnn = eo.LSTM(dim, dim, seed=1)
        self.decoder = eo.Linear(dim, vocab, weight=self.encoder.weight, seed=2)

    def forward(self, ids):
        out, _ = self.rnn(self.encoder(ids))
        return self.decoder(out)


def ids(batch, steps=5):
    return np.random.default_rng(batch).integers(0, 11, (batch, steps)).astype(np.int64)


def test_tied_weights_export_one_initializer(tmp_path):
    model = TiedLSTM()
    axes = {"input": {0: "batch", 1: "time"}}
    proto = assert_traced_agrees(model, ids, tmp_path / "tied.onnx", sizes=[(2, 5), (3, 7)], dynamic_axes=axes)
    same = [i for i in proto.graph.initializer if tuple(i.dims) in ((11, 6), (6, 11))]
    assert len(same) == 1 and tuple(same[0].dims) == (11, 6)
    readers = [n.op_type for n in proto.graph.node if same[0].name in n.input]
    assert sorted(readers) == ["Gather", "Transpose"]
