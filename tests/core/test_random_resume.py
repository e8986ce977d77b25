"""eo.manual_seed, random streams in state_dict, and bit-identical resumption
through public API alone (the resumed half runs in a fresh process)."""

import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import everyo as eo


def build_all():
    """One of every layer that draws at construction, none with seed=."""
    return [
        eo.Linear(5, 4),
        eo.Conv2D(3, 2, 3),
        eo.LSTM(3, 4),
        eo.GRU(3, 2, bidirectional=True),
        eo.Embedding(7, 3),
        eo.MultiHeadAttention(8, 2),
        eo.TransformerEncoder(1, 8, 2, 16),
    ]


def test_manual_seed_makes_default_initialisation_reproducible():
    eo.manual_seed(123)
    first = [m.state_dict() for m in build_all()] + [eo.randn(3, 2).data]
    eo.manual_seed(123)
    second = [m.state_dict() for m in build_all()] + [eo.randn(3, 2).data]
    for a, b in zip(first[:-1], second[:-1]):
        assert list(a) == list(b) and all(np.array_equal(a[k], b[k]) for k in a)
    np.testing.assert_array_equal(first[-1], second[-1])
    eo.manual_seed(124)
    assert not np.array_equal(eo.Linear(5, 4).weight.data, first[0]["weight"])
    # two layers built one after the other differ
    eo.manual_seed(123)
    assert not np.array_equal(eo.Linear(5, 4).weight.data, eo.Linear(5, 4).weight.data)


def test_seed_keeps_its_0_1_numbers_whatever_the_global_state():
    eo.manual_seed(5)
    a = eo.Linear(4, 3, seed=7).weight.data
    eo.manual_seed(6)
    b = eo.Linear(4, 3, seed=7).weight.data
    bound = 1 / math.sqrt(4)
    expected = np.random.default_rng(7).uniform(-bound, bound, size=(4, 3)).astype(np.float32)
    np.testing.assert_array_equal(a, expected)
    np.testing.assert_array_equal(b, expected)
    np.testing.assert_array_equal(
        eo.randn(2, 3, seed=1).data, np.random.default_rng(1).standard_normal((2, 3)).astype(np.float32)
    )


def test_seeded_streams_draw_0_1s_numbers():
    eo.manual_seed(8)  # must not matter
    mask = eo.Dropout(0.25, seed=3)(eo.ones(5, 4)).data
    keep = np.random.default_rng(3).random((5, 4)) >= 0.25
    np.testing.assert_array_equal(mask, keep.astype(np.float32) * np.float32(1 / 0.75))
    gru = eo.GRU(3, 2, seed=4)
    rng = np.random.default_rng(4)
    rng.integers(2**63)  # 0.1 seeds the dropout stream first
    np.testing.assert_array_equal(
        gru.weight_ih_l0.data, rng.uniform(-1 / np.sqrt(2), 1 / np.sqrt(2), (3, 6)).astype(np.float32)
    )
    order = next(iter(eo.DataLoader(np.arange(9), batch_size=9, shuffle=True, seed=5))).data
    np.testing.assert_array_equal(order, np.random.default_rng(5).permutation(9))


def test_manual_seed_makes_dropout_and_shuffling_reproducible():
    def draw():
        drop = eo.Dropout(0.5)
        masks = [drop(eo.ones(4, 6)).data for _ in range(2)]
        order = np.concatenate([b.data for b in eo.DataLoader(np.arange(10), batch_size=3, shuffle=True)])
        return masks, order, eo.dropout(eo.ones(8), 0.5).data

    eo.manual_seed(0)
    (m1, o1, f1) = draw()
    eo.manual_seed(0)
    (m2, o2, f2) = draw()
    assert all(np.array_equal(a, b) for a, b in zip(m1, m2)) and not np.array_equal(m1[0], m1[1])
    np.testing.assert_array_equal(o1, o2)
    np.testing.assert_array_equal(f1, f2)
    assert sorted(o1) == list(range(10))


def test_global_state_can_be_saved_and_restored():
    eo.manual_seed(3)
    state = eo.get_rng_state()
    a = eo.Linear(3, 3).weight.data
    eo.manual_seed(99)
    eo.set_rng_state(state)
    np.testing.assert_array_equal(eo.Linear(3, 3).weight.data, a)
    with pytest.raises(ValueError, match="non-negative integer"):
        eo.manual_seed(-1)
    with pytest.raises(eo.EveryOStateDictError, match="shape \\(6,\\)"):
        eo.set_rng_state(np.zeros(3, np.uint64))


# --- a module's random streams --------------------------------------------------------
def test_dropout_stream_is_in_the_state_dict_and_loads_back():
    drop = eo.Dropout(0.5, seed=0)
    drop(eo.ones(10))
    state = drop.state_dict()
    assert list(state) == ["generator"] and state["generator"].dtype == np.uint64
    expected = drop(eo.ones(10)).data
    other = eo.Dropout(0.5, seed=42)
    other.load_state_dict(state)
    np.testing.assert_array_equal(other(eo.ones(10)).data, expected)
    model = eo.Sequential(eo.Linear(3, 3, seed=0), eo.Dropout(0.2, seed=1))
    assert list(model.state_dict()) == ["0.weight", "0.bias", "1.generator"]
    drop.generator = np.random.default_rng(5)  # replacing the stream keeps it registered
    np.testing.assert_array_equal(drop.state_dict()["generator"], eo.random.generator_state(np.random.default_rng(5)))


def test_a_bad_stream_state_is_refused_and_changes_nothing_and_0_1_state_dicts_still_load():
    model = eo.Sequential(eo.Linear(3, 3, seed=0), eo.Dropout(0.2, seed=1))
    good = model.state_dict()
    bad = dict(good, **{"0.weight": good["0.weight"] + 1, "1.generator": np.ones(6, np.float64)})
    with pytest.raises(eo.EveryOStateDictError, match="1.generator.*uint64 array of shape"):
        model.load_state_dict(bad)
    np.testing.assert_array_equal(model[0].weight.data, good["0.weight"])
    old = {k: v for k, v in good.items() if k != "1.generator"}  # as saved by 0.1
    model.load_state_dict(old)  # strict, and still fine: the stream continues
    with pytest.raises(TypeError, match="numpy.random.Generator"):
        eo.Module().register_generator("g", 3)


def test_layers_save_only_streams_they_draw_from():
    assert eo.PositionalEncoding(4, dropout=0.0).state_dict() == {}
    assert "generator" in eo.PositionalEncoding(4, dropout=0.1).state_dict()
    assert "generator" not in eo.MultiHeadAttention(4, 2).state_dict()
    assert "dropout_generator" in eo.LSTM(3, 4, num_layers=2, dropout=0.5).state_dict()
    assert "dropout_generator" not in eo.LSTM(3, 4).state_dict()


# --- the DataLoader's state --------------------------------------------------------------
def epoch(loader):
    return [b.data.copy() for b in loader]


def test_loader_resumes_mid_epoch_and_between_epochs():
    x = np.arange(23)
    reference = eo.DataLoader(x, batch_size=4, shuffle=True, seed=0)
    expected = epoch(reference) + epoch(reference) + epoch(reference)

    loader = eo.DataLoader(x, batch_size=4, shuffle=True, seed=0)
    got = epoch(loader)
    it = iter(loader)
    got += [next(it).data.copy() for _ in range(2)]
    state = loader.state_dict()
    assert state["epoch"] == 1 and state["position"] == 2
    fresh = eo.DataLoader(x, batch_size=4, shuffle=True, seed=77)
    fresh.load_state_dict(state)
    got += epoch(fresh) + epoch(fresh)
    assert len(got) == len(expected) and all(np.array_equal(a, b) for a, b in zip(got, expected))
    assert fresh.state_dict()["epoch"] == 3


def test_state_saved_inside_the_loop_after_the_last_batch_resumes_at_the_next_epoch():
    x = np.arange(8)
    reference = eo.DataLoader(x, batch_size=4, shuffle=True, seed=1)
    expected = epoch(reference) + epoch(reference)
    loader = eo.DataLoader(x, batch_size=4, shuffle=True, seed=1)
    for _ in loader:
        state = loader.state_dict()
    assert state["epoch"] == 1 and state["position"] == 0
    fresh = eo.DataLoader(x, batch_size=4, shuffle=True, seed=2)
    fresh.load_state_dict(state)
    assert all(np.array_equal(a, b) for a, b in zip(epoch(fresh), expected[2:]))


def test_bad_loader_state_is_refused():
    loader = eo.DataLoader(np.arange(8), batch_size=4, shuffle=True, seed=0)
    good = loader.state_dict()
    for bad, match in [
        ({"epoch": 0}, "expected keys"),
        (dict(good, position=3), "past the 2 batches"),
        (dict(good, epoch=-1), "non-negative integer"),
        (dict(good, generator=np.zeros(6)), "uint64"),
    ]:
        with pytest.raises(eo.EveryOStateDictError, match=match):
            loader.load_state_dict(bad)
    assert loader.state_dict()["epoch"] == 0


# --- train 2 epochs == train 1, save, resume in a fresh process, train 1 ------------------
TRAINING = textwrap.dedent("""
    import numpy as np
    import everyo as eo

    def data():
        rng = np.random.default_rng(0)
        x = rng.standard_normal((60, 6)).astype(np.float32)
        return x, (x[:, :2].sum(axis=1) > 0).astype(np.int64)

    def build():
        model = eo.Sequential(eo.Linear(6, 16), eo.ReLU(), eo.Dropout(0.3), eo.Linear(16, 2))
        return model, eo.Adam(model.parameters(), lr=0.01), eo.DataLoader(*data(), batch_size=8, shuffle=True)

    def train_epoch(model, opt, loader):
        for xb, yb in loader:
            opt.zero_grad()
            eo.cross_entropy(model(xb), yb).backward()
            opt.step()
""")

RESUME = TRAINING + textwrap.dedent("""
    import sys
    eo.manual_seed(999)  # a different global state: everything must come from the checkpoint
    model, opt, loader = build()
    ckpt = eo.load(sys.argv[1])
    model.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["optimizer"])
    loader.load_state_dict(ckpt["loader"])
    train_epoch(model, opt, loader)
    eo.save(model.state_dict(), sys.argv[2])
""")


def test_resumed_training_is_bitwise_equal_to_uninterrupted(tmp_path):
    namespace = {}
    exec(TRAINING, namespace)
    build, train_epoch = namespace["build"], namespace["train_epoch"]

    eo.manual_seed(2024)
    model, opt, loader = build()
    train_epoch(model, opt, loader)
    train_epoch(model, opt, loader)
    uninterrupted = model.state_dict()

    eo.manual_seed(2024)
    model, opt, loader = build()
    train_epoch(model, opt, loader)
    eo.save(
        {"model": model.state_dict(), "optimizer": opt.state_dict(), "loader": loader.state_dict()},
        tmp_path / "ckpt.npz",
    )
    script = tmp_path / "resume.py"
    script.write_text(RESUME)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    subprocess.run(
        [sys.executable, str(script), str(tmp_path / "ckpt.npz"), str(tmp_path / "end.npz")],
        check=True,
        env=env,
        timeout=120,
    )
    resumed = eo.load(tmp_path / "end.npz")
    assert list(resumed) == list(uninterrupted)
    for key in uninterrupted:
        np.testing.assert_array_equal(resumed[key], uninterrupted[key], err_msg=key)
    # and the run did depend on the random streams: another seed trains other weights
    eo.manual_seed(2025)
    model, opt, loader = build()
    train_epoch(model, opt, loader)
    train_epoch(model, opt, loader)
    assert not np.array_equal(model.state_dict()["0.weight"], uninterrupted["0.weight"])
