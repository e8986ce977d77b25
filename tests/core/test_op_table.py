"""The op table (everyo.dispatch): every primitive is registered, the
precision policy is applied by the table, and a tracer sees each outermost
primitive call with enough detail to recompute the model from the record."""

import inspect
import operator
import threading
from contextlib import contextmanager

import numpy as np
import pytest

import everyo as eo
from everyo import (
    comparisons,
    contraction,
    conv,
    dispatch,
    elementwise,
    functional,
    indexing,
    losses,
    recurrent_ops,
    reductions,
    sequence_ops,
    shape_ops,
    sorting,
)
from everyo import functional as F
from everyo.tensor import Tensor

OP_MODULES = (
    functional,
    conv,
    losses,
    sequence_ops,
    recurrent_ops,
    comparisons,
    reductions,
    sorting,
    elementwise,
    shape_ops,
    indexing,
    contraction,
)
HELPERS = {"unbroadcast", "multi_output", "gather"}  # public functions that are not ops themselves (gather: an alias)


class Recorder:
    """A toy tracer: keeps every call it is told about."""

    def __init__(self):
        self.records, self.python_values = [], []

    def record(self, name, inputs, outputs, attrs):
        self.records.append((name, inputs, outputs, attrs))

    def on_python_value(self, tensor, kind):
        self.python_values.append((tensor, kind))

    @property
    def names(self):
        return [r[0] for r in self.records]


@contextmanager
def tracing(tracer=None):
    tracer = tracer or Recorder()
    token = dispatch.set_tracer(tracer)
    try:
        yield tracer
    finally:
        dispatch.reset_tracer(token)


@contextmanager
def policy(p):
    token = dispatch.set_policy(p)
    try:
        yield p
    finally:
        dispatch.reset_policy(token)


def replay(records, feeds):
    """Recompute a recorded graph with no tracer: each record's op is called
    on the replayed values of its inputs and its recorded attrs. ``feeds``
    maps id(recorded tensor) to the value to use instead."""
    env = dict(feeds)
    for name, inputs, outputs, attrs in records:
        op = dispatch.OPS[name]
        values = [None if t is None else env.get(id(t), t) for t in inputs]
        single = sum(1 for spec in op.inputs if not spec.startswith("*"))
        arguments, pos = {}, 0
        for pname in op.signature.parameters:
            spec = next((s for s in op.inputs if s.lstrip("*") == pname), None)
            if spec is not None and spec.startswith("*"):
                count = len(values) - single
                arguments[pname] = tuple(values[pos : pos + count])
                pos += count
            elif spec is not None:
                arguments[pname] = values[pos]
                pos += 1
            else:
                arguments[pname] = attrs[pname]
        call = inspect.BoundArguments(op.signature, arguments)
        args, kwargs = call.args, call.kwargs
        out = op.function(*args, **kwargs)
        for recorded, new in zip(outputs, out if isinstance(out, (list, tuple)) else (out,)):
            env[id(recorded)] = new
    return env


def check_connected(records, sources):
    """Every input that carries a gradient comes from an earlier record or is a
    source (parameter or model input): nothing was computed off the record."""
    known = {id(s) for s in sources}
    for name, inputs, outputs, _ in records:
        for t in inputs:
            if t is not None and t.requires_grad:
                assert id(t) in known, f"{name}: an input requiring grad comes from no recorded op"
        known.update(id(o) for o in outputs)


def trace_and_replay(model, x, other_x):
    params = list(model.parameters())
    xt = eo.tensor(x)
    with tracing() as rec:
        out = model(xt)
    out = out[0] if isinstance(out, tuple) else out
    check_connected(rec.records, params + [xt])
    assert rec.records[-1][2][0] is out, "the model's output is the last record's output"
    # Same input: bit for bit. Other values of the same shape: the record is a
    # function of its inputs, not a memory of its outputs.
    assert np.array_equal(replay(rec.records, {})[id(out)].data, out.data)
    new = replay(rec.records, {id(xt): eo.tensor(other_x)})[id(out)]
    expected = model(eo.tensor(other_x))
    expected = expected[0] if isinstance(expected, tuple) else expected
    np.testing.assert_array_equal(new.data, expected.data)
    assert not np.array_equal(new.data, out.data)
    return rec


# --- the registry -------------------------------------------------------------------
def test_every_public_op_is_registered():
    for module in OP_MODULES:
        for name, fn in vars(module).items():
            if name.startswith("_") or name in HELPERS or not inspect.isfunction(fn):
                continue
            if fn.__module__ != module.__name__:
                continue
            assert hasattr(fn, "op"), f"{module.__name__}.{name} is not registered in dispatch.OPS"
            assert dispatch.OPS[fn.op.name] is fn.op and fn.op.function is fn
        for name in getattr(module, "__all__", ()):
            fn = getattr(module, name)
            if inspect.isfunction(fn) and name not in HELPERS:
                assert hasattr(fn, "op"), f"{module.__name__}.{name} is exported but not registered"


def test_table_entries_are_well_formed():
    for name, op in dispatch.OPS.items():
        assert op.name == name
        assert op.kind in dispatch.KINDS
        assert op.category in (None, dispatch.LOW_PRECISION, dispatch.FLOAT32)
        assert op.inputs or op.kind == "creation", name  # only a creation op (arange) has no tensor operand
        assert all(s.lstrip("*") in op.signature.parameters for s in op.inputs)


def test_categories_the_policy_relies_on():
    low = {"matmul", "linear", "conv2d"}
    high = {
        "sum",
        "mean",
        "var",
        "exp",
        "log",
        "pow",
        "softmax",
        "log_softmax",
        "mse_loss",
        "cross_entropy",
        "binary_cross_entropy_with_logits",
    }
    for name in low:
        assert dispatch.OPS[name].category == dispatch.LOW_PRECISION, name
    for name in high:
        assert dispatch.OPS[name].category == dispatch.FLOAT32, name
    assert dispatch.OPS["add"].category is None and dispatch.OPS["relu"].category is None


def test_tensor_operators_and_methods_are_table_ops():
    for attr in (
        "__add__",
        "__sub__",
        "__mul__",
        "__truediv__",
        "__neg__",
        "__pow__",
        "__matmul__",
        "__getitem__",
        "sum",
        "mean",
        "exp",
        "reshape",
        "transpose",
        "astype",
    ):
        assert hasattr(getattr(Tensor, attr), "op"), attr
    x = eo.tensor(np.ones((2, 3), np.float32))
    with tracing() as rec:
        _ = 2.0 - x
        _ = x.T
        _ = x[0]
    assert rec.names == ["sub", "transpose", "getitem"]
    assert rec.records[0][1][1] is x and rec.records[0][1][0].data.dtype == np.float32
    assert rec.records[1][3]["axes"] == (1, 0)


def test_registration_errors():
    with pytest.raises(ValueError, match="already registered"):
        dispatch.primitive("add", kind="elementwise")(lambda a: a)
    with pytest.raises(ValueError, match="kind must be one of"):
        dispatch.primitive("test_bad_kind", kind="magic")
    with pytest.raises(TypeError, match="not a parameter"):
        dispatch.primitive("test_bad_input", kind="elementwise", inputs=("b",))(lambda a: a)
    assert "test_bad_input" not in dispatch.OPS


# --- the precision policy through the table -------------------------------------------------
class Float64Policy:
    """Casts FLOAT32-category operands to float64 and logs what it was given."""

    def __init__(self):
        self.calls = []

    def cast_inputs(self, category, tensors):
        self.calls.append((category, tensors))
        if category == dispatch.FLOAT32:
            return tuple(t.astype("float64") if t.data.dtype.kind == "f" else t for t in tensors)
        return tensors


def test_policy_gets_each_categorized_op_once_with_its_operands():
    x = eo.tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    w = eo.tensor(np.ones((3, 2), np.float32))
    with policy(Float64Policy()) as p:
        s = eo.sum(x)
        y = eo.linear(x, w)  # bias None: two operands, None stays out
        z = x + x  # no category: the policy is not asked
        m = eo.matmul(np.ones((2, 3), np.float32), w)  # a float array is wrapped, then cast
        sm = eo.softmax(x, blocked=np.eye(2, 3, dtype=bool))  # the mask is not a number to cast
    assert [c for c, _ in p.calls] == [
        dispatch.FLOAT32,
        dispatch.LOW_PRECISION,
        dispatch.LOW_PRECISION,
        dispatch.FLOAT32,
    ]
    assert p.calls[0][1] == (x,) and p.calls[1][1] == (x, w)
    assert isinstance(p.calls[2][1][0], Tensor) and len(p.calls[3][1]) == 1
    assert s.dtype == "float64" and y.dtype == "float32" and z.dtype == "float32" and m.dtype == "float32"
    assert sm.dtype == "float64" and sm.data[0, 0] == 0


def test_policy_sees_every_operand_of_variadic_ops():
    class Log:
        def __init__(self):
            self.seen = []

        def cast_inputs(self, category, tensors):
            self.seen.append((category, tensors))
            return tensors

    a, b = eo.ones(2, 3), eo.ones(3, 2)
    with policy(Log()) as p:
        eo.einsum("ij,jk->ik", a, b)
    assert p.seen == [(dispatch.LOW_PRECISION, (a, b))]


def test_traced_casts_are_recorded_and_feed_the_op():
    x = eo.tensor(np.ones((2, 3), np.float32), requires_grad=True)
    with policy(Float64Policy()), tracing() as rec:
        s = eo.mean(x, axis=1)
    assert rec.names == ["astype", "mean"]
    cast, mean = rec.records
    assert cast[1] == (x,) and mean[1][0] is cast[2][0] and mean[2] == (s,)
    assert mean[3] == {"axis": 1, "keepdims": False}


# --- tracing ---------------------------------------------------------------------------
def test_mlp_trace():
    model = eo.Sequential(eo.Linear(4, 8, seed=0), eo.ReLU(), eo.Linear(8, 2, seed=1))
    rng = np.random.default_rng(0)
    x, other = rng.standard_normal((5, 4)).astype(np.float32), rng.standard_normal((5, 4)).astype(np.float32)
    rec = trace_and_replay(model, x, other)
    assert rec.names == ["linear", "relu", "linear"]
    name, inputs, outputs, attrs = rec.records[0]
    assert inputs[1] is model[0].weight and inputs[2] is model[0].bias and attrs == {"transpose_weight": False}
    assert len(outputs) == 1 and outputs[0].shape == (5, 8)


def test_cnn_trace_resolves_geometry():
    model = eo.Sequential(
        eo.Conv2D(1, 4, 3, padding="same", seed=0),
        eo.ReLU(),
        eo.MaxPool2D(2),
        eo.Flatten(),
        eo.Linear(4 * 4 * 4, 3, seed=1),
    )
    rng = np.random.default_rng(1)
    x, other = (rng.standard_normal((2, 8, 8, 1)).astype(np.float32) for _ in range(2))
    rec = trace_and_replay(model, x, other)
    # One node for Flatten, whichever of reshape/flatten it calls (flatten's own reshape is nested).
    assert rec.names[:3] == ["conv2d", "relu", "max_pool2d"] and rec.names[4:] == ["linear"]
    assert rec.names[3] in ("reshape", "flatten")
    conv_attrs, pool_attrs = rec.records[0][3], rec.records[2][3]
    assert conv_attrs["pads"] == ((1, 1), (1, 1)) and conv_attrs["stride"] == (1, 1)
    assert conv_attrs["kernel_size"] == (3, 3) and conv_attrs["padding"] == "same"
    assert (
        pool_attrs["stride"] == (2, 2) and pool_attrs["pool_size"] == (2, 2) and pool_attrs["pads"] == ((0, 0), (0, 0))
    )


class LSTMClassifier(eo.Module):
    def __init__(self):
        super().__init__()
        self.lstm = eo.LSTM(3, 5, num_layers=2, bidirectional=True, seed=0)
        self.head = eo.Linear(10, 2, seed=1)

    def forward(self, x):
        out, _ = self.lstm(x)
        return self.head(out[:, -1])


def test_lstm_trace():
    model = LSTMClassifier()
    rng = np.random.default_rng(2)
    x, other = (rng.standard_normal((2, 6, 3)).astype(np.float32) for _ in range(2))
    rec = trace_and_replay(model, x, other)
    assert rec.names.count("lstm_scan") == 4 and rec.names.count("concatenate") == 2
    scan = rec.records[rec.names.index("lstm_scan")]
    assert len(scan[1]) == 4 and len(scan[2]) == 3 and scan[3] == {"reverse": False, "lengths": None}


class AttentionBlock(eo.Module):
    def __init__(self):
        super().__init__()
        self.norm = eo.LayerNorm(8)
        self.attn = eo.MultiHeadAttention(8, 2, seed=0)

    def forward(self, x):
        return x + self.attn(self.norm(x), is_causal=True)


def test_attention_trace():
    model = AttentionBlock()
    rng = np.random.default_rng(3)
    x, other = (rng.standard_normal((2, 4, 8)).astype(np.float32) for _ in range(2))
    rec = trace_and_replay(model, x, other)
    assert "split" in rec.names and rec.names.count("softmax") == 1 and rec.names[-1] == "add"
    split = rec.records[rec.names.index("split")]
    # the packed projection (2, 4, 24) as (2, 4, 3 * 2 heads, 4), split into Q, K and V heads
    assert len(split[2]) == 3 and split[3]["sizes"] == (2, 2, 2) and split[3]["axis"] == 2
    assert split[1][0].data.shape == (2, 4, 6, 4)
    softmax = rec.records[rec.names.index("softmax")]
    blocked = softmax[1][1]
    assert isinstance(blocked, Tensor) and np.array_equal(blocked.data, eo.causal_mask(4))
    assert softmax[3] == {"axis": -1}


def test_losses_and_scalars_are_recorded_as_constants():
    logits = eo.tensor(np.ones((3, 4), np.float16), requires_grad=True)
    x = eo.tensor(np.ones(3, np.float16))
    with tracing() as rec:
        eo.cross_entropy(logits, np.array([0, 1, 2]))  # its float32 cast is inside the op
        x * 2.0
        eo.where(np.array([True, False, True]), x, 0.0)
    assert rec.names == ["cross_entropy", "mul", "where"]
    targets = rec.records[0][1][1]
    assert isinstance(targets, Tensor) and targets.data.dtype.kind == "i"
    assert rec.records[0][3] == {"weight": None, "ignore_index": -100, "reduction": "mean", "label_smoothing": 0.0}
    two = rec.records[1][1][1]
    assert two.data.dtype == np.float16 and two.data == 2
    assert rec.records[2][1][0].data.dtype == np.bool_ and rec.records[2][1][2].data.dtype == np.float16


def test_nested_primitives_and_tracer_work_are_not_recorded():
    class Busy(Recorder):
        def record(self, name, inputs, outputs, attrs):
            super().record(name, inputs, outputs, attrs)
            float(eo.sum(outputs[0]))  # ops and conversions the tracer itself runs

    @dispatch.primitive("test_double_exp", kind="elementwise")
    def double_exp(a):
        return F.exp(F.mul(a, 2.0))

    try:
        x = eo.tensor(np.ones((2, 2), np.float32))
        with tracing(Busy()) as rec:
            y = double_exp(x)
            eo.flatten(y)
        assert rec.names == ["test_double_exp", "flatten"]
        assert rec.python_values == []
        np.testing.assert_allclose(y.data, np.exp(2.0))
    finally:
        del dispatch.OPS["test_double_exp"]


def test_python_values_are_reported():
    one = eo.tensor(np.array(3, np.int64))
    many = eo.tensor(np.ones(3, np.float32))
    with tracing() as rec:
        assert bool(one) and int(one) == 3 and float(one) == 3.0 and operator.index(one) == 3
        assert one.item() == 3 and many.tolist() == [1.0, 1.0, 1.0]
    assert [k for _, k in rec.python_values] == ["bool", "int", "float", "index", "item", "tolist"]
    assert all(t is one for t, _ in rec.python_values[:5]) and rec.python_values[5][0] is many


def test_a_refusing_tracer_stops_data_dependent_control_flow():
    class Refuse(Recorder):
        def on_python_value(self, tensor, kind):
            raise RuntimeError(f"cannot trace a Python {kind}")

    x = eo.tensor(np.ones(2, np.float32))
    with tracing(Refuse()):
        with pytest.raises(RuntimeError, match="Python bool"):
            if eo.sum(x) > 0:
                pass
    assert bool(eo.sum(x) > 0)  # no tracer: an ordinary value


def test_tracing_changes_no_result_bit_for_bit():
    model = eo.Sequential(eo.Conv2D(1, 3, 3, seed=0), eo.ReLU(), eo.Flatten(), eo.Linear(3 * 6 * 6, 2, seed=1))
    x = np.random.default_rng(4).standard_normal((2, 8, 8, 1)).astype(np.float32)
    y = np.array([0, 1])

    def step():
        model.zero_grad()
        out = model(eo.tensor(x))
        eo.cross_entropy(out, y).backward()
        return out.data.copy(), [p.grad.copy() for p in model.parameters()]

    plain = step()
    with tracing():
        traced = step()
    assert np.array_equal(plain[0], traced[0])
    assert all(np.array_equal(a, b) for a, b in zip(plain[1], traced[1]))


def test_tracer_is_local_to_the_thread():
    seen = []
    one = eo.ones(1)  # made before tracing: eo.ones is a table op (kind "creation") too
    with tracing() as rec:
        thread = threading.Thread(target=lambda: seen.append(dispatch.get_tracer()))
        thread.start()
        thread.join()
        eo.exp(one)
    assert seen == [None] and rec.names == ["exp"] and dispatch.get_tracer() is None


def test_an_op_that_raises_leaves_tracing_usable():
    three, one = eo.ones(3), eo.ones(1)
    with tracing() as rec:
        with pytest.raises(ValueError):
            eo.reshape(three, (2, 2))
        eo.exp(one)
    assert rec.names == ["exp"]
