import os

import numpy as np
import pytest

import everyo as eo


def _model():
    return eo.Sequential(eo.Conv2D(1, 2, 3, seed=0), eo.BatchNorm2D(2), eo.Flatten(), eo.Linear(8, 3, seed=1))


def test_save_load_round_trip_is_bit_identical(tmp_path):
    model = _model()
    model(eo.randn(4, 4, 4, 1, seed=0))  # moves the running statistics
    opt = eo.Adam(model.parameters(), lr=0.01)
    eo.cross_entropy(model(eo.randn(4, 4, 4, 1, seed=1)), np.array([0, 1, 2, 0])).backward()
    opt.step()
    state = {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "epoch": 3,
        "note": "hi",
        "nothing": None,
        "shape": (1, 2),
        "lr": 0.5,
        "inf": float("inf"),
    }
    path = tmp_path / "ckpt.npz"
    eo.save(state, path)
    back = eo.load(path)
    for k, v in state["model"].items():
        assert back["model"][k].dtype == v.dtype and np.array_equal(back["model"][k], v)
    assert back["epoch"] == 3 and back["note"] == "hi" and back["nothing"] is None
    assert back["shape"] == (1, 2) and back["lr"] == 0.5 and back["inf"] == float("inf")
    fresh = _model()
    fresh.load_state_dict(back["model"])
    opt2 = eo.Adam(fresh.parameters(), lr=0.01)
    opt2.load_state_dict(back["optimizer"])
    x = eo.randn(2, 4, 4, 1, seed=5)
    model.eval(), fresh.eval()
    assert np.array_equal(model(x).data, fresh(x).data)
    assert opt2.state[0]["step"] == 1 and np.array_equal(opt2.state[0]["exp_avg"], opt.state[0]["exp_avg"])


def test_checkpoint_contains_no_pickle(tmp_path):
    path = tmp_path / "c.npz"
    eo.save({"a": np.arange(3)}, path)
    with np.load(path, allow_pickle=False) as archive:  # would raise on object arrays
        assert set(archive.files) == {"a0", "__everyo_manifest__"}


def test_truncated_file_raises_a_clear_error(tmp_path):
    path = tmp_path / "c.npz"
    eo.save({"w": np.ones((100, 100))}, path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(eo.EveryOSerializationError, match="truncated, corrupt"):
        eo.load(path)


def test_foreign_files_raise_clear_errors(tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    with pytest.raises(eo.EveryOSerializationError, match=str(text.name)):
        eo.load(text)
    plain = tmp_path / "plain.npz"
    np.savez(plain, x=np.ones(2))
    with pytest.raises(eo.EveryOSerializationError, match="not an EveryO checkpoint"):
        eo.load(plain)
    with pytest.raises(eo.EveryOSerializationError, match="does not exist"):
        eo.load(tmp_path / "missing.npz")


def test_failed_save_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "c.npz"
    eo.save({"v": np.zeros(2)}, path)
    before = path.read_bytes()
    with pytest.raises(eo.EveryOSerializationError, match="type object"):
        eo.save({"v": np.ones(2), "bad": object()}, path)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["c.npz"]


def test_unsupported_values_are_refused_before_writing(tmp_path):
    with pytest.raises(eo.EveryOSerializationError, match="object array"):
        eo.save({"o": np.array([1, "a"], dtype=object)}, tmp_path / "x.npz")
    with pytest.raises(eo.EveryOSerializationError, match="non-string key"):
        eo.save({1: np.ones(1)}, tmp_path / "x.npz")
    assert not (tmp_path / "x.npz").exists()


@pytest.mark.parametrize("failing", ["fsync", "replace"])
def test_a_failure_while_writing_keeps_the_old_checkpoint(failing, tmp_path, monkeypatch):
    import everyo.io

    path = tmp_path / "c.npz"
    eo.save({"v": np.zeros(2)}, path)
    before = path.read_bytes()

    def boom(*args):
        raise OSError(f"simulated failure in os.{failing}")

    monkeypatch.setattr(everyo.io.os, failing, boom)
    with pytest.raises(OSError, match="simulated"):
        eo.save({"v": np.ones(2)}, path)
    monkeypatch.undo()
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["c.npz"]
