"""eo.load on hostile files: every one is a clear EveryOSerializationError
naming the file, never another exception, never unpickling, and never an
allocation larger than the file."""

import json
import os
import pickle
import tracemalloc
import zipfile

import numpy as np
import pytest
from io_files import archive, array_node, meta, npy_bytes, same

import everyo as eo

W = np.arange(6, dtype=np.float32).reshape(2, 3)


def _load_bytes(tmp_path, data, name="c.npz"):
    path = tmp_path / name
    path.write_bytes(data)
    return eo.load(path)


def _refused(tmp_path, data, match):
    path = tmp_path / "c.npz"
    path.write_bytes(data)
    with pytest.raises(eo.EveryOSerializationError, match=match) as info:
        eo.load(path)
    assert str(path) in str(info.value)
    return info.value


def test_a_plain_npy_file_is_named_as_such(tmp_path):
    path = tmp_path / "w.npy"
    np.save(path, W)
    with pytest.raises(eo.EveryOSerializationError, match=r"plain NumPy \.npy file.*np\.load") as info:
        eo.load(path)
    assert str(path) in str(info.value)


def test_a_foreign_npz_is_not_an_everyo_checkpoint(tmp_path):
    path = tmp_path / "f.npz"
    np.savez_compressed(path, x=W)
    with pytest.raises(eo.EveryOSerializationError, match="not an EveryO checkpoint"):
        eo.load(path)


def test_a_pytorch_zip_checkpoint_gets_a_hint(tmp_path):
    data = archive(None, {"archive/data.pkl": b"\x80\x04K\x01."})
    _refused(tmp_path, data, "PyTorch checkpoint.*safetensors")


@pytest.mark.parametrize("name", ["../../evil.npy", "/etc/evil.npy", "a1.npy", "sub/a0.npy"])
def test_unexpected_members_such_as_path_traversal_names_are_refused(tmp_path, name):
    data = archive(meta({"t": "dict", "items": [["w", array_node(0, W)]]}), {"a0.npy": W, name: W})
    _refused(tmp_path, data, "unexpected members")
    assert not os.path.exists("/etc/evil.npy")


def test_a_member_named_twice_is_refused(tmp_path):
    import io
    import warnings

    buf = io.BytesIO()
    with warnings.catch_warnings(), zipfile.ZipFile(buf, "w") as z:
        warnings.simplefilter("ignore")  # zipfile warns about the duplicate, and writes it
        z.writestr(
            "__everyo_manifest__.npy", npy_bytes(np.frombuffer(json.dumps(meta(array_node(0, W))).encode(), np.uint8))
        )
        z.writestr("a0.npy", npy_bytes(W))
        z.writestr("a0.npy", npy_bytes(W + 1))
    _refused(tmp_path, buf.getvalue(), "two members named 'a0.npy'")


def test_a_zip_bomb_is_refused_before_inflating(tmp_path):
    big = np.zeros(2**26, dtype=np.float32)  # 256 MiB of zeros: deflates to about 256 KiB
    honest = meta(array_node(0, big))
    data = archive(honest, {"a0.npy": big}, compression=zipfile.ZIP_DEFLATED)
    assert len(data) < 2**20
    path = tmp_path / "bomb.npz"
    path.write_bytes(data)
    del big
    tracemalloc.start()
    try:
        with pytest.raises(eo.EveryOSerializationError, match="compressed.*zip bomb"):
            eo.load(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2**22, peak


def test_a_manifest_declaring_terabytes_allocates_nothing(tmp_path):
    huge = {"t": "array", "i": 0, "dtype": "<f4", "shape": [2**40]}
    member = npy_bytes(np.zeros(0, np.float32)).replace(b"(0,)", b"(1099511627776,)")
    data = archive(meta(huge), {"a0.npy": member})
    assert len(data) < 1000
    tracemalloc.start()
    try:
        _refused(tmp_path, data, "declares")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2**20, peak
    _refused(tmp_path, archive(meta({**huge, "shape": [2**50]}), {"a0.npy": member}), "more than any checkpoint")


def test_a_member_longer_than_its_manifest_says_is_refused_before_reading(tmp_path):
    data = archive(meta(array_node(0, W)), {"a0.npy": np.zeros(10**6, np.float32)})
    _refused(tmp_path, data, r"declares 4000128 bytes, but the manifest's dtype and shape need")


PICKLE_BOMB = pickle.dumps(__import__("pathlib").Path)  # any pickle: it must never be loaded


@pytest.mark.parametrize("descr", ["|O", "<V8", "[('a', '<f4')]", "<M8[ns]"])
def test_object_structured_and_datetime_members_are_refused_without_unpickling(tmp_path, descr):
    header = npy_bytes(np.zeros(1, np.float64))
    member = header.replace(b"'<f8'", repr(descr).encode()) + PICKLE_BOMB
    v1 = {"format": "everyo-checkpoint", "version": 1, "tree": {"t": "array", "i": 0}}
    _refused(tmp_path, archive(v1, {"a0.npy": member}), "dtype|truncated, corrupt|header|holds")


def _lie(tree, version=2):
    return archive(meta(tree, version), {"a0.npy": W})


LYING_MANIFESTS = {
    "shape": ({"t": "array", "i": 0, "dtype": "<f4", "shape": [3, 2]}, "shape"),
    "more elements": ({"t": "array", "i": 0, "dtype": "<f4", "shape": [2, 4]}, "with shape"),
    "dtype": ({"t": "array", "i": 0, "dtype": "<i4", "shape": [2, 3]}, "stored as <f4"),
    "itemsize": ({"t": "array", "i": 0, "dtype": "<f8", "shape": [2, 3]}, "stored as <f4"),
    "object dtype": ({"t": "array", "i": 0, "dtype": "|O", "shape": [2, 3]}, "not a dtype"),
    "dtype not a string": ({"t": "array", "i": 0, "dtype": 4, "shape": [2, 3]}, "not a dtype"),
    "negative size": ({"t": "array", "i": 0, "dtype": "<f4", "shape": [-2, -3]}, "non-negative"),
    "float size": ({"t": "array", "i": 0, "dtype": "<f4", "shape": [2.0, 3]}, "non-negative integers"),
    "shape a string": ({"t": "array", "i": 0, "dtype": "<f4", "shape": "2,3"}, "shape"),
    "rank 65": ({"t": "array", "i": 0, "dtype": "<f4", "shape": [1] * 65}, "at most 64"),
    "index out of range": ({"t": "array", "i": 1, "dtype": "<f4", "shape": [2, 3]}, "indices"),
    "index a string": ({"t": "array", "i": "0", "dtype": "<f4", "shape": [2, 3]}, "bad index"),
    "index a bool": ({"t": "array", "i": False, "dtype": "<f4", "shape": [2, 3]}, "bad index"),
    "index used twice": ({"t": "list", "items": [array_node(0, W), array_node(0, W)]}, "twice"),
    "scalar with a shape": ({**array_node(0, W), "scalar": True}, "scalar"),
    "scalar flag a string": ({**array_node(0, W), "scalar": "yes"}, "scalar flag"),
    "missing dtype": ({"t": "array", "i": 0, "shape": [2, 3]}, "fields"),
    "extra field": ({**array_node(0, W), "pickle": "x"}, "fields"),
    "unknown type": ({"t": "pickle", "v": 1}, "unknown type"),
    "type missing": ({"i": 0}, "not a node"),
    "node a list": ([1, 2], "not a node"),
    "value a list": ({"t": "list", "items": [array_node(0, W), {"t": "value", "v": [1, 2]}]}, "value node"),
    "float word": ({"t": "list", "items": [array_node(0, W), {"t": "float", "v": "1e999"}]}, "float node"),
    "items a dict": ({"t": "dict", "items": {"w": array_node(0, W)}}, "dict node"),
    "dict key an int": ({"t": "dict", "items": [[0, array_node(0, W)]]}, "malformed or repeated key"),
    "dict key twice": (
        {"t": "dict", "items": [["w", array_node(0, W)], ["w", {"t": "value", "v": 1}]]},
        "repeated key",
    ),
    "dict item too long": ({"t": "dict", "items": [["w", array_node(0, W), 1]]}, "malformed"),
    "array never used": ({"t": "value", "v": 1}, "unexpected members"),
}


@pytest.mark.parametrize("case", sorted(LYING_MANIFESTS))
def test_lying_manifests_are_refused(tmp_path, case):
    tree, match = LYING_MANIFESTS[case]
    _refused(tmp_path, _lie(tree), match)


def _nested(depth):
    tree = array_node(0, W)
    for _ in range(depth):
        tree = {"t": "list", "items": [tree]}
    return tree


def test_deep_nesting_is_refused_at_any_depth(tmp_path):
    _refused(tmp_path, _lie(_nested(65)), "nests more than 64")
    deep = b'{"format": "everyo-checkpoint", "version": 2, "tree": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    _refused(tmp_path, archive(deep, {"a0.npy": W}), "nested too deeply|not a node")
    assert same(_load_bytes(tmp_path, _lie(_nested(64))), eval("[" * 64 + "W" + "]" * 64))


@pytest.mark.parametrize(
    "raw, match",
    [
        (b"\xff\xfe not utf-8", "not valid JSON"),
        (b"{not json", "not valid JSON"),
        (b'"a string"', "not an EveryO manifest"),
        (b'{"format": "everyo-checkpoint", "version": 3, "tree": null}', "version 3"),
        (b'{"format": "everyo-checkpoint", "version": "2", "tree": null}', "version '2'"),
        (b'{"format": "everyo-checkpoint", "version": 2, "tree": null, "x": 1}', "unexpected fields"),
        (b'{"format": "other", "version": 2, "tree": null}', "not an EveryO manifest"),
        (
            b'{"format": "everyo-checkpoint", "version": 2, "tree": {"t": "value", "v": ' + b"9" * 5000 + b"}}",
            "not valid JSON",
        ),
    ],
)
def test_malformed_manifest_documents_are_refused(tmp_path, raw, match):
    _refused(tmp_path, archive(raw, {}), match)


def test_a_manifest_member_that_is_not_bytes_is_refused(tmp_path):
    data = archive(None, {"__everyo_manifest__.npy": W})
    _refused(tmp_path, data, r"stored as <f4 but the manifest says \|u1")


def test_version_1_checkpoints_from_everyo_0_1_still_load(tmp_path):
    tree = {
        "t": "dict",
        "items": [
            ["w", {"t": "array", "i": 0}],
            ["lr", {"t": "array", "i": 1, "scalar": True}],
            ["n", {"t": "value", "v": 3}],
            ["x", {"t": "float", "v": "inf"}],
        ],
    }
    data = archive(meta(tree, version=1), {"a0.npy": W, "a1.npy": np.asarray(np.float32(0.5))})
    back = _load_bytes(tmp_path, data)
    assert same(back, {"w": W, "lr": np.float32(0.5), "n": 3, "x": float("inf")})


def test_a_crc_matching_change_of_values_is_read_faithfully(tmp_path):
    # Not a lie the reader can see: the bytes are a valid checkpoint of other values.
    other = W + 1
    data = archive(meta({"t": "dict", "items": [["w", array_node(0, other)]]}), {"a0.npy": other})
    assert same(_load_bytes(tmp_path, data), {"w": other})


def test_a_masked_array_is_refused_on_save(tmp_path):
    masked = np.ma.masked_array([1.0, 2.0, 3.0], mask=[False, True, False])
    with pytest.raises(eo.EveryOSerializationError, match=r"state\['m'\] is a masked array.*getmaskarray"):
        eo.save({"m": masked}, tmp_path / "m.npz")
    assert not (tmp_path / "m.npz").exists()


def _deep_list(depth):
    value = W
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    "value, match",
    [
        (np.zeros(2, dtype=[("a", "<f4")]), "dtype"),
        (np.array(["2020-01-01"], dtype="M8[D]"), "dtype"),
        (_deep_list(70), "nested more than 64"),
        pytest.param(2**20000, "cannot be written to the manifest", id="int-of-6000-digits"),
    ],
)
def test_values_a_checkpoint_cannot_hold_are_refused_on_save(tmp_path, value, match):
    with pytest.raises(eo.EveryOSerializationError, match=match):
        eo.save({"v": value}, tmp_path / "x.npz")
    assert not (tmp_path / "x.npz").exists()


def test_every_kind_of_value_round_trips_exactly(tmp_path):
    state = {
        "f16": np.array([1.5, -0.0, np.inf], dtype=np.float16),
        "c": np.array([1 + 2j], np.complex128),
        "big_endian": np.arange(3, dtype=">i4"),
        "fortran": np.asfortranarray(np.arange(6.0).reshape(2, 3)),
        "strided": np.arange(10)[::3],
        "bool": np.array([True, False]),
        "u": np.array(["ab", "ç"]),
        "bytes": np.array([b"x", b"yz"]),
        "empty": np.zeros((0, 3), np.float32),
        "scalar": np.int64(-5),
        "nested": [(1, 2.5, None, "s", True), {"": float("-inf"), "nan": float("nan")}],
        "big": 2**70,
    }
    path = tmp_path / "all.npz"
    eo.save(state, path)
    back = eo.load(path)
    expected = dict(state, strided=np.ascontiguousarray(state["strided"]))
    assert same(back, expected)
    assert back["fortran"].flags.f_contiguous and back["f16"].flags.writeable
