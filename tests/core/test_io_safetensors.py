"""eo.save / eo.load of .safetensors files (the optional everyo-core[safetensors] extra)."""

import json
import os
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from io_files import same

import everyo as eo

safetensors_numpy = pytest.importorskip("safetensors.numpy")  # optional extra; in the core cell's deps


def _state():
    return {
        "model": {
            "0.weight": np.arange(6, dtype=np.float32).reshape(2, 3),
            "0.bias": np.zeros(3, np.float16),
            "emb": {"ids": np.array([1, -2], np.int64)},
        },
        "mask": np.array([True, False]),
        "bytes": np.arange(4, dtype=np.uint8),
        "z": np.array([1 + 2j], np.complex64),
        "empty": {},
        "scalar": np.asarray(np.float64(2.5)),
    }


def test_nested_dicts_round_trip_exactly(tmp_path):
    path = tmp_path / "m.safetensors"
    eo.save(_state(), path)
    assert same(eo.load(path), _state())


def test_the_file_is_plain_safetensors_with_dotted_names(tmp_path):
    path = tmp_path / "m.safetensors"
    eo.save(_state(), path)
    flat = safetensors_numpy.load_file(str(path))
    assert set(flat) == {"model.0.weight", "model.0.bias", "model.emb.ids", "mask", "bytes", "z", "scalar"}
    assert np.array_equal(flat["model.0.weight"], _state()["model"]["0.weight"])


def test_a_foreign_file_loads_as_a_flat_dict(tmp_path):
    path = tmp_path / "hf.safetensors"
    safetensors_numpy.save_file(
        {"b.weight": np.ones((2, 2), np.float32), "a.bias": np.zeros(2, np.float32)},
        str(path),
        metadata={"format": "pt"},
    )
    back = eo.load(path)
    assert set(back) == {"a.bias", "b.weight"} and back["b.weight"].dtype == np.float32
    assert back["b.weight"].flags.writeable


def test_tensors_are_saved_as_their_arrays(tmp_path):
    model = eo.Linear(3, 2, seed=0)
    eo.save({"model": {k: eo.Tensor(v) for k, v in model.state_dict().items()}}, tmp_path / "t.safetensors")
    back = eo.load(tmp_path / "t.safetensors")
    assert np.array_equal(back["model"]["weight"], model.weight.data)


@pytest.mark.parametrize(
    "value, match",
    [
        (3, "has type int.*only arrays"),
        (None, "NoneType"),
        ([np.ones(2)], "list"),
        ("s", "str"),
        (np.array(["a"]), "dtype <U1"),
        (np.array([1j]), "complex128"),
        (np.ma.masked_array([1.0], mask=[True]), "masked array"),
    ],
)
def test_values_safetensors_cannot_hold_are_refused_before_writing(tmp_path, value, match):
    with pytest.raises(eo.EveryOSerializationError, match=match):
        eo.save({"w": np.ones(2), "v": value}, tmp_path / "x.safetensors")
    assert not (tmp_path / "x.safetensors").exists()


def test_names_that_flatten_to_the_same_key_are_refused(tmp_path):
    with pytest.raises(eo.EveryOSerializationError, match="same safetensors name 'a.b'"):
        eo.save({"a": {"b": np.ones(1)}, "a.b": np.zeros(1)}, tmp_path / "x.safetensors")
    with pytest.raises(eo.EveryOSerializationError, match="dict of arrays"):
        eo.save([np.ones(1)], tmp_path / "x.safetensors")


def test_big_endian_arrays_are_stored_little_endian(tmp_path):
    eo.save({"w": np.arange(3, dtype=">f4")}, tmp_path / "b.safetensors")
    back = eo.load(tmp_path / "b.safetensors")["w"]
    assert back.dtype == np.dtype("<f4") and np.array_equal(back, np.arange(3))


def test_without_the_package_the_error_says_what_to_install(tmp_path, monkeypatch):
    eo.save({"w": np.ones(2)}, tmp_path / "w.safetensors")
    monkeypatch.setitem(sys.modules, "safetensors", None)
    for call in (
        lambda: eo.save({"w": np.ones(2)}, tmp_path / "v.safetensors"),
        lambda: eo.load(tmp_path / "w.safetensors"),
    ):
        with pytest.raises(eo.EveryOSerializationError, match=r"pip install everyo-core\[safetensors\]"):
            call()
    monkeypatch.undo()
    assert np.array_equal(eo.load(tmp_path / "w.safetensors")["w"], np.ones(2))
    assert not (tmp_path / "v.safetensors").exists()


def _with_tree(tmp_path, tree):
    path = tmp_path / "t.safetensors"
    safetensors_numpy.save_file(
        {"a": np.ones(2, np.float32), "b": np.zeros(1, np.float32)}, str(path), metadata={"everyo.tree": tree}
    )
    return path


@pytest.mark.parametrize(
    "tree, match",
    [
        ("not json", "not valid JSON"),
        ('["a"]', "malformed"),
        ('{"x": "a"}', "does not mention tensors"),
        ('{"x": "a", "y": "a", "z": "b"}', "names twice"),
        ('{"x": "c", "y": "a", "z": "b"}', "does not hold"),
        ('{"x": 1}', "malformed"),
        ("[" * 10_000 + "]" * 10_000, "not valid JSON|malformed"),
    ],
)
def test_lying_tree_metadata_is_refused(tmp_path, tree, match):
    with pytest.raises(eo.EveryOSerializationError, match=match):
        eo.load(_with_tree(tmp_path, tree))


def test_missing_and_foreign_files(tmp_path):
    with pytest.raises(eo.EveryOSerializationError, match="does not exist"):
        eo.load(tmp_path / "none.safetensors")
    (tmp_path / "n.safetensors").write_bytes((8).to_bytes(8, "little") + b"{}      ")
    assert eo.load(tmp_path / "n.safetensors") == {}  # a valid empty file
    npz = tmp_path / "real.npz"
    eo.save({"w": np.ones(2)}, npz)
    (tmp_path / "renamed.safetensors").write_bytes(npz.read_bytes())
    with pytest.raises(eo.EveryOSerializationError, match="renamed.safetensors.*not a safetensors file"):
        eo.load(tmp_path / "renamed.safetensors")
    (tmp_path / "weights.bin").write_bytes((tmp_path / "n.safetensors").read_bytes())
    with pytest.raises(eo.EveryOSerializationError, match="weights.bin.*looks like a safetensors file"):
        eo.load(tmp_path / "weights.bin")


_ORIGINAL = {}


@settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(0, 10**6), bits=st.lists(st.integers(0, 10**7), max_size=3))
def test_damaged_files_raise_only_serialization_errors(tmp_path_factory, cut, bits):
    # safetensors has no checksum: a flip inside the data changes values without a trace,
    # so the property here is only "a dict or a clear error", never another exception.
    if "data" not in _ORIGINAL:
        path = tmp_path_factory.mktemp("st") / "o.safetensors"
        eo.save(_state(), path)
        _ORIGINAL["data"] = path.read_bytes()
    data = bytearray(_ORIGINAL["data"][: max(1, cut % (len(_ORIGINAL["data"]) + 1))])
    for bit in bits:
        bit %= 8 * len(data)
        data[bit // 8] ^= 1 << (bit % 8)
    path = tmp_path_factory.getbasetemp() / "d.safetensors"
    path.write_bytes(bytes(data))
    try:
        back = eo.load(path)
    except eo.EveryOSerializationError as exc:
        assert "d.safetensors" in str(exc)
    else:
        assert isinstance(back, dict)


def test_a_header_declaring_huge_tensors_is_refused(tmp_path):
    header = json.dumps({"w": {"dtype": "F32", "shape": [2**40], "data_offsets": [0, 2**42]}}).encode()
    path = tmp_path / "huge.safetensors"
    path.write_bytes(len(header).to_bytes(8, "little") + header + b"\x00" * 16)
    with pytest.raises(eo.EveryOSerializationError, match="huge.safetensors"):
        eo.load(path)
    assert os.path.getsize(path) < 200
