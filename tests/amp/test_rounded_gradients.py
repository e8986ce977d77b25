"""Backward hands float16 gradients between float16 ops as ``Rounded`` (the
float16 values kept in float32). That must be invisible: every gradient is
bit-identical to the path that stores each one as a float16 array, and
whatever leaves autograd (a leaf's or a retained ``.grad``) is a float16
ndarray."""

import numpy as np
import pytest

import everyo as eo
import everyo.conv
import everyo.functional
from everyo.half import Rounded, _float_to_half


@pytest.fixture
def eager_float16(monkeypatch):
    """Switch the hand-over off: every float16 gradient is stored as float16."""

    def store(x, dtype=np.float16):
        assert dtype == np.float16
        return _float_to_half(np.ascontiguousarray(x))

    def use():
        monkeypatch.setattr(everyo.functional, "_rounded", store)
        monkeypatch.setattr(everyo.conv, "_rounded", store)

    return use


def _grads(build, eager=None):
    if eager is not None:
        eager()
    tensors, loss = build()
    loss.backward()
    return [t.grad for t in tensors]


def _assert_same(fast, slow):
    assert len(fast) == len(slow)
    for a, b in zip(fast, slow):
        assert isinstance(a, np.ndarray) and not isinstance(a, Rounded)
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))  # bit for bit


def _mlp_build(retain=False):
    def build():
        rng = np.random.default_rng(0)
        x = eo.tensor(rng.standard_normal((300, 16)).astype(np.float32))
        y = eo.tensor(rng.standard_normal((300, 1)).astype(np.float32))
        model = eo.Sequential(
            eo.Linear(16, 32, seed=1), eo.ReLU(), eo.Linear(32, 32, seed=2), eo.ReLU(), eo.Linear(32, 1, seed=3)
        )
        with eo.autocast():
            h1 = model[1](model[0](x))
            h2 = model[3](model[2](h1.retain_grad() if retain else h1))
            out = model[4](h2.retain_grad() if retain else h2)
        loss = eo.mse_loss(out, y) * 1024.0
        return [*model.parameters(), *((h1, h2) if retain else ())], loss

    return build


def _cnn_build():
    def build():
        rng = np.random.default_rng(1)
        x = eo.tensor(rng.standard_normal((16, 8, 8, 1)).astype(np.float32))
        y = rng.integers(0, 10, size=16)
        model = eo.Sequential(
            eo.Conv2D(1, 8, 3, padding="same", seed=0),
            eo.ReLU(),
            eo.MaxPool2D(2),
            eo.Conv2D(8, 16, 3, padding="same", seed=1),
            eo.ReLU(),
            eo.AvgPool2D(2),
            eo.Flatten(),
            eo.Linear(16 * 2 * 2, 10, seed=2),
        )
        with eo.autocast():
            out = model(x)
        return list(model.parameters()), eo.cross_entropy(out, y) * 256.0

    return build


@pytest.mark.parametrize("retain", [False, True])
def test_mlp_gradients_are_bit_identical_with_and_without_the_hand_over(eager_float16, retain):
    # Without retain_grad the ReLUs take the hand-over; retaining their
    # outputs' gradients makes autograd store real float16 arrays there.
    fast = _grads(_mlp_build(retain))
    slow = _grads(_mlp_build(retain), eager_float16)
    _assert_same(fast, slow)
    if retain:
        assert fast[-1].dtype == np.float16 and fast[-2].dtype == np.float16


def test_cnn_gradients_are_bit_identical_with_and_without_the_hand_over(eager_float16):
    fast = _grads(_cnn_build())
    slow = _grads(_cnn_build(), eager_float16)
    _assert_same(fast, slow)


def _branchy_build():
    # A float16 activation feeding two layers (gradients summed) and an op
    # that does not take Rounded (multiply) between two float16 layers; a
    # float16 leaf receives a gradient straight from a float16 layer.
    def build():
        rng = np.random.default_rng(2)
        leaf = eo.tensor(rng.standard_normal((64, 8)).astype(np.float16), requires_grad=True)
        a, b, c = (eo.Linear(8, 8, seed=s) for s in (3, 4, 5))
        with eo.autocast():
            h = a(leaf)
            scaled = h * 0.5
            out = b(h) + c(scaled)
        return [leaf, *a.parameters(), *b.parameters(), *c.parameters()], (out.astype("float32") ** 2).sum()

    return build


def test_sums_non_taking_ops_and_float16_leaves_get_real_float16_arrays(eager_float16):
    fast = _grads(_branchy_build())
    slow = _grads(_branchy_build(), eager_float16)
    _assert_same(fast, slow)
    assert fast[0].dtype == np.float16


def test_a_rounded_gradient_holds_exactly_float16_values():
    rng = np.random.default_rng(3)
    x = eo.tensor(rng.standard_normal((50, 40)).astype(np.float16), requires_grad=True)
    w = eo.tensor(rng.standard_normal((40, 30)).astype(np.float16), requires_grad=True)
    out = eo.linear(x, w)
    (gx, gw) = out._backward(rng.standard_normal((50, 30)).astype(np.float16))
    for g in (gx, gw):
        assert isinstance(g, Rounded) and g.f32.dtype == np.float32
        np.testing.assert_array_equal(g.f32.astype(np.float16).astype(np.float32), g.f32)
        np.testing.assert_array_equal(g.materialize().astype(np.float32), g.f32)


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
def test_accumulate_is_numpys_own_16_bit_add(name):
    # Two gradients of one tensor are summed by Rounded.accumulate (autograd's
    # deferred protocol): it must give exactly the 16-bit a + b.
    from everyo.half import _rounded, _up

    if name == "bfloat16":
        dtype = np.dtype(pytest.importorskip("ml_dtypes").bfloat16)
    else:
        dtype = np.dtype(np.float16)
    codes = np.arange(2**16, dtype=np.uint16).view(dtype)
    a = codes[np.isfinite(codes.astype(np.float32))]
    b = a[np.random.default_rng(0).permutation(a.size)]
    with np.errstate(all="ignore"):
        expected = a + b
        for left, right in ((_rounded(_up(a), dtype), b), (_rounded(_up(a), dtype), _rounded(_up(b), dtype))):
            got = left.accumulate(right)
            assert isinstance(got, Rounded) and got.dtype == dtype
            same = (got.materialize().view(np.uint16) == expected.view(np.uint16)) | np.isnan(
                expected.astype(np.float32)
            )
            assert same.all()


@pytest.mark.parametrize("kernels", [True, False], ids=["kernels", "numpy"])
def test_two_float16_gradients_add_as_numpys_float16_add(kernels):
    """autograd sums two float16 array gradients of one tensor as the float32 sum rounded
    once (a Rounded), not with NumPy's element-by-element float16 loop: the same bits for
    every code against random codes (inf, overflow to inf included; NaN where NumPy gives NaN,
    with the payload NumPy keeps wherever one operand is NaN), the same warning. Where both are
    NaN, which payload survives differs between NumPy versions (2.2: a's, 2.4: b's, and
    2.4's float32 add keeps a's in its scalar tail): only NaN is checked there."""
    from everyo import autograd, kernel_table

    rng = np.random.default_rng(5)
    a = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    b = rng.integers(0, 1 << 16, a.size, dtype=np.uint32).astype(np.uint16).view(np.float16)
    finite = np.isfinite(a) & np.isfinite(b)
    with kernel_table.disabled() if not kernels else np.errstate():
        with np.errstate(over="ignore", invalid="ignore"):
            want = np.add(a, b)
            got = autograd.materialize(autograd._add(a.copy(), b.copy()))
        assert got.dtype == np.float16 and got.shape == a.shape
        assert (~finite).sum() > 1000
        both_nan = np.isnan(a) & np.isnan(b)
        assert both_nan.sum() > 30 and np.isnan(got[both_nan]).all()
        np.testing.assert_array_equal(got.view(np.uint16)[~both_nan], want.view(np.uint16)[~both_nan])
        big = np.full(4096, 60000.0, np.float16)
        with np.errstate(over="warn"), pytest.warns(RuntimeWarning, match="overflow"):
            total = autograd.materialize(autograd._add(big, big.copy()))
        assert np.isposinf(total).all()
