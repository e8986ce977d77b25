"""Every differentiable op against central finite differences (float64),
through the one shared checker."""

import numpy as np
import pytest

import everyo as eo
from everyo.recurrent_ops import gru_scan, lstm_scan, rnn_scan
from everyo.sequence_ops import embedding
from everyo.testing import check_gradients

rng = np.random.default_rng(0)


def r(*shape, positive=False, low=None):
    a = rng.standard_normal(shape)
    if positive:
        a = np.abs(a) + 0.5
    return a


CASES = [
    ("add_broadcast", lambda a, b: a + b, [r(3, 4), r(4)]),
    ("add_keepdim_broadcast", lambda a, b: a + b, [r(3, 1, 4), r(2, 1)]),
    ("sub", lambda a, b: a - b, [r(3, 4), r(3, 1)]),
    ("rsub_scalar", lambda a: 2.0 - a, [r(3)]),
    ("mul_broadcast", lambda a, b: a * b, [r(2, 3), r(1, 3)]),
    ("div", lambda a, b: a / b, [r(2, 3), r(2, 3, positive=True)]),
    ("rdiv_scalar", lambda a: 1.0 / a, [r(4, positive=True)]),
    ("neg", lambda a: -a, [r(5)]),
    ("pow_scalar", lambda a: a**3, [r(4)]),
    ("pow_square", lambda a: a**2, [r(4)]),
    ("pow_fractional", lambda a: a**1.5, [r(4, positive=True)]),
    ("pow_tensor", lambda a, b: a**b, [r(4, positive=True), r(4)]),
    ("matmul_2d", lambda a, b: a @ b, [r(3, 4), r(4, 2)]),
    ("matmul_batched_broadcast", lambda a, b: a @ b, [r(2, 3, 4), r(4, 5)]),
    ("matmul_vec_left", lambda a, b: a @ b, [r(4), r(4, 3)]),
    ("matmul_vec_right", lambda a, b: a @ b, [r(3, 4), r(4)]),
    ("linear", lambda x, w, b: eo.linear(x, w, b), [r(5, 3), r(3, 2), r(2)]),
    ("linear_rank3", lambda x, w, b: eo.linear(x, w, b), [r(2, 5, 3), r(3, 2), r(2)]),
    ("linear_nobias", lambda x, w: eo.linear(x, w), [r(5, 3), r(3, 2)]),
    ("sum_all", lambda a: a.sum(), [r(3, 4)]),
    ("sum_axis", lambda a: a.sum(axis=1), [r(3, 4, 2)]),
    ("sum_axes_keepdims", lambda a: a.sum(axis=(0, 2), keepdims=True), [r(3, 4, 2)]),
    ("mean_axis", lambda a: eo.mean(a, axis=0), [r(3, 4)]),
    ("mean_all", lambda a: eo.mean(a), [r(3, 4)]),
    ("var_axis", lambda a: eo.var(a, axis=1), [r(3, 5)]),
    ("var_ddof1_keepdims", lambda a: eo.var(a, axis=0, keepdims=True, ddof=1), [r(4, 3)]),
    ("max_axis", lambda a: eo.max(a, axis=1), [r(3, 5)]),
    ("max_all", lambda a: eo.max(a), [r(3, 5)]),
    ("min_axis_keepdims", lambda a: eo.min(a, axis=0, keepdims=True), [r(4, 3)]),
    ("exp", eo.exp, [r(3, 3)]),
    ("log", eo.log, [r(3, 3, positive=True)]),
    ("sqrt", eo.sqrt, [r(3, 3, positive=True)]),
    ("abs", eo.abs, [r(3, 3, positive=True) * np.array([1, -1, 1])]),
    ("clip", lambda a: eo.clip(a, -0.5, 0.5), [np.array([-1.3, -0.2, 0.1, 0.4, 0.9, 2.0])]),
    ("tanh", eo.tanh, [r(3, 3)]),
    ("sigmoid", eo.sigmoid, [r(3, 3) * 3]),
    ("relu", eo.relu, [np.array([-1.0, -0.3, 0.2, 1.5])]),
    ("softmax", lambda a: eo.softmax(a, axis=-1), [r(3, 4)]),
    ("softmax_axis0", lambda a: eo.softmax(a, axis=0), [r(3, 4)]),
    ("log_softmax", lambda a: eo.log_softmax(a, axis=1), [r(3, 4)]),
    ("reshape", lambda a: a.reshape(4, 3) * eo.tensor(np.arange(12.0).reshape(4, 3)), [r(3, 4)]),
    ("transpose", lambda a: a.transpose(2, 0, 1), [r(2, 3, 4)]),
    ("T", lambda a: a.T, [r(2, 3)]),
    ("flatten", lambda a: eo.flatten(a), [r(2, 3, 4)]),
    ("getitem_slice", lambda a: a[1:, ::2], [r(3, 4)]),
    ("getitem_int", lambda a: a[1], [r(3, 4)]),
    ("getitem_fancy_repeated", lambda a: a[np.array([0, 2, 0, 0])], [r(3, 4)]),
    ("getitem_tuple_fancy", lambda a: a[np.array([0, 1, 1]), np.array([2, 0, 2])], [r(3, 4)]),
    ("getitem_list_axis1_negative", lambda a: a[:, [-1, 0, -1]], [r(3, 4)]),
    ("getitem_separated_arrays", lambda a: a[[0, 2, 2], ::-1, [1, -1, 1]], [r(3, 4, 2)]),
    ("getitem_bool_mask", lambda a: a[:, np.array([True, False, True, True])], [r(3, 4)]),
    ("getitem_tensor_index", lambda a: a[1:, eo.tensor(np.array([[3, 3], [0, -2]]))], [r(3, 4)]),
    ("concatenate", lambda a, b: eo.concatenate([a, b], axis=1), [r(2, 3), r(2, 2)]),
    ("stack", lambda a, b: eo.stack([a, b], axis=1), [r(2, 3), r(2, 3)]),
    ("where", lambda a, b: eo.where(np.array([[True, False, True]]), a, b), [r(2, 3), r(3)]),
    ("conv2d_valid", lambda x, w, b: eo.conv2d(x, w, b), [r(2, 5, 5, 2), r(3, 3, 2, 3), r(3)]),
    (
        "conv2d_same_stride2_odd",
        lambda x, w, b: eo.conv2d(x, w, b, stride=2, padding="same"),
        [r(1, 7, 5, 2), r(3, 2, 2, 2), r(2)],
    ),
    ("conv2d_same_k5", lambda x, w: eo.conv2d(x, w, None, stride=1, padding="same"), [r(1, 5, 5, 1), r(5, 5, 1, 2)]),
    ("max_pool2d", lambda x: eo.max_pool2d(x, 2), [r(2, 4, 6, 2)]),
    ("max_pool2d_same_stride", lambda x: eo.max_pool2d(x, 3, stride=2, padding="same"), [r(1, 5, 5, 2)]),
    ("avg_pool2d", lambda x: eo.avg_pool2d(x, 2), [r(2, 4, 4, 2)]),
    ("avg_pool2d_same_odd", lambda x: eo.avg_pool2d(x, 3, stride=2, padding="same"), [r(1, 5, 7, 2)]),
    ("mse_loss", lambda p, t: eo.mse_loss(p, t), [r(4, 2), r(4, 2)]),
    ("mse_loss_sum", lambda p: eo.mse_loss(p, eo.tensor(np.ones((4, 2))), reduction="sum"), [r(4, 2)]),
    ("cross_entropy", lambda z: eo.cross_entropy(z, np.array([0, 2, 1, 2])), [r(4, 3)]),
    ("cross_entropy_seq", lambda z: eo.cross_entropy(z, np.array([[0, 1], [2, 2]])), [r(2, 2, 3)]),
    ("bce_with_logits", lambda z, y: eo.binary_cross_entropy_with_logits(z, y), [r(5) * 3, rng.uniform(0, 1, 5)]),
]


@pytest.mark.parametrize("name,fn,inputs", CASES, ids=[c[0] for c in CASES])
def test_gradient_matches_finite_differences(name, fn, inputs):
    check_gradients(fn, inputs, name=name)


def test_astype_gradient_comes_back_in_the_operand_dtype():
    # Through float32, eps must be well above float32 resolution.
    (g,) = check_gradients(
        lambda a: a.astype("float32").astype("float64") * 3.0, [r(3)], eps=1e-2, atol=1e-4, name="astype"
    )
    x = eo.tensor(r(3), requires_grad=True)
    x.astype("float16").sum().backward()
    assert x.grad.dtype == np.float64 and np.all(x.grad == 1)


def test_dropout_gradient_uses_the_same_mask():
    def fn(x):
        return eo.dropout(x, 0.4, training=True, rng=np.random.default_rng(3))

    check_gradients(fn, [r(4, 5)], name="dropout")


def test_the_checker_catches_a_wrong_gradient():
    """Guard against a checker that cannot fail: a deliberately wrong backward."""
    from everyo.tensor import Tensor

    def bad_square(a):
        return Tensor._from_op(a.data**2, (a,), lambda g: (g * a.data,))  # missing factor 2

    with pytest.raises(AssertionError, match="disagrees with central differences"):
        check_gradients(bad_square, [r(3)], name="bad_square")


# --- edge shapes, generated (issue 28) ---------------------------------------------
# Every op below over 0-d, 1-D, size-1 and size-0 operands: backward either gives
# a gradient of the operand's shape that matches finite differences, or the op
# raises an EveryO error that names it; never a raw NumPy/Python exception.
# (NaN/inf inputs and PyTorch's values are in test_parity_torch.py.)
EDGE_SHAPES = [(), (1,), (5,), (1, 1), (0,), (3, 0), (0, 3), (2, 1, 3)]
EDGE_UNARY = {
    "exp": eo.exp,
    "log": lambda a: eo.log(eo.abs(a) + 0.5),
    "sqrt": lambda a: eo.sqrt(eo.abs(a) + 0.5),
    "tanh": eo.tanh,
    "sigmoid": eo.sigmoid,
    "sin": eo.sin,
    "gelu": eo.gelu,
    "softplus": eo.softplus,
    "pow3": lambda a: a**3,
    "neg": lambda a: -a,
}
EDGE_REDUCTIONS = {
    "sum": eo.sum,
    "mean": eo.mean,
    "max": eo.max,
    "min": eo.min,
    "prod": eo.prod,
    "logsumexp": eo.logsumexp,
    "var": eo.var,
    "var_ddof1": lambda a, **k: eo.var(a, ddof=1, **k),
    "std": lambda a, **k: eo.std(a + eo.tensor(np.arange(a.size).reshape(a.shape) * 0.3), **k),
    "std_ddof1": lambda a, **k: eo.std(a, ddof=1, **k),
    "norm": eo.norm,
    "softmax": lambda a, axis=-1, **k: eo.softmax(a, axis=axis),
    "log_softmax": lambda a, axis=-1, **k: eo.log_softmax(a, axis=axis),
    "cumsum": lambda a, axis=-1, **k: eo.cumsum(a, axis=axis),
}
EDGE_BINARY = {"add": eo.add, "mul": eo.mul, "div": lambda a, b: a / (eo.abs(b) + 0.5), "maximum": eo.maximum}


def _edge_cases():
    for shape in EDGE_SHAPES:
        for name, fn in EDGE_UNARY.items():
            yield f"{name}{shape}", fn, [shape]
        for name, fn in EDGE_REDUCTIONS.items():
            if name in ("softmax", "log_softmax", "cumsum") and not shape:
                continue  # an axis op on a 0-d tensor: refused by the axis check (test_axes.py)
            yield f"{name}{shape}-all", fn, [shape]
            if shape:
                yield f"{name}{shape}-last", lambda a, fn=fn: fn(a, axis=-1), [shape]
        for name, fn in EDGE_BINARY.items():
            yield f"{name}{shape}x{shape}", fn, [shape, shape]
            yield f"{name}{shape}x()", fn, [shape, ()]
    for a, b in [((4,), (4,)), ((0,), (0,)), ((1,), (1, 3)), ((3, 1), (1,)), ((0, 2), (2, 3)), ((2, 0), (0, 3))]:
        yield f"matmul{a}@{b}", eo.matmul, [a, b]
    for shape in [(), (1,), (0,), (3, 0), (2, 1, 3)]:
        yield f"where{shape}", lambda a, b: eo.where(np.ones(a.shape, bool) if a.ndim else True, a, b), [shape, shape]
        if shape:
            yield f"concatenate{shape}", lambda a, b: eo.concatenate([a, b], axis=0), [shape, shape]
            yield f"getitem{shape}", lambda a: a[:1], [shape]
            yield f"reshape{shape}", lambda a: a.reshape(-1), [shape]
    # windows over the smallest and empty inputs (NHWC)
    for hw in [(1, 1), (2, 1), (0, 3)]:
        shape = (2, *hw, 2)
        yield f"avg_pool2d{shape}", lambda a: eo.avg_pool2d(a, 1), [shape]
        yield f"max_pool2d{shape}", lambda a: eo.max_pool2d(a, 1), [shape]
        yield f"conv2d{shape}", lambda a, w: eo.conv2d(a, w, padding="same"), [shape, (1, 1, 2, 3)]
    yield "conv2d(0, 3, 3, 2)", lambda a, w: eo.conv2d(a, w), [(0, 3, 3, 2), (2, 2, 2, 3)]

    yield from _sequence_edge_cases()


def _recurrent(kind, hidden, bidirectional, state):
    layer = getattr(eo.nn, kind)(2, hidden, bidirectional=bidirectional, seed=0, dtype="float64")
    pick = (lambda o: o[0]) if state == "out" else (lambda o: o[1][1] if kind == "LSTM" else o[1])
    return lambda x: pick(layer(x))


def _mha(heads, cross):
    layer = eo.nn.MultiHeadAttention(4, heads, seed=0, dtype="float64")
    return (lambda q, k: layer(q, k, k)) if cross else (lambda q: layer(q))


def _sequence_edge_cases():
    """Recurrent scans, attention, embedding lookups and einsum at their smallest
    and empty sizes (batch, time, hidden, length, heads, ids, contracted axes)."""
    for kind in ("RNN", "LSTM", "GRU"):
        for batch, time, hidden in [(1, 3, 2), (2, 1, 2), (2, 3, 1), (1, 1, 1), (0, 3, 2), (2, 0, 2)]:
            for bi in (False, True):
                for state in ("out", "state"):
                    fn = _recurrent(kind, hidden, bi, state)
                    yield f"{kind}(B={batch},T={time},H={hidden},bi={bi})-{state}", fn, [(batch, time, 2)]
    # the functional scans: xp is the input projection (B, T, gates * H)
    for batch, time, hidden in [(1, 1, 1), (0, 2, 2), (2, 1, 3)]:
        b, t, h = batch, time, hidden
        yield f"rnn_scan(B={b},T={t},H={h})", lambda x, h0, w: rnn_scan(x, h0, w)[0], [(b, t, h), (b, h), (h, h)]
        yield (
            f"lstm_scan(B={b},T={t},H={h})",
            lambda x, h0, c0, w: lstm_scan(x, h0, c0, w)[2],
            [(b, t, 4 * h), (b, h), (b, h), (h, 4 * h)],
        )
        yield (
            f"gru_scan(B={b},T={t},H={h})",
            lambda x, h0, w, bh: gru_scan(x, h0, w, bh, reverse=True)[0],
            [(b, t, 3 * h), (b, h), (h, 3 * h), (3 * h,)],
        )
    sdpa = eo.scaled_dot_product_attention
    yield "scaled_dot_product_attention(1-D)", sdpa, [(4,), (4,), (4,)]  # refused, naming the op
    for batch, L, S, E in [(1, 1, 3, 4), (2, 3, 1, 4), (1, 1, 1, 1), (0, 2, 2, 4), (2, 3, 3, 0)]:
        q, kv = (batch, L, E), (batch, S, max(E, 2))
        yield f"scaled_dot_product_attention(B={batch},L={L},S={S},E={E})", sdpa, [q, (batch, S, E), kv]
        yield (
            f"scaled_dot_product_attention(B={batch},L={L},S={S},E={E},causal)",
            lambda a, b, c: sdpa(a, b, c, is_causal=True),
            [q, (batch, S, E), kv],
        )
    for heads in (1, 4):
        for batch, L, S in [(1, 1, 1), (0, 2, 2), (2, 1, 3), (2, 3, 1)]:
            yield (
                f"MultiHeadAttention(h={heads},B={batch},L={L},S={S})",
                _mha(heads, True),
                [(batch, L, 4), (batch, S, 4)],
            )
        yield f"MultiHeadAttention(h={heads},self,B=1,L=1)", _mha(heads, False), [(1, 1, 4)]
    for ids in ([3], [], [[1, 1, 1]], np.zeros((0, 3), int), 2, [4, 0, 4]):
        ids = np.asarray(ids, dtype=np.int64)
        yield f"embedding(ids{ids.shape})", lambda w, ids=ids: embedding(ids, w), [(5, 3)]
    for sub, shapes in [
        ("ij,jk->ik", [(2, 1), (1, 3)]),
        ("ij,jk->ik", [(2, 0), (0, 3)]),
        ("i,i->", [(1,), (1,)]),
        ("i,i->", [(0,), (0,)]),
        ("i,i", [(3,), (3,)]),
        ("ii->", [(1, 1)]),
        ("ii->i", [(0, 0)]),
        ("ij->", [(0, 3)]),
        ("->", [()]),
        (",->", [(), ()]),
        ("i,->i", [(3,), ()]),
        ("bij,bjk->bik", [(0, 2, 3), (0, 3, 2)]),
        ("...i,i->...", [(2, 1, 3), (3,)]),
        ("i,j->ij", [(0,), (2,)]),
    ]:
        yield f"einsum({sub},{shapes})", lambda *a, sub=sub: eo.einsum(sub, *a), shapes


EDGE_CASES = list(_edge_cases())


@pytest.mark.parametrize("name,fn,shapes", EDGE_CASES, ids=[c[0] for c in EDGE_CASES])
def test_backward_on_edge_shapes(name, fn, shapes):
    inputs = [rng.standard_normal(s) for s in shapes]
    op = name.split("(")[0].split("_")[0]
    try:
        out = fn(*[eo.tensor(x, requires_grad=True) for x in inputs])
    except eo.EveryOError as exc:
        assert op in str(exc), (name, str(exc))
        return
    if any(x.size == 0 for x in inputs) or out.data.size == 0 or not np.all(np.isfinite(out.data)):
        # Nothing to difference: backward must still run and give each operand its own shape.
        tensors = [eo.tensor(x, requires_grad=True) for x in inputs]
        fn(*tensors).sum().backward()
        for t in tensors:
            assert t.grad is not None and t.grad.shape == t.shape, name
            if t.grad.size and np.isnan(out.data).any():
                assert np.isnan(t.grad.data).any(), f"{name}: a NaN result whose gradient has no NaN"
        return
    check_gradients(fn, inputs, name=name)
