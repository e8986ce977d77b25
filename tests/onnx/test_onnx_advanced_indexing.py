"""Advanced indexing (integer lists and arrays on any axis, graph-input
indices, constant boolean masks, negative indices and steps) exported and
checked against ONNX Runtime at several sizes, with verify=True. The
expected values are EveryO's eager result, itself NumPy's indexing."""

import numpy as np
import pytest
from onnx_agreement import assert_traced_agrees

import everyo as eo
from everyo.errors import EveryOSerializationError


class Fn(eo.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


def floats(*shape):
    def make(batch):
        return np.random.default_rng(batch).standard_normal((batch,) + shape).astype(np.float32)

    return make


MASK = np.array([True, False, True, True])

# (id, forward on x of shape (batch, 3, 4, 5))
CONSTANT_INDICES = [
    ("list_last_middle_axis", lambda x: x[:, [-1], :]),
    ("list_axis1_repeated", lambda x: x[:, [0, 2, 0]]),
    ("array_last_axis", lambda x: x[..., np.array([4, -5, 1])]),
    ("array_2d_axis2", lambda x: x[:, :, np.array([[0, 1], [3, -1]])]),
    ("two_adjacent_arrays", lambda x: x[:, [0, 2], [1, 3]]),
    ("two_arrays_broadcast", lambda x: x[:, np.array([[0], [2]]), np.array([1, 3, -1])]),
    ("separated_arrays_go_first", lambda x: x[:, [0, 1], :, [4, 2]]),
    ("int_and_array_adjacent", lambda x: x[:, 1, [0, 3]]),
    ("int_and_array_separated", lambda x: x[:, [2, 0], :, -1]),
    ("array_with_slices_and_steps", lambda x: x[:, ::-1, [3, 0], 1::2]),
    ("array_with_none", lambda x: x[:, None, [1, 2]]),
    ("constant_mask", lambda x: x[:, :, MASK]),
    ("constant_mask_2d", lambda x: x[:, np.array([[True, False, True, False]] * 3)]),
    ("tensor_constant_index", lambda x: x[:, eo.tensor(np.array([2, 0]))]),
]


@pytest.mark.parametrize("fn", [c[1] for c in CONSTANT_INDICES], ids=[c[0] for c in CONSTANT_INDICES])
def test_constant_indices(fn, tmp_path):
    assert_traced_agrees(Fn(fn), floats(3, 4, 5), tmp_path / "m.onnx", sizes=[(2,), (1,), (6,)])


def test_list_index_on_the_dynamic_axis(tmp_path):
    # nanoGPT's logits[:, [-1], :] on a dynamic sequence axis: -1 stays "the last position".
    make = lambda b, t: np.random.default_rng(b * 10 + t).standard_normal((b, t, 7)).astype(np.float32)  # noqa: E731
    assert_traced_agrees(
        Fn(lambda x: x[:, [-1], :]),
        make,
        tmp_path / "m.onnx",
        sizes=[(2, 5), (1, 1), (3, 9)],
        dynamic_axes={"input": {0: "batch", 1: "seq"}},
    )


def _ids_and_data(batch, n=3, high=4):
    rng = np.random.default_rng(batch)
    x = rng.standard_normal((batch, high, 5)).astype(np.float32)
    return x, rng.integers(-high, high, size=(batch, n)).astype(np.int64)


@pytest.mark.parametrize(
    "fn",
    [
        lambda x, idx: x[:, idx[0]],  # a graph-input index on axis 1
        lambda x, idx: x[0, idx[0]],
        lambda x, idx: x[:, idx[0], [1, -1, 2]],  # graph-input and constant arrays together
        lambda x, idx: x[:, idx[:, :1], idx],  # two graph-computed arrays, broadcast
    ],
    ids=["input_index_axis1", "int_then_input_index", "input_and_constant", "two_traced_broadcast"],
)
def test_input_indices(fn, tmp_path):
    assert_traced_agrees(Fn(fn), _ids_and_data, tmp_path / "m.onnx", sizes=[(2,), (1,), (5,)])


def test_input_index_int32(tmp_path):
    make = lambda b: (_ids_and_data(b)[0], _ids_and_data(b)[1].astype(np.int32))  # noqa: E731
    assert_traced_agrees(Fn(lambda x, idx: x[:, idx[0]]), make, tmp_path / "m.onnx", sizes=[(2,), (4,)])


def test_mask_from_the_input_is_refused_by_name(tmp_path):
    model = Fn(lambda x: x[x > 0])
    with pytest.raises(EveryOSerializationError, match=r"boolean mask computed from the input.*eo\.where") as info:
        eo.export_onnx(model, tmp_path / "m.onnx", example_input=floats(3)(2))
    assert "test_onnx_advanced_indexing.py" in str(info.value)  # the user's line
    assert not (tmp_path / "m.onnx").exists()


def test_index_computed_outside_the_graph_is_refused(tmp_path):
    # np.arange(x.shape[1]) is a constant to the tracer, different at each size: refused, not baked in.
    model = Fn(lambda x: x[:, np.arange(x.data.shape[1]) % 2])
    make = lambda b, t: np.ones((b, t), np.float32)  # noqa: E731
    with pytest.raises(EveryOSerializationError, match="differs between a trace"):
        eo.export_onnx(model, tmp_path / "m.onnx", example_input=make(2, 3), dynamic_axes={"input": {0: "b", 1: "t"}})
    assert not (tmp_path / "m.onnx").exists()


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: x[:, : x.shape[1] - 1, [0, 2]],  # a slice bound from x.shape with an array
        lambda x: x[:, x.shape[1] - 2, [0, -1]],  # an integer from x.shape with an array
        lambda x: x[:, [0, -1], x.shape[0] % 5],  # an integer from x.shape after an array
    ],
    ids=["symbolic_slice", "symbolic_int_adjacent", "symbolic_int_after"],
)
def test_sizes_from_the_shape_stay_symbolic_next_to_arrays(fn, tmp_path):
    make = lambda b, t: np.random.default_rng(b * 10 + t).standard_normal((b, t, 5)).astype(np.float32)  # noqa: E731
    assert_traced_agrees(
        Fn(fn), make, tmp_path / "m.onnx", sizes=[(2, 4), (1, 3), (3, 7)], dynamic_axes={"input": {0: "b", 1: "t"}}
    )
