"""What the graph keeps for backward under autocast (issue 24: saved activations
<= 0.6x float32's on the transformer), and that keeping less changes no number.

Under autocast a post-norm transformer's LayerNorm outputs and attention's
dropped-out weights are float32 arrays that no backward reads (their consumers
are casts to 16 bits and residual additions): ``everyo.nn._unread`` lets go of
them. These tests count the float32 arrays the graph holds against the count
made by hand from shapes, check the benchmark's ratio, and check that loss and
every gradient are bit for bit those of the same steps with nothing released.
"""

import math
import tracemalloc
import types

import numpy as np
import pytest

import everyo as eo
from everyo.nn import _unread
from everyo.tensor import Tensor

GELU_C = math.sqrt(2.0 / math.pi)


def gelu(x):
    """benchmarks/bench_amp.py's hand-written tanh GELU."""
    return 0.5 * x * (1.0 + eo.tanh(GELU_C * (x + 0.044715 * x * x * x)))


def _root(a):
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def held_arrays(loss, exclude=()):
    """Every array the graph from ``loss`` keeps alive, as ``(shape, dtype, nbytes)``:
    the tensors' arrays and what the backward closures captured, each owning base
    once (``nbytes`` its size; shape and dtype those of the first view of it met:
    float16 -> float32 conversions make an int32 array and view it as float32);
    0-d ones (scalars, the zero-byte stand-ins' base) and ``exclude``'s left out."""
    found, skip = {}, {id(_root(np.asarray(a))) for a in exclude}
    seen, tensors = set(), [loss]

    def visit(obj, depth=0):
        if depth > 8 or id(obj) in seen:
            return
        if isinstance(obj, np.ndarray):
            r = _root(obj)
            if r.ndim and id(r) not in skip and id(r) not in found:
                found[id(r)] = (obj.shape, obj.dtype, r.nbytes)
            return
        seen.add(id(obj))
        if isinstance(obj, Tensor):
            tensors.append(obj)
        elif isinstance(obj, types.FunctionType):
            for cell in obj.__closure__ or ():
                try:
                    visit(cell.cell_contents, depth + 1)
                except ValueError:
                    pass
        elif isinstance(obj, (tuple, list)):
            for v in obj:
                visit(v, depth + 1)
        elif isinstance(obj, dict):
            for v in obj.values():
                visit(v, depth + 1)
        elif type(obj).__module__.startswith("everyo") and hasattr(obj, "__dict__"):
            visit(vars(obj), depth + 1)

    done = set()
    while tensors:
        t = tensors.pop()
        if id(t) in done:
            continue
        done.add(id(t))
        visit(t._data)
        if t._backward is not None:
            visit(t._backward)
            visit(t._parents)
    return list(found.values())


def _bytes(arrays, dtype):
    return sum(nbytes for _, dt, nbytes in arrays if dt == dtype)


B, L, D, H, FF = 4, 16, 32, 4, 64


def _encoder(norm_first=False, layers=2):
    return eo.TransformerEncoder(
        layers, D, H, dim_feedforward=FF, dropout=0.1, activation=gelu, norm_first=norm_first, seed=0
    )


def _data(seed=2):
    rng = np.random.default_rng(seed)
    return (eo.tensor(rng.standard_normal((B, L, D)).astype(np.float32)) for _ in range(2))


def _float32_budget(layers):
    """float32 bytes a 2-layer post-norm encoder's graph may hold under autocast, by hand."""
    act, weights = B * L * D * 4, H * B * L * L * 4
    per_layer = (
        2 * act  # the two residual sums, each LayerNorm's input (its backward reads it)
        + weights  # softmax's output (its backward reads it)
        + 2 * 2 * B * L * 4  # each LayerNorm's mean and 1/std, one value a row
        + (3 * D * D + D * D + D * FF + FF * D) * 4  # float32 copies of the 16-bit weights the linears keep today
    )
    return layers * per_layer + act + act  # + the output (the caller's) + the loss's saved difference


def test_autocast_encoder_keeps_only_the_float32_arrays_backward_reads():
    model = _encoder()
    x, y = _data()
    with eo.autocast(dtype="float16"):
        out = model(x)
    loss = eo.mse_loss(out, y)
    held = held_arrays(loss, exclude=[p.data for p in model.parameters()] + [x.data, y.data])
    # Before: each layer also kept attention's dropped-out weights and norm1's output in
    # float32, and the first layer's output (norm2's): 2 * (16384 + 8192) + 8192 bytes more.
    assert _bytes(held, np.float32) <= _float32_budget(2)
    big32 = sorted(shape for shape, dt, _ in held if dt == np.float32 and shape in ((B, L, D), (B, H, L, L)))
    assert big32 == sorted([(B, L, D)] * 6 + [(B, H, L, L)] * 2)  # 2 sums a layer, output, loss; softmax


def test_float32_graph_is_unchanged():
    """In float32 the same tensors are read by the next product: nothing is released."""
    model = _encoder()
    x, y = _data()
    counts = []
    for enabled in (False, True):
        _unread.enabled = enabled
        try:
            loss = eo.mse_loss(model(x), y)
        finally:
            _unread.enabled = True
        counts.append(sorted((shape, dt.str, n) for shape, dt, n in held_arrays(loss)))
    assert counts[0] == counts[1]


@pytest.mark.usefixtures("numpy_conversions")
def test_benchmark_transformer_saved_activations_at_most_0_6_of_float32():
    """benchmarks/bench_amp.py's transformer case and count (tracemalloc, graph alive)."""
    rng = np.random.default_rng(2)
    x = eo.tensor(rng.standard_normal((32, 32, 64)).astype(np.float32))
    y = eo.tensor(rng.standard_normal((32, 32, 64)).astype(np.float32))
    model = eo.TransformerEncoder(2, 64, 4, dim_feedforward=128, dropout=0.1, activation=gelu, seed=0)

    def held(dtype):
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        with eo.autocast(enabled=dtype is not None, dtype=dtype or "float16"):
            out = model(x)
        loss = eo.mse_loss(out, y)
        n = tracemalloc.get_traced_memory()[0] - base
        tracemalloc.stop()
        del loss, out
        return n

    held("float16")  # warm-up: first-use imports are not activations
    ratio = held("float16") / held(None)
    assert ratio <= 0.6  # was 0.665


def _step(make, call, dtype, steps=2):
    """Loss and every parameter gradient of ``steps`` autocast (or float32) steps."""
    model = make()
    out = []
    for _ in range(steps):
        with eo.autocast(enabled=dtype is not None, dtype=dtype or "float16"):
            o = call(model)
        if isinstance(o, tuple):
            o = o[0] + o[1].sum()  # need_weights: the returned weights take part too
        loss = eo.mse_loss(o, eo.zeros(*o.shape) + 0.5)
        loss.backward()
        out.append(np.array(loss.data))
        for p in model.parameters():
            out.append(np.array(p.grad))
            p.grad = None
    return out


_X, _MEM = (np.random.default_rng(5).standard_normal(s).astype(np.float32) for s in ((B, L, D), (B, 6, D)))
_CASES = {
    "encoder post-norm": (lambda: _encoder(), lambda m: m(eo.tensor(_X), is_causal=True)),
    "encoder pre-norm": (lambda: _encoder(norm_first=True), lambda m: m(eo.tensor(_X))),
    "decoder post-norm": (
        lambda: eo.TransformerDecoder(2, D, H, dim_feedforward=FF, dropout=0.1, seed=0),
        lambda m: m(eo.tensor(_X), eo.tensor(_MEM), tgt_is_causal=True),
    ),
    "decoder pre-norm": (
        lambda: eo.TransformerDecoder(2, D, H, dim_feedforward=FF, dropout=0.1, norm_first=True, seed=0),
        lambda m: m(eo.tensor(_X), eo.tensor(_MEM)),
    ),
    "attention with weights": (
        lambda: eo.MultiHeadAttention(D, H, dropout=0.2, seed=0),
        lambda m: m(eo.tensor(_X), need_weights=True),
    ),
}


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", None])
@pytest.mark.parametrize("case", sorted(_CASES))
def test_releasing_changes_no_loss_and_no_gradient(case, dtype):
    make, call = _CASES[case]
    _unread.enabled = False
    try:
        kept = _step(make, call, dtype)
    finally:
        _unread.enabled = True
    released = _step(make, call, dtype)
    assert len(kept) == len(released)
    for a, b in zip(kept, released):
        assert a.dtype == b.dtype and np.array_equal(a, b, equal_nan=True)


def _released(make, call, dtype="float16"):
    """(shape, dtype) of each array the graph of ``call``'s output holds with nothing
    released and no longer holds with the releases on."""
    held = []
    for enabled in (False, True):
        _unread.enabled = enabled
        try:
            model = make()
            with eo.autocast(dtype=dtype):
                out = call(model)
        finally:
            _unread.enabled = True
        exclude = [p.data for p in model.parameters()]
        held.append(sorted((shape, dt.name) for shape, dt, _ in held_arrays(out, exclude)))
        del out
    gone = list(held[0])
    for item in held[1]:
        assert item in gone  # nothing is held that was not held before
        gone.remove(item)
    return sorted(gone)


def test_release_happens_where_expected():
    """The comparison above is not vacuous: under autocast these float32 arrays are let go of."""
    weights, act = ((B, H, L, L), "float32"), ((B, L, D), "float32")
    make, call = _CASES["encoder post-norm"]
    # per layer: attention's dropped-out weights and norm1's output; and the first layer's output
    assert _released(make, call) == sorted([weights] * 2 + [act] * 3)
    make, call = _CASES["encoder pre-norm"]
    # per layer: attention's dropped-out weights, norm1's and norm2's outputs
    assert _released(make, call) == sorted([weights] * 2 + [act] * 4)
    make, call = _CASES["decoder post-norm"]
    # per layer: two attentions' dropped-out weights (key length 16 and 6), norm1's and norm2's
    # outputs; and the first layer's output
    cross = ((B, H, L, 6), "float32")
    assert _released(make, call) == sorted([weights] * 2 + [cross] * 2 + [act] * 5)


def test_a_tensor_someone_else_holds_is_not_released():
    """A forward hook that keeps norm1's output sees its values, not a stand-in."""
    outputs = []
    for enabled in (False, True):
        model = _encoder(layers=1)
        kept = []
        model.layers[0].norm1.register_forward_hook(lambda module, args, output, kept=kept: kept.append(output))
        x, y = _data()
        _unread.enabled = enabled
        try:
            with eo.autocast(dtype="float16"):
                out = model(x)
        finally:
            _unread.enabled = True
        eo.mse_loss(out, y).backward()
        outputs.append(kept[0].data)
    assert outputs[1].strides != (0, 0, 0) and np.array_equal(outputs[0], outputs[1])


def test_nothing_released_while_detect_inplace_writes_compares_values():
    make, call = _CASES["encoder post-norm"]
    with eo.autograd.detect_inplace_writes():
        assert _released(make, call) == []
