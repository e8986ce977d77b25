"""Symbolic sizes: shape-dependent code (x.shape, arithmetic on it, reshape,
slicing, eo.arange) exports as a graph valid at every size of a dynamic axis;
Python decisions on such sizes are refused with the line, asserts become
guards; values that depend on an input are never computed outside the graph.
Every export is checked against EveryO at sizes other than the example's."""

import inspect
import os

import numpy as np
import onnx
import pytest

import everyo as eo
from everyo.errors import EveryOSerializationError, EveryOShapeError
from everyo.onnx.guards import check_guards, input_sizes, read_guards
from everyo.onnx.symbolic import SymInt

THIS_FILE = os.path.basename(__file__)
RNG = np.random.default_rng(0)


def line_of(fn, text):
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, line in enumerate(lines) if text in line)


def agrees(model, path, inputs):
    """ONNX Runtime on ``path`` against EveryO on each input tuple."""
    for xs in inputs:
        with eo.no_grad():
            expected = model(*[eo.tensor(x) for x in xs])
        expected = expected if isinstance(expected, tuple) else (expected,)
        actual = eo.run_onnx(path, *xs)
        actual = actual if isinstance(actual, (tuple, list)) else (actual,)
        for a, e in zip(actual, expected):
            assert a.shape == e.shape
            np.testing.assert_allclose(a, e.data, rtol=1e-5, atol=1e-5)


class SizesFromShape(eo.Module):
    def __init__(self):
        super().__init__()
        self.lin = eo.Linear(4, 6, seed=0)
        self.register_buffer("table", eo.tensor(RNG.standard_normal((16, 6)).astype(np.float32)))

    def forward(self, x):
        b, t, e = x.shape
        h = self.lin(x).reshape(b, t, 2, -1)  # sizes of x in a reshape
        h = h.reshape(b * t, -1)  # arithmetic on sizes
        pos = eo.arange(t, dtype="float32")  # positions 0..t-1
        rows = self.table[:t]  # a buffer sliced to the input's length
        return h[: b * t - 1].sum() + (pos[:, None] * rows).sum(axis=0), h[b * t - 1]  # slicing with sizes


def test_sizes_from_x_shape_follow_the_input(tmp_path):
    model = SizesFromShape()
    path = tmp_path / "m.onnx"
    x = RNG.standard_normal((2, 5, 4)).astype(np.float32)
    eo.export_onnx(model, path, example_input=x, dynamic_axes={"input": {0: "batch", 1: "seq"}}, verify=True)
    types = {n.op_type for n in onnx.load(str(path)).graph.node}
    assert {"Shape", "Range", "Slice", "Mul", "Sub"} <= types, types
    agrees(model, path, [(RNG.standard_normal((b, t, 4)).astype(np.float32),) for b, t in [(1, 1), (3, 9), (4, 16)]])


def test_shape_is_a_plain_tuple_outside_the_trace():
    x = eo.ones(2, 3)
    assert type(x.shape) is tuple and all(type(d) is int for d in x.shape)
    assert type(eo.Linear(3, 2, seed=0)(x)).__name__ == "Tensor"


class Branches(eo.Module):
    def forward(self, x):
        if x.shape[1] > 4:  # a Python decision on a size
            return x * 2
        return x


def test_a_decision_on_a_dynamic_size_is_refused_with_the_line(tmp_path):
    path = tmp_path / "m.onnx"
    with pytest.raises(EveryOSerializationError) as info:
        eo.export_onnx(Branches(), path, example_input=np.ones((2, 3), np.float32), dynamic_axes={"input": [0, 1]})
    message = str(info.value)
    assert f"{THIS_FILE}:{line_of(Branches.forward, 'if x.shape')}" in message, message
    assert "input_dim1 > 4" in message and "assert" in message and "eo.where" in message, message
    assert not path.exists()


def test_a_decision_on_a_static_size_is_fine(tmp_path):
    path = tmp_path / "m.onnx"
    x = np.ones((2, 6), np.float32)
    eo.export_onnx(Branches(), path, example_input=x, verify=True)  # only the batch axis is dynamic
    agrees(Branches(), path, [(np.ones((5, 6), np.float32),)])


class Checked(eo.Module):
    block = 8

    def __init__(self):
        super().__init__()
        self.register_buffer("mask", eo.tensor(np.tril(np.ones((8, 8), np.float32))))

    def forward(self, x):
        b, t = x.shape
        assert t <= self.block, f"cannot take {t} steps"
        return x[:, :, None] * self.mask[:t, :t]


@pytest.mark.parametrize("length", [3, 8])  # 8: one longer breaks the assert, so the check trace goes shorter
def test_an_assert_on_a_size_is_a_guard_of_the_file(length, tmp_path):
    path = tmp_path / "m.onnx"
    x = RNG.standard_normal((2, length)).astype(np.float32)
    eo.export_onnx(Checked(), path, example_input=x, dynamic_axes={"input": {0: "batch", 1: "seq"}}, verify=True)
    proto = onnx.load(str(path))
    (guard,) = read_guards(proto)
    assert guard.text == "seq <= 8" and f"{THIS_FILE}:{line_of(Checked.forward, 'assert')}" in guard.line
    assert "Guard: seq <= 8" in proto.doc_string
    ok = RNG.standard_normal((3, 8)).astype(np.float32)
    check_guards(read_guards(str(path)), input_sizes(proto, {"input": ok}))
    agrees(Checked(), path, [(ok,), (ok[:, :1],)])
    with pytest.raises(EveryOShapeError, match=r"needs seq <= 8 .*seq=9"):
        check_guards([guard], input_sizes(proto, {"input": np.ones((1, 9), np.float32)}))


class Table(eo.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("table", eo.tensor(RNG.standard_normal((10, 3)).astype(np.float32)))

    def forward(self, ids):
        return self.table[ids] * 2.0


def test_a_buffer_indexed_by_an_input_is_never_folded(tmp_path):
    # Every axis static and every example id the same: before, the rows were computed outside the
    # graph, verify=True passed and the file was wrong for every other id.
    path = tmp_path / "m.onnx"
    model = Table()
    ids = np.full((2, 4), 3, np.int64)
    tracer = _trace(model, ids)
    (node,) = [n for n in tracer.nodes if n.op == "getitem"]
    assert [v.name for v in node.deps] == ["input"]  # recorded, with the index as a dependency
    eo.export_onnx(model, path, example_input=ids, dynamic_axes={}, verify=True)
    gathers = [n for n in onnx.load(str(path)).graph.node if n.op_type.startswith("Gather")]
    assert gathers and "input" in [i for n in gathers for i in n.input]
    agrees(model, path, [(RNG.integers(0, 10, (2, 4)),) for _ in range(3)] + [(np.arange(8).reshape(2, 4),)])


def _trace(model, *arrays):
    from everyo.onnx.trace import trace

    tracer, _ = trace(model, arrays, ["input"], {}, {})
    return tracer


def test_integer_inputs_are_drawn_from_the_rows_they_index():
    from everyo.onnx.dynamic import integer_ranges, third_example

    emb = eo.Embedding(7, 2, seed=0)
    ids = np.zeros((2, 3), np.int64)
    assert integer_ranges(_trace(emb, ids)) == {"input": (0, 6)}
    drawn = third_example([ids], ["input"], {"input": (0, 6)})[0]
    assert drawn.shape == ids.shape and drawn.min() >= 0 and drawn.max() <= 6 and len(np.unique(drawn)) > 1
    assert integer_ranges(_trace(Table(), np.array([[2, 5]]))) == {"input": (0, 9)}


def test_traced_sizes_are_ints_with_their_origin():
    from everyo.onnx.trace import trace

    seen = []

    class Look(eo.Module):
        def forward(self, x):
            b, t = x.shape
            seen.append((b, t, (t * 2 - 1) // 3, -t % 4))
            return x

    trace(Look(), [np.ones((2, 5), np.float32)], ["input"], {}, {"input": {1: "seq"}})
    b, t, expr, neg = seen[0]
    assert type(b) is int and b == 2  # not a dynamic axis: a plain int
    assert isinstance(t, SymInt) and t == 5 and expr == 3 and neg == 3


def test_verify_also_compares_a_fresh_random_input_run_by_everyo(tmp_path, monkeypatch):
    import everyo.onnx.verify as verify

    seen = []
    real = verify.report
    monkeypatch.setattr(verify, "report", lambda data, keep: seen.extend(real(data, keep)) or seen)
    model = Table()
    eo.export_onnx(model, tmp_path / "m.onnx", example_input=np.full((2, 4), 3, np.int64), verify=True)
    fresh = [r for r in seen if "fresh random input" in r["run"]]
    assert fresh and all(r["ok"] for r in fresh)


class ThroughNumPy(eo.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("table", eo.tensor(RNG.standard_normal((10, 3)).astype(np.float32)))

    def forward(self, ids):
        return eo.tensor(self.table.data[ids.data])  # rows picked by NumPy: invisible to the trace


def test_a_value_computed_outside_the_graph_is_caught_with_equal_example_ids(tmp_path):
    path = tmp_path / "m.onnx"
    with pytest.raises(EveryOSerializationError, match="same sizes .* with different data .*x.data"):
        eo.export_onnx(ThroughNumPy(), path, example_input=np.full((2, 4), 3, np.int64), dynamic_axes={})
    assert not path.exists()


class UsesLen(eo.Module):
    def forward(self, x):
        n = len(x)  # a plain int: Python's len() cannot return anything else
        return x + eo.zeros(n, 4)


def test_len_of_a_traced_tensor_is_named_when_its_number_is_baked_in(tmp_path):
    path = tmp_path / "m.onnx"
    with pytest.raises(EveryOSerializationError) as info:
        eo.export_onnx(UsesLen(), path, example_input=np.ones((2, 4), np.float32))
    message = str(info.value)
    assert f"len() of a traced tensor at {__file__}:{line_of(UsesLen.forward, 'len(x)')}" in message, message
    assert "x.shape[0]" in message and not path.exists()
