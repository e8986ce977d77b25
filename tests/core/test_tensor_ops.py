"""The 0.2 tensor ops: each against a NumPy (or loop) reference, each
differentiable one through check_gradients, each in the op table."""

import math

import numpy as np
import pytest

import everyo as eo
from everyo import dispatch
from everyo.testing import check_gradients

RNG = np.random.default_rng(0)
X = RNG.standard_normal((3, 4))  # distinct values: no ties for max-like ops
X32 = X.astype(np.float32)


def t(a, grad=False):
    return eo.tensor(np.asarray(a), requires_grad=grad)


# --- the table ---------------------------------------------------------------------------
CATEGORIES = {
    "argmax": None,
    "argmin": None,
    "topk": None,
    "sort": None,
    "cumsum": dispatch.FLOAT32,
    "prod": dispatch.FLOAT32,
    "std": dispatch.FLOAT32,
    "logsumexp": dispatch.FLOAT32,
    "norm": dispatch.FLOAT32,
    "maximum": None,
    "minimum": None,
    "sin": None,
    "cos": None,
    "einsum": dispatch.LOW_PRECISION,
    "take_along_axis": None,
    "masked_fill": None,
    "one_hot": None,
    "squeeze": None,
    "expand_dims": None,
    "moveaxis": None,
    "clone": None,
}


@pytest.mark.parametrize("name", sorted(CATEGORIES))
def test_registered_with_its_category(name):
    op = dispatch.OPS[name]
    assert op.category == CATEGORIES[name] and getattr(eo, name) is op.function
    assert op.differentiable == (name not in ("argmax", "argmin", "one_hot"))


# --- reductions ------------------------------------------------------------------------------
@pytest.mark.parametrize("axis", [None, 0, 1, -1])
def test_argmax_argmin(axis):
    for name in ("argmax", "argmin"):
        got = getattr(eo, name)(t(X32), axis=axis)
        assert got.dtype == np.int64 and not got.requires_grad
        np.testing.assert_array_equal(got.data, getattr(np, name)(X32, axis=axis))
        kept = getattr(t(X32), name)(axis=axis, keepdims=True)
        np.testing.assert_array_equal(kept.data, getattr(np, name)(X32, axis=axis, keepdims=True))
    assert eo.argmax(t([1.0, 3.0, 3.0])).item() == 1  # first of ties, as NumPy


@pytest.mark.parametrize("axis", [None, 0, 1])
def test_cumsum(axis):
    np.testing.assert_allclose(eo.cumsum(t(X32), axis=axis).data, np.cumsum(X32, axis=axis), rtol=1e-6)
    check_gradients(lambda a: eo.cumsum(a, axis=axis), [X])


def test_prod_with_zeros():
    x = X.copy()
    x[0, 1] = 0.0  # one zero in row 0
    x[2, 0] = x[2, 3] = 0.0  # two zeros in row 2
    np.testing.assert_allclose(eo.prod(t(x), axis=1).data, np.prod(x, axis=1))
    for axis in (None, 0, 1, (0, 1)):
        check_gradients(lambda a, axis=axis: eo.prod(a, axis=axis), [x[:, :3] if axis is None else x])
    xt = t(x, grad=True)
    eo.prod(xt, axis=1).sum().backward()
    grad = xt.grad
    # Loop reference: d prod / d x_k is the product of the other factors.
    for i in range(3):
        for k in range(4):
            assert grad[i, k] == pytest.approx(np.prod(np.delete(x[i], k)), abs=1e-12)


@pytest.mark.parametrize("ddof", [0, 1])
def test_std(ddof):
    np.testing.assert_allclose(eo.std(t(X32), axis=0, ddof=ddof).data, np.std(X32, axis=0, ddof=ddof), rtol=1e-5)
    check_gradients(lambda a: eo.std(a, axis=1, ddof=ddof), [X])
    check_gradients(lambda a: eo.std(a, keepdims=True), [X])
    x = t(np.ones((2, 3)), grad=True)
    eo.std(x).backward()
    assert np.array_equal(x.grad, np.zeros((2, 3)))  # zero deviation: zero gradient, not NaN


def test_logsumexp():
    ref = np.log(np.exp(X).sum(axis=1))
    np.testing.assert_allclose(eo.logsumexp(t(X), axis=1).data, ref, rtol=1e-12)
    big = np.array([1000.0, 1000.0], np.float32)
    assert eo.logsumexp(t(big)).item() == pytest.approx(1000 + math.log(2))
    check_gradients(lambda a: eo.logsumexp(a, axis=0), [X])
    check_gradients(lambda a: eo.logsumexp(a), [X])
    x = t(np.full(3, -np.inf), grad=True)
    out = eo.logsumexp(x)
    out.backward()
    assert out.item() == -np.inf and np.array_equal(x.grad, np.zeros(3))


@pytest.mark.parametrize("ord_", [1, 2, 3, np.inf, "fro"])
@pytest.mark.parametrize("axis", [None, 1])
def test_norm(ord_, axis):
    p = 2 if ord_ == "fro" else ord_
    ref = np.abs(X).max(axis=axis) if p == np.inf else (np.abs(X) ** p).sum(axis=axis) ** (1 / p)
    np.testing.assert_allclose(eo.norm(t(X), ord=ord_, axis=axis).data, ref, rtol=1e-12)
    check_gradients(lambda a: eo.norm(a, ord=ord_, axis=axis), [X])


def test_norm_at_zero_and_bad_ord():
    x = t(np.zeros(3), grad=True)
    eo.norm(x).backward()
    assert np.array_equal(x.grad, np.zeros(3))
    with pytest.raises(ValueError, match="norm: ord must be"):
        eo.norm(t(X), ord=-1)


# --- sorting ---------------------------------------------------------------------------------
@pytest.mark.parametrize("axis", [0, -1])
@pytest.mark.parametrize("descending", [False, True])
def test_sort(axis, descending):
    values, indices = eo.sort(t(X32), axis=axis, descending=descending)
    ref = np.sort(X32, axis=axis)
    ref = np.flip(ref, axis) if descending else ref
    np.testing.assert_array_equal(values.data, ref)
    np.testing.assert_array_equal(np.take_along_axis(X32, indices.data, axis), ref)
    assert indices.dtype == np.int64 and not indices.requires_grad
    check_gradients(lambda a: eo.sort(a, axis=axis, descending=descending)[0], [X])


def test_topk():
    values, indices = eo.topk(t(X32), 2, axis=1)
    for row in range(3):
        assert list(indices.data[row]) == list(np.argsort(-X32[row])[:2])
    np.testing.assert_array_equal(values.data, np.take_along_axis(X32, indices.data, 1))
    smallest, _ = t(X32).topk(3, axis=0, largest=False)
    np.testing.assert_array_equal(smallest.data, np.sort(X32, axis=0))
    check_gradients(lambda a: eo.topk(a, 3, axis=1)[0], [X])
    with pytest.raises(ValueError, match=r"topk: k must be an integer in \[0, 4\]"):
        eo.topk(t(X32), 5)


# --- elementwise -----------------------------------------------------------------------------
def test_maximum_minimum():
    y = RNG.standard_normal((1, 4))
    np.testing.assert_array_equal(eo.maximum(t(X), t(y)).data, np.maximum(X, y))
    np.testing.assert_array_equal(eo.minimum(t(X), 0.0).data, np.minimum(X, 0.0))
    check_gradients(eo.maximum, [X, y])
    check_gradients(eo.minimum, [X, y])
    a, b = t([1.0, 2.0], grad=True), t([1.0, 0.0], grad=True)
    eo.maximum(a, b).sum().backward()
    assert a.grad.tolist() == [0.5, 1.0] and b.grad.tolist() == [0.5, 0.0]  # a tie splits the gradient


def test_sin_cos():
    np.testing.assert_allclose(eo.sin(t(X)).data, np.sin(X))
    np.testing.assert_allclose(t(X).cos().data, np.cos(X))
    check_gradients(eo.sin, [X])
    check_gradients(eo.cos, [X])


def test_pow_with_tensor_exponents_and_rpow():
    base = np.abs(X) + 0.5
    np.testing.assert_allclose((t(base) ** t(X)).data, base**X)
    np.testing.assert_allclose((2 ** t(X)).data, 2**X)
    assert (2 ** t(X32)).dtype == np.float32
    np.testing.assert_allclose((t(base) ** X).data, base**X)  # an ndarray exponent
    check_gradients(lambda a, b: a**b, [base, X])
    check_gradients(lambda a: 2.0**a, [X])
    check_gradients(lambda a: 3**a, [X])


# --- einsum ------------------------------------------------------------------------------------
EINSUMS = [
    ("ij,jk->ik", [(3, 4), (4, 2)]),
    ("ij,kj", [(3, 4), (2, 4)]),
    ("bhqd,bhkd->bhqk", [(2, 2, 3, 4), (2, 2, 5, 4)]),
    ("ij->j", [(3, 4)]),
    ("ij->", [(3, 4)]),
    ("i,j->ij", [(3,), (4,)]),
    ("ijk,ik->j", [(2, 3, 4), (2, 4)]),
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 2)]),
]


@pytest.mark.parametrize("spec,shapes", EINSUMS)
def test_einsum(spec, shapes):
    arrays = [RNG.standard_normal(s) for s in shapes]
    np.testing.assert_allclose(eo.einsum(spec, *[t(a) for a in arrays]).data, np.einsum(spec, *arrays), rtol=1e-12)
    check_gradients(lambda *ts: eo.einsum(spec, *ts), arrays)


def test_einsum_refusals():
    with pytest.raises(eo.EveryOShapeError, match="has 2 letters but its operand has shape"):
        eo.einsum("ij,jk", eo.ones(2, 3), eo.ones(3))
    with pytest.raises(ValueError, match="repeats a letter"):
        eo.einsum("ij->ii", eo.ones(2, 2))
    with pytest.raises(eo.EveryOShapeError, match="repeated axis 'i'"):
        eo.einsum("ii->i", eo.ones(1, 3))


# --- indexing ------------------------------------------------------------------------------------
def test_take_along_axis_and_gather():
    idx = np.array([[3, 0, 0], [1, 1, 2], [-1, 0, 2]])
    np.testing.assert_array_equal(eo.take_along_axis(t(X), idx, axis=1).data, np.take_along_axis(X, idx, 1))
    np.testing.assert_array_equal(t(X).gather(1, idx).data, np.take_along_axis(X, idx, 1))
    check_gradients(lambda a: eo.take_along_axis(a, idx, axis=1), [X])  # repeats accumulate
    col = np.array([[0, 2, 1, 0]])
    check_gradients(lambda a: eo.take_along_axis(a, col, axis=0), [X])
    check_gradients(lambda a: eo.take_along_axis(a, np.array([[1], [0]]), axis=1), [X[:2, :1].repeat(2, 1)])
    with pytest.raises(eo.EveryOIndexError, match="take_along_axis: index 4 is out of range for axis 1 of size 4"):
        eo.take_along_axis(t(X), np.array([[4]]), axis=1)
    with pytest.raises(eo.EveryODTypeError):
        eo.take_along_axis(t(X), np.array([[1.0]]), axis=1)


def test_masked_fill():
    mask = X > 0
    np.testing.assert_array_equal(eo.masked_fill(t(X), mask, -1.0).data, np.where(mask, -1.0, X))
    np.testing.assert_array_equal(t(X).masked_fill(t(mask[0]), 0.0).data, np.where(mask[0], 0.0, X))
    check_gradients(lambda a: eo.masked_fill(a, mask, 5.0), [X])
    with pytest.raises(eo.EveryODTypeError, match="mask must be boolean"):
        eo.masked_fill(t(X), mask.astype(int), 0.0)


def test_one_hot():
    ids = np.array([[0, 2], [1, 1]])
    ref = np.eye(3, dtype=np.float32)[ids]
    np.testing.assert_array_equal(eo.one_hot(ids, 3).data, ref)
    assert eo.one_hot(t(ids)).shape == (2, 2, 3) and eo.one_hot(ids, 4, dtype="int64").dtype == np.int64
    with pytest.raises(eo.EveryOIndexError, match=r"one_hot: class ids must be in \[0, 2\)"):
        eo.one_hot(ids, 2)


# --- shapes ------------------------------------------------------------------------------------
def test_squeeze_expand_dims_moveaxis():
    x = RNG.standard_normal((2, 1, 3, 1))
    assert eo.squeeze(t(x)).shape == (2, 3) and t(x).squeeze(axis=-1).shape == (2, 1, 3)
    with pytest.raises(eo.EveryOShapeError, match="squeeze: axis 0 of shape .* has length 2, not 1"):
        eo.squeeze(t(x), axis=0)
    assert eo.expand_dims(t(X), (0, -1)).shape == np.expand_dims(X, (0, -1)).shape
    assert t(X).unsqueeze(1).shape == (3, 1, 4)
    with pytest.raises(
        eo.EveryOShapeError, match=r"expand_dims: axis 3 is out of range for the rank-3 result \(input shape \(3, 4\)\)"
    ):
        eo.expand_dims(t(X), 3)
    y = RNG.standard_normal((2, 3, 4))
    np.testing.assert_array_equal(eo.moveaxis(t(y), [0, 1], [-1, 0]).data, np.moveaxis(y, [0, 1], [-1, 0]))
    check_gradients(lambda a: eo.squeeze(a, axis=1) * 2.0, [x])
    check_gradients(lambda a: eo.expand_dims(a, 1) * 2.0, [X])
    check_gradients(lambda a: eo.moveaxis(a, 0, -1) * 2.0, [y])


# --- tensor methods ------------------------------------------------------------------------------
def test_clone_detach_requires_grad_():
    x = t(X, grad=True)
    c = x.clone()
    assert c.requires_grad and c.data is not x.data and np.array_equal(c.data, x.data)
    (c * 3.0).sum().backward()
    assert np.array_equal(x.grad, np.full(X.shape, 3.0))
    d = x.detach()
    assert not d.requires_grad and np.shares_memory(d.data, x.data)
    leaf = t(X)
    assert leaf.requires_grad_() is leaf and leaf.requires_grad
    assert not leaf.requires_grad_(False).requires_grad
    with pytest.raises(RuntimeError, match="only leaf tensors"):
        (x * 2.0).requires_grad_(False)
    with pytest.raises(TypeError):
        t(np.arange(3)).requires_grad_()
    assert isinstance(x.numpy(), np.ndarray)


def test_new_ops_trace_as_one_node_each():
    class Recorder:
        def __init__(self):
            self.names = []

        def record(self, name, inputs, outputs, attrs):
            self.names.append(name)

        def on_python_value(self, tensor, kind):
            pass

    rec = Recorder()
    token = dispatch.set_tracer(rec)
    try:
        x = t(X32)
        eo.std(x, axis=1)
        eo.topk(x, 2)
        eo.gather(x, 1, np.array([[0], [1], [2]]))
        eo.einsum("ij,kj->ik", x, x)
    finally:
        dispatch.reset_tracer(token)
    assert rec.names == ["std", "topk", "take_along_axis", "einsum"]


def test_einsum_float16_rounds_once_from_float32():
    a = RNG.standard_normal((3, 5)).astype(np.float16)
    b = RNG.standard_normal((5, 2)).astype(np.float16)
    out = eo.einsum("ij,jk->ik", t(a), t(b))
    assert out.dtype == np.float16
    ref = np.einsum("ij,jk->ik", a.astype(np.float32), b.astype(np.float32)).astype(np.float16)
    np.testing.assert_array_equal(out.data, ref)
    x = t(a.astype(np.float32), grad=True)
    eo.einsum("ij,jk->ik", x, t(b.astype(np.float32))).sum().backward()
    np.testing.assert_allclose(x.grad, np.broadcast_to(b.astype(np.float32).sum(1), (3, 5)), rtol=1e-6)
