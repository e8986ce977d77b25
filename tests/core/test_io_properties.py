"""Property-based: for any damaged or lying file, eo.load returns exactly what
was saved or raises EveryOSerializationError, and nothing else.

2,200 examples in all (truncations, bit flips anywhere and in the zip
structures, random manifests), on small payloads so the file runs in seconds.
"""

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from io_files import archive, meta, same

import everyo as eo
from everyo.io import manifest

STATE = {
    "w": np.arange(6, dtype=np.float32).reshape(2, 3),
    "ids": np.array([3, -1], dtype=np.int64),
    "step": 7,
    "lr": np.float64(0.5),
    "note": "ok",
    "t": (None, 1.5, float("inf")),
    "l": [True, {}],
}
MEMBERS = [np.arange(6, dtype=np.float32).reshape(2, 3), np.array([3, -1], dtype=np.int64), np.asarray(2.5)]
PROPERTY = settings(
    deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)


def _checkpoint_bytes(tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt") / "c.npz"
    eo.save(STATE, path)
    return path.read_bytes()


REFUSED = object()


def _outcome(path, data):
    """REFUSED (an EveryOSerializationError naming the file) or the loaded state;
    any other exception fails the test."""
    path.write_bytes(data)
    try:
        back = eo.load(path)
    except eo.EveryOSerializationError as exc:
        assert str(path) in str(exc)
        return REFUSED
    return back


_ORIGINAL = {}


def _original(tmp_path_factory):
    if "data" not in _ORIGINAL:
        _ORIGINAL["data"] = _checkpoint_bytes(tmp_path_factory)
    return _ORIGINAL["data"]


@settings(PROPERTY, max_examples=400)
@given(cut=st.integers(min_value=0, max_value=10**6))
def test_truncations(tmp_path_factory, cut):
    data = _original(tmp_path_factory)
    path = tmp_path_factory.getbasetemp() / "trunc.npz"
    assert _outcome(path, data[: cut % len(data)]) is REFUSED


def _flip(data, bits):
    out = bytearray(data)
    for bit in bits:
        bit %= 8 * len(out)
        out[bit // 8] ^= 1 << (bit % 8)
    return bytes(out)


@settings(PROPERTY, max_examples=600)
@given(bits=st.lists(st.integers(min_value=0, max_value=10**7), min_size=1, max_size=4))
def test_bit_flips_anywhere(tmp_path_factory, bits):
    data = _original(tmp_path_factory)
    result = _outcome(tmp_path_factory.getbasetemp() / "flip.npz", _flip(data, bits))
    assert result is REFUSED or same(result, STATE)


@settings(PROPERTY, max_examples=500)
@given(where=st.sampled_from(["local", "central"]), offset=st.integers(0, 10**6), bit=st.integers(0, 7))
def test_bit_flips_in_the_zip_structures(tmp_path_factory, where, offset, bit):
    # The first local header + npy header, or the central directory + end record:
    # the fields a reader must not trust.
    data = _original(tmp_path_factory)
    central = data.rfind(b"PK\x01\x02", 0, data.rfind(b"PK\x01\x02"))
    start, stop = (0, 160) if where == "local" else (central, len(data))
    position = start + offset % (stop - start)
    result = _outcome(tmp_path_factory.getbasetemp() / "zipflip.npz", _flip(data, [8 * position + bit]))
    assert result is REFUSED or same(result, STATE)


# --- lying manifests ----------------------------------------------------------------
_DTYPES = st.sampled_from(["<f4", "<i8", "<f8", "|u1", "bfloat16", "|O", "<V8", "f4", "<f0", 7, None])
_SHAPES = st.one_of(
    st.lists(st.integers(-2, 7), max_size=3),
    st.just([2, 3]),
    st.just([2]),
    st.just([]),
    st.integers(),
    st.text(max_size=3),
)
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=6,
)


@st.composite
def _array_nodes(draw):
    node = {"t": "array", "i": draw(st.one_of(st.integers(-1, 3), st.sampled_from(["0", 0.0, True])))}
    if draw(st.booleans()):
        node["dtype"] = draw(_DTYPES)
    if draw(st.booleans()):
        node["shape"] = draw(_SHAPES)
    if draw(st.integers(0, 3)) == 0:
        node["scalar"] = draw(st.sampled_from([True, False, 1, "yes"]))
    return node


_LEAVES = st.one_of(
    _array_nodes(),
    st.builds(lambda v: {"t": "value", "v": v}, _JSON),
    st.builds(lambda v: {"t": "float", "v": v}, st.sampled_from(["inf", "-inf", "nan", "1.0", 1.0])),
    _JSON,
)


def _canonical(tree):
    """The tree as eo.save would write it back (drops the optional scalar=False)."""
    if isinstance(tree, dict):
        return {k: _canonical(v) for k, v in tree.items() if not (k == "scalar" and v is False)}
    if isinstance(tree, list):
        return [_canonical(v) for v in tree]
    return tree


_VALID_LEAVES = st.one_of(
    st.just("ARRAY"),
    st.builds(
        lambda v: {"t": "value", "v": v},
        st.none()
        | st.booleans()
        | st.integers()
        | st.text(max_size=3)
        | st.floats(allow_nan=False, allow_infinity=False),
    ),
    st.builds(lambda v: {"t": "float", "v": v}, st.sampled_from(["inf", "-inf", "nan"])),
)
_VALID_TREES = st.recursive(
    _VALID_LEAVES,
    lambda inner: st.one_of(
        st.builds(lambda items: {"t": "list", "items": items}, st.lists(inner, max_size=3)),
        st.builds(lambda items: {"t": "tuple", "items": items}, st.lists(inner, max_size=3)),
        st.builds(
            lambda d: {"t": "dict", "items": [[k, v] for k, v in d.items()]},
            st.dictionaries(st.text(max_size=2), inner, max_size=3),
        ),
    ),
    max_leaves=8,
)


def _place_arrays(tree, count):
    """Replace "ARRAY" placeholders by nodes of MEMBERS[0..2] (the rest by None values)."""
    if tree == "ARRAY":
        if count[0] == len(MEMBERS):
            return {"t": "value", "v": None}
        i, count[0] = count[0], count[0] + 1
        a = MEMBERS[i]
        return {"t": "array", "i": i, "dtype": a.dtype.str, "shape": list(a.shape)}
    if tree["t"] in ("list", "tuple"):
        return {"t": tree["t"], "items": [_place_arrays(v, count) for v in tree["items"]]}
    if tree["t"] == "dict":
        return {"t": "dict", "items": [[k, _place_arrays(v, count)] for k, v in tree["items"]]}
    return tree


def _nodes(tree):
    yield tree
    for v in tree.get("items", []):
        yield from _nodes(v[1] if tree["t"] == "dict" else v)


@st.composite
def _manifests(draw):
    """(tree, members, lied): a valid manifest, and with probability 3/4 one lie in it."""
    count = [0]
    tree = _place_arrays(draw(_VALID_TREES), count)
    members = count[0]
    lie = draw(st.integers(0, 3))
    if lie == 0:
        return tree, members, False
    node = draw(st.sampled_from(list(_nodes(tree))))
    if lie == 1:  # one field replaced (or added) with junk
        field = draw(st.sampled_from(sorted(set(node) | {"t", "v", "i", "dtype", "shape", "scalar", "items"})))
        node[field] = draw(st.one_of(_JSON, _DTYPES, _SHAPES, st.integers(-1, 3)))
    elif lie == 2:  # a node replaced by a random (mostly malformed) one
        node.clear()
        node.update(draw(_LEAVES.filter(lambda n: isinstance(n, dict))))
    else:  # the archive's members disagree with the manifest
        members = draw(st.integers(0, 3).filter(lambda m: m != count[0]))
    return tree, members, True


@settings(PROPERTY, max_examples=700)
@given(case=_manifests(), version=st.sampled_from([2, 2, 2, 1]))
def test_random_manifests(tmp_path_factory, case, version):
    tree, members, lied = case
    data = archive(meta(tree, version), {f"a{i}.npy": MEMBERS[i] for i in range(members)})
    result = _outcome(tmp_path_factory.getbasetemp() / "lie.npz", data)
    if not lied and version == 2:
        assert result is not REFUSED, "a valid checkpoint was refused"
    if result is REFUSED:
        return
    # Accepted: then the file was a consistent checkpoint, and saving what came back
    # reproduces its manifest and its arrays exactly.
    arrays = []
    again = manifest.encode(result, arrays, "state")
    if version == 2:
        assert again == _canonical(tree)
    assert len(arrays) == members and all(same(a, MEMBERS[i]) for i, a in enumerate(arrays))
