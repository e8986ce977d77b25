"""The graph that 16-bit elementwise ops build (everyo.low_precision): the
debugging aid detect_inplace_writes, the names errors give, and gradients when
an op's backward reads no operand value (their float32 copies are not rebuilt)."""

import numpy as np
import pytest

import everyo as eo
from everyo.errors import EveryOInPlaceError


def _x(dtype=np.float16, requires_grad=True):
    return eo.tensor(np.array([0.5, 1.0, 2.0, -3.0], dtype), requires_grad=requires_grad)


def test_detect_inplace_writes_sees_no_change_where_there_is_none():
    x = _x()
    with eo.autograd.detect_inplace_writes():
        y = (eo.tanh(x) * x + x).sum()
        y.backward()
    expected = _x(np.float32)
    (eo.tanh(expected) * expected + expected).sum().backward()
    np.testing.assert_allclose(x.grad.astype(np.float32), expected.grad, rtol=2**-7)  # three 16-bit roundings


def test_detect_inplace_writes_catches_a_real_write_into_a_16_bit_operand():
    x = _x()
    with eo.autograd.detect_inplace_writes():
        h = x * 2.0
        y = (h * h).sum()
        h.data[0] = 7  # behind EveryO's back
        with pytest.raises(EveryOInPlaceError, match="mul"):
            y.backward()


def test_in_place_errors_name_the_op_not_the_wrapper():
    x = _x()
    h = x * 2.0
    y = (h * h).sum()
    h.data = h.data + np.float16(1)
    with pytest.raises(EveryOInPlaceError, match=r"backward through (mul|astype): .*output of mul") as info:
        y.backward()
    assert "_finish" not in str(info.value) and "_rounding" not in str(info.value)


@pytest.mark.parametrize(
    "op", [lambda a, b: a + b, lambda a, b: a - b, lambda a, b: eo.tanh(a) + eo.exp(b), lambda a, b: eo.sqrt(b) - a]
)
def test_value_free_backwards_give_the_float32_gradients_rounded(op):
    a, b = _x(), eo.tensor(np.array([1.0, 0.25, 4.0, 3.0], np.float16), requires_grad=True)
    op(a, b).sum().backward()
    a32, b32 = (eo.tensor(t.data.astype(np.float32), requires_grad=True) for t in (a, b))
    op(a32, b32).sum().backward()
    for t, r in ((a, a32), (b, b32)):
        assert t.grad.dtype == np.float16
        np.testing.assert_array_equal(t.grad, r.grad.astype(np.float16))


@pytest.mark.usefixtures("numpy_conversions")  # tracemalloc counts NumPy's allocations only
def test_softmax_under_autocast_keeps_no_float32_copy_of_its_input():
    import tracemalloc

    rng = np.random.default_rng(0)
    scores = eo.tensor(rng.standard_normal((64, 4, 32, 32)).astype(np.float16), requires_grad=True)

    def held():
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        with eo.autocast():
            out = eo.softmax(scores, axis=-1)
        used = tracemalloc.get_traced_memory()[0] - base
        tracemalloc.stop()
        return out, used

    held()  # warm-up
    out, used = held()
    assert out.dtype == np.float32  # softmax stays float32 under autocast (the spec's list)
    assert used <= 1.1 * out.data.nbytes  # the output only, not also a float32 copy of the input
    g = rng.standard_normal(out.shape).astype(np.float32)
    out.backward(g)
    ref = eo.tensor(scores.data.astype(np.float32), requires_grad=True)
    eo.softmax(ref, axis=-1).backward(g)
    assert scores.grad.dtype == np.float16
    np.testing.assert_array_equal(scores.grad, ref.grad.astype(np.float16))


def _pair(shape_a, shape_b, dtype=np.float16, seed=0):
    rng = np.random.default_rng(seed)
    return (eo.tensor(rng.standard_normal(s).astype(dtype), requires_grad=True) for s in (shape_a, shape_b))


@pytest.mark.parametrize(
    "op",
    [
        lambda a, b: a + b,
        lambda a, b: a - b,
        lambda a, b: -a + b,
        lambda a, b: a + a - b,
        lambda a, b: eo.relu(a) + eo.relu(b),  # each operand's gradient goes on into an in-place 16-bit ReLU backward
    ],
    ids=["add", "sub", "neg", "same_operand_twice", "into_relu"],
)
@pytest.mark.parametrize("shapes", [((3, 4), (3, 4)), ((3, 4), (4,)), ((1, 4), (3, 1))], ids=["same", "bcast", "both"])
def test_pass_through_gradients_equal_numpys_16_bit_backward(op, shapes):
    # add/sub/neg hand an unsummed 16-bit gradient on without rounding it again:
    # the result must still be exactly the float32 gradient rounded once per op.
    a, b = _pair(*shapes)
    g = np.random.default_rng(9).standard_normal(np.broadcast_shapes(*shapes)).astype(np.float16)
    out = op(a, b)
    assert out.dtype == np.float16
    out.backward(g)
    a32, b32 = (eo.tensor(t.data.astype(np.float32), requires_grad=True) for t in (a, b))
    op(a32, b32).backward(g.astype(np.float32))
    for t, r in ((a, a32), (b, b32)):
        assert t.grad.dtype == np.float16
        np.testing.assert_array_equal(t.grad, r.grad.astype(np.float16))


def _attention_like(q, k, w, hooked):
    """16-bit chain through matmul, reshape, transpose, ReLU and a linear; with
    ``hooked`` every intermediate gets a hook, which makes autograd
    materialize each gradient as a real 16-bit array (no Rounded hand-over)."""
    steps = []

    def keep(t):
        if hooked:
            t.register_hook(lambda g: None)
        steps.append(t)
        return t

    scores = keep(eo.matmul(q, eo.transpose(k, (0, 1, 3, 2))))
    merged = keep(eo.reshape(eo.transpose(keep(eo.relu(scores)), (0, 2, 1, 3)), (2, 5, 4 * 5)))
    return eo.linear(merged, w).sum()


def test_matmul_and_shape_ops_hand_16_bit_gradients_on_exactly():
    rng = np.random.default_rng(3)

    def leaves():
        q = eo.tensor(rng.standard_normal((2, 4, 5, 3)).astype(np.float16), requires_grad=True)
        k = eo.tensor(rng.standard_normal((2, 4, 5, 3)).astype(np.float16), requires_grad=True)
        w = eo.tensor(rng.standard_normal((20, 6)).astype(np.float16), requires_grad=True)
        return q, k, w

    base = leaves()
    plain = [eo.tensor(t.data.copy(), requires_grad=True) for t in base]
    hooked = [eo.tensor(t.data.copy(), requires_grad=True) for t in base]
    _attention_like(*plain, hooked=False).backward()
    _attention_like(*hooked, hooked=True).backward()
    for p, h in zip(plain, hooked):
        assert p.grad.dtype == np.float16
        np.testing.assert_array_equal(p.grad.view(np.uint16), h.grad.view(np.uint16))


@pytest.mark.parametrize("low", ["float16", "bfloat16"])
def test_batched_16_bit_matmul_gradients_are_the_float32_ones_rounded_once(low):
    dt = np.dtype(np.float16) if low == "float16" else np.dtype(pytest.importorskip("ml_dtypes").bfloat16)
    rng = np.random.default_rng(4)
    a = eo.tensor(rng.standard_normal((3, 2, 5, 4)).astype(np.float32).astype(dt), requires_grad=True)
    b = eo.tensor(rng.standard_normal((3, 2, 4, 6)).astype(np.float32).astype(dt), requires_grad=True)
    g = rng.standard_normal((3, 2, 5, 6)).astype(np.float32).astype(dt)
    out = eo.matmul(a, b)
    out.backward(g)
    a32, b32 = (eo.tensor(t.data.astype(np.float32), requires_grad=True) for t in (a, b))
    ref = eo.matmul(a32, b32)
    ref.backward(g.astype(np.float32))
    np.testing.assert_array_equal(out.data.view(np.uint16), ref.data.astype(dt).view(np.uint16))
    for t, r in ((a, a32), (b, b32)):
        assert t.grad.dtype == dt
        np.testing.assert_array_equal(t.grad.view(np.uint16), r.grad.astype(dt).view(np.uint16))


def test_16_bit_matmul_of_a_column_and_a_row_matches_float32_rounded():
    # The outer-product shape (_mm multiplies instead of calling BLAS there).
    rng = np.random.default_rng(5)
    a = eo.tensor(rng.standard_normal((6, 1)).astype(np.float16), requires_grad=True)
    b = eo.tensor(rng.standard_normal((1, 7)).astype(np.float16), requires_grad=True)
    g = rng.standard_normal((6, 7)).astype(np.float16)
    out = a @ b
    out.backward(g)
    a32, b32 = (eo.tensor(t.data.astype(np.float32), requires_grad=True) for t in (a, b))
    ref = a32 @ b32
    ref.backward(g.astype(np.float32))
    np.testing.assert_array_equal(out.data, ref.data.astype(np.float16))
    np.testing.assert_array_equal(a.grad, a32.grad.astype(np.float16))
    np.testing.assert_array_equal(b.grad, b32.grad.astype(np.float16))


@pytest.mark.usefixtures("numpy_conversions")  # tracemalloc counts NumPy's allocations only
@pytest.mark.parametrize("op", [eo.tanh, eo.sigmoid, eo.sqrt, eo.exp], ids=["tanh", "sigmoid", "sqrt", "exp"])
def test_unary_16_bit_ops_keep_no_float32_output_and_recompute_it_exactly(op):
    import tracemalloc

    rng = np.random.default_rng(6)
    x = eo.tensor(np.abs(rng.standard_normal((256, 256))).astype(np.float16), requires_grad=True)

    def run():
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        out = op(x)
        used = tracemalloc.get_traced_memory()[0] - base
        tracemalloc.stop()
        return out, used

    run()  # warm-up
    out, used = run()
    assert out.dtype == np.float16
    assert used <= 1.2 * out.data.nbytes  # the 16-bit output, no float32 one beside it
    g = rng.standard_normal(out.shape).astype(np.float16)
    out.backward(g, retain_graph=True)
    first = x.grad.copy()
    x.grad = None
    out.backward(g)  # a second pass over the retained graph recomputes again
    ref = eo.tensor(x.data.astype(np.float32), requires_grad=True)
    op(ref).backward(g.astype(np.float32))
    np.testing.assert_array_equal(first, ref.grad.astype(np.float16))
    np.testing.assert_array_equal(x.grad, first)


@pytest.mark.parametrize("low", ["float16", "bfloat16"])
@pytest.mark.parametrize(
    ("op", "rebuilt"),
    [
        (lambda x, w: 0.5 * x, set()),  # x's gradient is 0.5 * g: x's value is not needed
        (lambda x, w: x * 3.0, set()),
        (lambda x, w: x * w, {"x", "w"}),  # each operand's value gives the other's gradient
        (lambda x, w: x * w.detach(), {"w"}),  # only x needs a gradient, and it reads w
        (lambda x, w: x * x, {"x"}),
    ],
)
def test_mul_rebuilds_an_operands_float32_copy_only_for_the_other_operands_gradient(monkeypatch, low, op, rebuilt):
    """16-bit mul drops its operands' float32 copies after forward and rebuilds,
    in backward, just the ones another operand's gradient reads; gradients are
    the float32 ones rounded once either way (and NumPy's float16 ones)."""
    import ml_dtypes  # a dependency of everyo-amp

    from everyo import low_precision

    dtype = np.dtype(np.float16) if low == "float16" else np.dtype(ml_dtypes.bfloat16)
    rng = np.random.default_rng(3)
    xv, wv = (rng.standard_normal((64, 80)).astype(dtype) for _ in range(2))  # 5,120 values: the converter's sizes
    x, w = eo.tensor(xv, requires_grad=True), eo.tensor(wv, requires_grad=True)
    out = op(x, w)
    seen = []
    real_up = low_precision._up
    monkeypatch.setattr(low_precision, "_up", lambda a: seen.append(a) or real_up(a))
    out.backward(np.ones(out.shape, dtype))
    names = {name for name, t in (("x", x), ("w", w)) if any(a is t.data for a in seen)}
    assert names == rebuilt
    x32, w32 = (eo.tensor(v.astype(np.float32), requires_grad=True) for v in (xv, wv))
    op(x32, w32).backward(np.ones(out.shape, np.float32))
    for t, r in ((x, x32), (w, w32)):
        if r.grad is None:
            assert t.grad is None
        else:
            np.testing.assert_array_equal(t.grad.view(np.uint16), r.grad.astype(dtype).view(np.uint16))
