"""Weight tying: a decoder Linear shares an Embedding's (vocab, dim) table, used transposed
without a copy. Gradients from both uses add up (central differences), the Parameter is listed,
saved and updated once, and a checkpoint loads back tied."""

import numpy as np
import pytest

import everyo as eo
from everyo.testing import check_gradients


class TiedLM(eo.Module):
    def __init__(self, vocab=6, dim=4, seed=0):
        super().__init__()
        self.encoder = eo.Embedding(vocab, dim, seed=seed)
        self.hidden = eo.Linear(dim, dim, seed=seed + 1)
        self.decoder = eo.Linear(dim, vocab, weight=self.encoder.weight, seed=seed + 2)

    def forward(self, ids):
        return self.decoder(eo.tanh(self.hidden(self.encoder(ids))))


IDS = np.array([[1, 2, 2, 5], [0, 3, 1, 1]])


def _numpy_forward(state, ids):
    table = state["encoder.weight"]
    h = np.tanh(table[ids] @ state["hidden.weight"] + state["hidden.bias"])
    return h @ table.T + state["decoder.bias"]


def test_forward_matches_numpy_and_the_weight_is_one_parameter():
    model = TiedLM()
    assert model.decoder.weight is model.encoder.weight and model.decoder.weight_transposed
    np.testing.assert_allclose(model(IDS).data, _numpy_forward(model.state_dict(), IDS), atol=1e-6)
    names = [name for name, _ in model.named_parameters()]
    assert names == ["encoder.weight", "hidden.weight", "hidden.bias", "decoder.bias"]
    assert list(model.state_dict()) == names
    assert "tied" in repr(model.decoder)


def test_gradients_from_both_uses_add_up():
    model = TiedLM().to("float64")
    params = model.parameters()
    check_gradients(lambda: model(IDS), [], params, name="tied LM")
    # ... and the tied gradient is the sum of what each use alone gives
    model.zero_grad()
    (model(IDS) * 1.0).sum().backward()
    both = model.encoder.weight.grad.copy()
    untied = TiedLM().to("float64")
    untied.load_state_dict(model.state_dict())
    untied.decoder.weight_transposed = False
    untied.decoder.weight = eo.Parameter(model.encoder.weight.data.T.copy())
    untied(IDS).sum().backward()
    np.testing.assert_allclose(both, untied.encoder.weight.grad + untied.decoder.weight.grad.T, atol=1e-12)


def test_an_optimizer_updates_the_shared_weight_once():
    model = TiedLM()
    opt = eo.optim.SGD(model.parameters(), lr=0.1)
    before = model.encoder.weight.data.copy()
    model(IDS).sum().backward()
    grad = model.encoder.weight.grad.copy()
    opt.step()
    np.testing.assert_allclose(model.encoder.weight.data, before - 0.1 * grad, atol=1e-7)


def test_a_checkpoint_stores_it_once_and_loads_back_tied(tmp_path):
    model = TiedLM(seed=1)
    eo.save(model.state_dict(), tmp_path / "tied.npz")
    fresh = TiedLM(seed=7)
    fresh.load_state_dict(eo.load(tmp_path / "tied.npz"))
    assert fresh.decoder.weight is fresh.encoder.weight
    np.testing.assert_array_equal(fresh(IDS).data, model(IDS).data)


def test_wrong_shapes_are_refused_with_the_eo_way():
    emb = eo.Embedding(6, 4)
    with pytest.raises(eo.EveryOShapeError, match=r"\(out_features, in_features\) = \(6, 3\)"):
        eo.Linear(3, 6, weight=emb.weight)
    decoder = eo.Linear(4, 6)
    decoder.weight = emb.weight  # PyTorch's spelling: caught at the first call, not computed wrongly
    with pytest.raises(eo.EveryOShapeError, match=r"decoder.tie_weight\(encoder.weight\)"):
        decoder(np.ones((2, 4), np.float32))


def test_torch_state_dict_with_both_names_loads_tied():
    model = TiedLM()
    state = {
        "encoder.weight": np.random.default_rng(0).standard_normal((6, 4)).astype(np.float32),
        "hidden.weight": np.ones((4, 4), np.float32),  # PyTorch's (out, in)
        "hidden.bias": np.zeros(4, np.float32),
        "decoder.bias": np.arange(6, dtype=np.float32),
    }
    state["decoder.weight"] = state["encoder.weight"]  # torch saves the tied tensor under both names
    eo.load_torch_state_dict(model, state)
    assert model.decoder.weight is model.encoder.weight
    np.testing.assert_array_equal(model.encoder.weight.data, state["encoder.weight"])


def test_matches_torch_tied_model():
    torch = pytest.importorskip("torch")
    model = TiedLM()
    enc = torch.nn.Embedding(6, 4)
    hid = torch.nn.Linear(4, 4)
    dec = torch.nn.Linear(4, 6)
    dec.weight = enc.weight
    with torch.no_grad():
        enc.weight.copy_(torch.from_numpy(model.encoder.weight.data))
        hid.weight.copy_(torch.from_numpy(model.hidden.weight.data.T))
        hid.bias.copy_(torch.from_numpy(model.hidden.bias.data))
        dec.bias.copy_(torch.from_numpy(model.decoder.bias.data))
    out = dec(torch.tanh(hid(enc(torch.from_numpy(IDS)))))
    (out**2).sum().backward()
    got = model(IDS)
    (got**2).sum().backward()
    np.testing.assert_allclose(got.data, out.detach().numpy(), atol=1e-6)
    np.testing.assert_allclose(model.encoder.weight.grad, enc.weight.grad.numpy(), atol=1e-5)
