"""docs/getting-started/from-pytorch.md: every row of the "Coming from PyTorch"
table has a check here, keyed by the row's first cell, and every check has a
row (the test reads the table). A check shows what the row says: the EveryO
spelling gives PyTorch's number (against torch where installed, NumPy
otherwise), and a refused spelling raises the error naming the EveryO one."""

import pathlib

import numpy as np
import pytest

import everyo as eo

PAGE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "getting-started" / "from-pytorch.md"
RNG = np.random.default_rng(0)


def table_rows():
    rows = []
    for line in PAGE.read_text().splitlines():
        if line.startswith("| ") and not line.startswith("| PyTorch |"):
            rows.append(line.split(" | ")[0][2:].strip())
    return rows


def torch_or_none():
    try:
        import torch
    except ImportError:
        return None
    return torch


def a(*shape):
    return RNG.standard_normal(shape)


def check_size():
    x = eo.tensor(a(2, 3))
    assert x.shape == (2, 3) and x.shape[1] == 3 and x.numel() == 6 and x.size == 6
    with pytest.raises(eo.EveryOSpellingError, match=r"x\.shape"):
        x.size()
    with pytest.raises(eo.EveryOSpellingError, match=r"x\.shape\[1\]"):
        x.size(1)


def check_setitem():
    x = eo.tensor(a(2, 3))
    mask = x.data > 0
    with pytest.raises(eo.EveryOSpellingError, match=r"masked_fill"):
        x[mask] = 0.0
    np.testing.assert_array_equal(x.masked_fill(mask, 0.0).data, np.where(mask, 0.0, x.data))
    np.testing.assert_array_equal(eo.where(mask, 0.0, x).data, np.where(mask, 0.0, x.data))


def check_dim():
    x = a(2, 3, 4)
    got = eo.tensor(x).sum(dim=1, keepdim=True)
    np.testing.assert_allclose(got.data, x.sum(axis=1, keepdims=True))
    np.testing.assert_allclose(eo.softmax(eo.tensor(x), dim=0).data, eo.softmax(eo.tensor(x), axis=0).data)
    assert eo.concatenate([eo.tensor(x)] * 2, dim=2).shape == (2, 3, 8)


def check_max_dim():
    x = eo.tensor(a(3, 4))
    with pytest.raises(eo.EveryOSpellingError, match=r"x\.max\(axis=d\) and x\.argmax\(axis=d\)"):
        x.max(dim=1)
    np.testing.assert_array_equal(x.max(axis=1).data, x.data.max(1))
    np.testing.assert_array_equal(x.argmax(axis=1).data, x.data.argmax(1))


def check_var_dim():
    x = a(3, 5)
    with pytest.raises(eo.EveryOSpellingError, match="ddof=1"):
        eo.tensor(x).var(dim=1)
    with pytest.raises(eo.EveryOSpellingError, match="ddof=1"):
        eo.tensor(x).std(dim=1)
    torch = torch_or_none()
    expected = torch.tensor(x).var(dim=1).numpy() if torch else x.var(axis=1, ddof=1)
    np.testing.assert_allclose(eo.tensor(x).var(axis=1, ddof=1).data, expected)


def check_var_all():
    x = a(4, 5)
    torch = torch_or_none()
    expected = float(torch.tensor(x).var()) if torch else x.var(ddof=1)
    assert eo.tensor(x).var().item() != pytest.approx(expected)  # NumPy's meaning: a different number
    assert eo.tensor(x).var(ddof=1).item() == pytest.approx(expected)
    assert eo.tensor(x).std(ddof=1).item() == pytest.approx(np.sqrt(expected))


def check_transpose():
    x = a(2, 3, 4, 5)
    torch = torch_or_none()
    expected = torch.tensor(x).transpose(1, 2).numpy() if torch else np.swapaxes(x, 1, 2)
    np.testing.assert_array_equal(eo.tensor(x).transpose(1, 2).data, expected)
    np.testing.assert_array_equal(eo.tensor(x).transpose(3, 2, 1, 0).data, x.transpose(3, 2, 1, 0))
    m = eo.tensor(a(2, 3))
    np.testing.assert_array_equal(m.transpose(1, 0).data, m.data.T)
    with pytest.raises(eo.EveryOSpellingError, match=r"x\.T"):
        m.transpose(0, 1)


def check_permute():
    x = a(2, 3, 4)
    np.testing.assert_array_equal(eo.tensor(x).permute(2, 0, 1).data, x.transpose(2, 0, 1))


def check_view():
    x = eo.tensor(a(2, 3, 4))
    t = x.transpose(1, 2)  # not contiguous: PyTorch's view would refuse it without contiguous()
    assert t.contiguous() is t
    np.testing.assert_array_equal(t.contiguous().view(2, -1).data, np.swapaxes(x.data, 1, 2).reshape(2, -1))
    np.testing.assert_array_equal(t.view(2, -1).data, t.reshape(2, -1).data)


def check_split():
    x = a(5, 4)
    assert [p.shape for p in eo.split(eo.tensor(x), 2)] == [(2, 4), (2, 4), (1, 4)]
    assert [p.shape for p in eo.tensor(x).split([1, 3], dim=1)] == [(5, 1), (5, 3)]
    assert len(eo.chunk(eo.tensor(x), 5)) == 5


def check_flatten():
    x = a(2, 3, 4)
    assert eo.tensor(x).flatten().shape == (2, 12)
    np.testing.assert_array_equal(eo.tensor(x).flatten(0).data, x.reshape(-1))
    np.testing.assert_array_equal(eo.tensor(x).reshape(-1).data, x.reshape(-1))


def check_cat():
    p, q = a(2, 3), a(2, 1)
    np.testing.assert_array_equal(eo.concatenate([p, q], dim=1).data, np.concatenate([p, q], 1))


def check_maximum():
    p, q = a(3), a(3)
    np.testing.assert_array_equal(eo.maximum(p, q).data, np.maximum(p, q))


def check_equal():
    p = eo.tensor(a(3))
    assert np.array_equal(p, eo.tensor(p.data.copy()))
    assert eo.equal(p, p).dtype == np.bool_ and eo.equal(p, p).shape == (3,)


def check_linear():
    x, w = a(4, 3), a(3, 2)
    layer = eo.Linear(3, 2)
    assert layer.weight.shape == (3, 2)
    np.testing.assert_allclose(eo.linear(eo.tensor(x), eo.tensor(w)).data, x @ w)
    torch = torch_or_none()
    if torch:
        np.testing.assert_allclose(
            eo.linear(eo.tensor(x), eo.tensor(w)).data, torch.nn.functional.linear(torch.tensor(x), torch.tensor(w.T))
        )


def check_conv():
    assert eo.Conv2D(3, 8, 5).weight.shape == (5, 5, 3, 8)
    assert eo.Conv2D(3, 8, 5)(eo.zeros(1, 9, 9, 3)).shape == (1, 5, 5, 8)


def check_lstm():
    lstm = eo.LSTM(3, 4, batch_first=False, seed=0)
    out, (h, _) = lstm(eo.tensor(a(6, 2, 3)))
    assert out.shape == (6, 2, 4) and h.shape == (1, 2, 4)
    assert eo.LSTM(3, 4).batch_first


def check_sdpa():
    q, k, v = a(2, 3, 4), a(2, 5, 4), a(2, 5, 2)
    allowed = np.ones((3, 5), bool)
    allowed[1] = False
    allowed[0, 2:] = False
    out = eo.scaled_dot_product_attention(eo.tensor(q), eo.tensor(k), eo.tensor(v), attn_mask=allowed)
    assert np.all(out.data[:, 1] == 0)  # every key blocked: zeros, not NaN
    torch = torch_or_none()
    if torch:
        ref = torch.nn.functional.scaled_dot_product_attention(
            torch.tensor(q), torch.tensor(k), torch.tensor(v), attn_mask=torch.tensor(allowed)
        ).numpy()
        np.testing.assert_allclose(out.data[:, [0, 2]], ref[:, [0, 2]], atol=1e-12)


def check_seeds():
    w = eo.Parameter(np.zeros((64, 32), np.float32))
    first = eo.nn.init.kaiming_uniform_(w, seed=np.random.default_rng(3)).data.copy()
    np.testing.assert_array_equal(eo.nn.init.kaiming_uniform_(w, seed=np.random.default_rng(3)).data, first)
    np.testing.assert_array_equal(
        eo.multinomial([1.0, 2.0], 5, True, seed=4).data, eo.multinomial([1.0, 2.0], 5, True, seed=4).data
    )


def check_optimizer():
    class Plain(eo.optim.Optimizer):
        def __init__(self, params, lr=0.1):
            super().__init__(params, {"lr": lr})

        def update(self, param, grad, state, group):
            param.data -= group["lr"] * grad

    w = eo.Parameter(np.array([1.0, 2.0]))
    opt = Plain([w])
    (w * w).sum().backward()
    opt.step()
    np.testing.assert_allclose(w.data, [0.8, 1.6])


def check_tying():
    encoder = eo.Embedding(7, 3, seed=0)
    decoder = eo.Linear(3, 7, weight=encoder.weight)
    other = eo.Linear(3, 7)
    other.tie_weight(encoder.weight)
    assert decoder.weight is encoder.weight is other.weight
    ids = np.array([[1, 2]])
    np.testing.assert_allclose(
        decoder(encoder(ids)).data, encoder.weight.data[ids] @ encoder.weight.data.T + decoder.bias.data, atol=1e-6
    )
    torch_way = eo.Linear(3, 7)
    torch_way.weight = encoder.weight
    with pytest.raises(eo.EveryOShapeError, match="tie_weight"):
        torch_way(np.ones((1, 3), np.float32))


def check_flatten_load():
    model = eo.Sequential(eo.Conv2D(1, 2, 3), eo.Flatten(), eo.Linear(2 * 2 * 2, 3))
    sd = {"0.weight": a(2, 1, 3, 3), "0.bias": a(2), "2.weight": a(3, 8), "2.bias": a(3)}
    with pytest.raises(eo.EveryOStateDictError, match="example_input="):
        eo.load_torch_state_dict(model, sd)
    eo.load_torch_state_dict(model, sd, example_input=np.zeros((1, 4, 4, 1), "float32"))
    x = a(1, 1, 4, 4)
    conv = np.stack(
        [
            [(x[0, 0, i : i + 3, j : j + 3] * sd["0.weight"][o, 0]).sum() + sd["0.bias"][o] for j in range(2)]
            for i in range(2)
            for o in range(2)
        ]
    )
    chw = conv.reshape(2, 2, 2).transpose(1, 0, 2)  # (o, i, j): PyTorch's flatten order
    expected = chw.reshape(-1) @ sd["2.weight"].T + sd["2.bias"]
    np.testing.assert_allclose(model(x.transpose(0, 2, 3, 1).astype("float32")).data[0], expected, atol=1e-5)


def check_data_write():
    w = eo.Parameter(np.array([1.0, 2.0]))
    loss = (w * w).sum()
    with pytest.raises(ValueError, match="read-only"):
        w.data[...] = 0.0
    loss.backward()
    w.data -= 0.25 * w.grad
    np.testing.assert_allclose(w.data, [0.5, 1.0])


def check_astype():
    x = eo.tensor(a(2))
    assert x.astype("float32").dtype == np.float32 and x.astype("float16").dtype == np.float16
    assert not hasattr(x, "float") and not hasattr(x, "half")


CHECKS = {
    "`x.size()`, `x.size(d)`": check_size,
    "`x.sum(dim=1, keepdim=True)`": check_dim,
    "`x[mask] = v`": check_setitem,
    "`values, idx = x.max(dim=1)`": check_max_dim,
    "`x.var(dim=1)`, `x.std(dim=1)`": check_var_dim,
    "`x.var()`, `x.std()`": check_var_all,
    "`x.transpose(1, 2)`": check_transpose,
    "`x.permute(2, 0, 1)`": check_permute,
    "`x.contiguous().view(b, -1)`": check_view,
    "`torch.split(x, 2)`, `x.split([1, 3], dim=1)`": check_split,
    "`x.flatten()`": check_flatten,
    "`torch.cat([a, b], dim=1)`": check_cat,
    "`torch.max(a, b)`": check_maximum,
    "`torch.equal(a, b)`": check_equal,
    "`nn.Linear(i, o).weight` is (o, i); `F.linear(x, w)` is `x @ w.T`": check_linear,
    "`nn.Conv2d`: NCHW input, weight (o, i, kh, kw)": check_conv,
    "`nn.LSTM(i, h)`: input (time, batch, i)": check_lstm,
    "`F.scaled_dot_product_attention(q, k, v, attn_mask=m)`": check_sdpa,
    "`nn.init.kaiming_uniform_(w, generator=g)`, `torch.multinomial(p, n, generator=g)`": check_seeds,
    "a `torch.optim.Optimizer` subclass overriding `step()`": check_optimizer,
    "`decoder.weight = encoder.weight` (tying a Linear to an Embedding)": check_tying,
    "`model.load_state_dict(torch_sd)` for a CNN with `torch.flatten(x, 1)` before a Linear": check_flatten_load,
    "`p.data[...] = v` or `p.data -= lr * g` between forward and `backward()`": check_data_write,
    "`x.float()`, `x.half()`, `x.to(torch.float16)`": check_astype,
}


def test_every_row_has_a_check_and_every_check_a_row():
    assert table_rows() == list(CHECKS)


@pytest.mark.parametrize("row", list(CHECKS))
def test_row(row):
    assert row in table_rows()
    CHECKS[row]()
