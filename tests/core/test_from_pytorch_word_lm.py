"""examples/from_pytorch/word_language_model (pytorch/examples' word-level LSTM language model,
ported): the script runs on a generated corpus with tied weights and learns; where torch is
installed, its validation and test losses match the original's, trained by torch from the same
starting weights on the same batches (dropout 0 on both sides, so no masks are drawn)."""

import math

import numpy as np
import pytest
from word_lm_port import run_main

import everyo as eo

# lr 5, not the original's 20: at 20 the training is chaotic enough that float32 rounding
# differences (1e-7 per step) grow to 1e-2 within two epochs; at 5 they stay below 1e-4.
ARGS = ["--epochs", "2", "--emsize", "16", "--nhid", "16", "--tied", "--bptt", "8", "--batch_size", "16"]
ARGS += ["--log-interval", "10", "--dropout", "0", "--seed", "3", "--lr", "5"]


def test_the_port_runs_and_learns(tmp_path, capsys):
    # the original's lr 20 and dropout 0.2
    g = run_main(
        tmp_path, "--epochs", "2", "--emsize", "32", "--nhid", "32", "--tied", "--bptt", "10", "--batch_size", "8"
    )
    out = capsys.readouterr().out
    assert "End of training" in out
    ntokens = len(g["corpus"].dictionary)
    assert g["test_loss"] < 0.7 * math.log(ntokens)  # well below the uniform guess
    assert g["model"].decoder.weight is g["model"].encoder.weight
    assert sorted(eo.load(tmp_path / "lm.npz")) == sorted(g["model"].state_dict())  # the tied table once


def _torch_model(torch, ntoken, nhid, nlayers):
    nn, F = torch.nn, torch.nn.functional

    class RNNModel(nn.Module):  # pytorch/examples word_language_model/model.py, LSTM and tied
        def __init__(self):
            super().__init__()
            self.encoder = nn.Embedding(ntoken, nhid)
            self.rnn = nn.LSTM(nhid, nhid, nlayers, dropout=0.0)
            self.decoder = nn.Linear(nhid, ntoken)
            self.decoder.weight = self.encoder.weight

        def forward(self, input, hidden):
            output, hidden = self.rnn(self.encoder(input), hidden)
            return F.log_softmax(self.decoder(output).view(-1, ntoken), dim=1), hidden

    return RNNModel()


def test_losses_match_torch_from_the_same_weights(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    g = run_main(tmp_path, *ARGS)
    capsys.readouterr()
    corpus, nlayers, nhid = g["corpus"], 2, 16
    ntoken = len(corpus.dictionary)
    eo.manual_seed(3)  # the port's model as main.py built it, before training
    start = g["RNNModel"]("LSTM", ntoken, nhid, nhid, nlayers, 0.0, True).state_dict()
    ref = _torch_model(torch, ntoken, nhid, nlayers)
    ref.load_state_dict(
        {k: torch.from_numpy(np.ascontiguousarray(v.T if k.startswith("rnn.weight") else v)) for k, v in start.items()},
        strict=False,
    )
    F = torch.nn.functional

    def batchify(ids, bsz):
        n = len(ids) // bsz
        return torch.from_numpy(ids[: n * bsz]).view(bsz, -1).t().contiguous()

    def evaluate(source):
        ref.eval()
        total, hidden = 0.0, (torch.zeros(nlayers, 10, nhid), torch.zeros(nlayers, 10, nhid))
        with torch.no_grad():
            for i in range(0, source.size(0) - 1, 8):
                seq = min(8, len(source) - 1 - i)
                out, hidden = ref(source[i : i + seq], hidden)
                total += seq * F.nll_loss(out, source[i + 1 : i + 1 + seq].reshape(-1)).item()
        return total / (len(source) - 1)

    train, val, test = batchify(corpus.train, 16), batchify(corpus.valid, 10), batchify(corpus.test, 10)
    lr, best, best_state = 5.0, None, None
    for _ in range(2):
        ref.train()
        hidden = (torch.zeros(nlayers, 16, nhid), torch.zeros(nlayers, 16, nhid))
        for i in range(0, train.size(0) - 1, 8):
            seq = min(8, len(train) - 1 - i)
            ref.zero_grad()
            hidden = tuple(h.detach() for h in hidden)
            out, hidden = ref(train[i : i + seq], hidden)
            loss = F.nll_loss(out, train[i + 1 : i + 1 + seq].reshape(-1))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.25)
            for p in ref.parameters():
                p.data.add_(p.grad, alpha=-lr)
        val_loss = evaluate(val)
        if not best or val_loss < best:
            best, best_state = val_loss, {k: v.clone() for k, v in ref.state_dict().items()}
        else:
            lr /= 4.0
    ref.load_state_dict(best_state)
    np.testing.assert_allclose([g["best_val_loss"], g["test_loss"], g["lr"]], [best, evaluate(test), lr], rtol=1e-4)
    assert best < math.log(ntoken)
