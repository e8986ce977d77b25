"""The max_pool2d kernels (max_pool_forward, max_pool_backward) against core's
NumPy path: bit-identical outputs and input gradients on random geometries
('valid' edges dropped, pool 2 and 3, stride equal to and larger than the
pool, batch 1, one channel), float32 and float64, with ties (-0.0 / +0.0 and
equal values), NaN and +-inf in the input and the gradient; the cases the
kernels do not take keep NumPy's path; the gradient through them passes the
FD checker."""

import numpy as np
import pytest
from conftest import count_calls

import everyo as eo
from everyo import kernel_table
from everyo.testing import check_gradients

NAMES = ("max_pool_forward", "max_pool_backward")

# (N, H, W, C), pool, stride
GEOMETRIES = [
    ((2, 28, 28, 32), 2, None),  # the CNN benchmark's pool at batch 2
    ((1, 7, 9, 1), 2, 2),  # batch 1, one channel, odd H/W: 'valid' drops the last row and column
    ((3, 10, 11, 5), 3, 3),
    ((2, 11, 10, 4), 2, 3),  # stride > pool: gap rows and columns
    ((2, 13, 12, 3), (2, 3), (3, 4)),
    ((1, 5, 5, 17), 3, 4),  # one window each way, the rest dropped
    ((2, 6, 8, 9), (1, 2), (1, 2)),
]


def _same_bits(a, b):
    """Bit-identical, except a NaN's sign and payload (see test_dense_kernels); NaN positions must match."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    nan_a, nan_b = np.isnan(a), np.isnan(b)
    return np.array_equal(nan_a, nan_b) and np.array_equal(a[~nan_a].view(np.uint8), b[~nan_b].view(np.uint8))


def _input(rng, shape, dtype, fill):
    if fill == "random":
        x = rng.standard_normal(shape).astype(dtype)
        flat = x.reshape(-1)
        flat[rng.integers(0, flat.size, 6)] = np.array([np.nan, np.nan, np.inf, -np.inf, np.inf, -np.inf], dtype)
        return x
    if fill == "signed zeros":
        # Every window a tie of -0.0 and +0.0 in random order: which zero the
        # maximum is, and which position takes the gradient, must match.
        return np.where(rng.random(shape) < 0.5, -0.0, 0.0).astype(dtype)
    # "ties": few distinct values, so most windows hold their maximum twice or more
    return rng.integers(-2, 2, shape).astype(dtype)


def _pool(x, g, pool, stride):
    xt = eo.tensor(x, requires_grad=True)
    with np.errstate(all="ignore"):
        out = eo.max_pool2d(xt, pool, stride)
        out.backward(eo.tensor(g))
    return out.data.copy(), xt.grad.copy()


@pytest.mark.parametrize("fill", ["random", "signed zeros", "ties"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("geometry", GEOMETRIES)
def test_max_pool2d_with_kernels_matches_numpy_path_bit_for_bit(monkeypatch, geometry, dtype, fill):
    shape, pool, stride = geometry
    rng = np.random.default_rng(0)
    x = _input(rng, shape, dtype, fill)
    out_shape = eo.max_pool2d(eo.tensor(x), pool, stride).shape
    g = rng.standard_normal(out_shape).astype(dtype)
    # Specials in the gradient: the window's other positions get g * 0.0 (-0.0, NaN).
    g.reshape(-1)[:4] = np.array([np.inf, np.nan, -0.0, -np.inf], dtype)[: g.size]
    with kernel_table.disabled():
        want = _pool(x, g, pool, stride)
    calls = count_calls(monkeypatch, NAMES)
    got = _pool(x, g, pool, stride)
    assert calls == {"max_pool_forward": 1, "max_pool_backward": 1}
    assert _same_bits(got[0], want[0])
    assert _same_bits(got[1], want[1])


def test_forward_kernel_folds_like_np_maximum():
    # np.maximum returns its second operand on a tie of zeros; a window
    # holding +0.0 then -0.0 pools to -0.0, -0.0 then +0.0 to +0.0. NaN wins anywhere.
    rows = [[0.0, -0.0], [-0.0, 0.0], [1.0, np.nan], [np.nan, 1.0], [-np.inf, -np.inf], [np.inf, np.nan]]
    x = np.array(rows, np.float32).reshape(len(rows), 1, 2, 1)
    want = np.maximum(x[:, :, 0], x[:, :, 1]).reshape(len(rows), 1, 1, 1)
    got = np.full_like(want, 7.0)
    kernel_table.get("max_pool_forward")(x, got, 1, 2, 1, 2)
    assert _same_bits(got, want)
    assert list(np.signbit(got.reshape(-1)[:2])) == [True, False]


def test_backward_kernel_writes_every_value():
    # stride > pool and an odd edge: gap and dropped cells must be written (+0.0), not left.
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 9, 10, 3)).astype(np.float32)
    out = np.empty((2, 3, 3, 3), np.float32)
    kernel_table.get("max_pool_forward")(x, out, 2, 2, 3, 3)
    g = rng.standard_normal(out.shape).astype(np.float32)
    gx = np.full_like(x, 7.0)
    kernel_table.get("max_pool_backward")(x, out, g, gx, 2, 2, 3, 3)
    assert not (gx == 7.0).any()
    assert np.count_nonzero(gx) == g.size
    assert np.sum(gx) == pytest.approx(np.sum(g), rel=1e-5)


@pytest.mark.parametrize("what", ["overlapping", "padded", "float16", "transposed input"])
def test_kernels_are_not_used_where_they_do_not_apply(monkeypatch, what):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 8, 8, 4)).astype(np.float16 if what == "float16" else np.float32)
    if what == "transposed input":
        x = np.ascontiguousarray(x.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)
    kwargs = {
        "pool_size": 3,
        "stride": 2 if what == "overlapping" else 3,
        "padding": 1 if what == "padded" else "valid",
    }

    def grad():
        xt = eo.tensor(x, requires_grad=True)
        eo.max_pool2d(xt, **kwargs).sum().backward()
        return xt.grad

    with kernel_table.disabled():
        want = grad()
    calls = count_calls(monkeypatch, NAMES)
    got = grad()
    assert calls == {"max_pool_forward": 0, "max_pool_backward": 0}
    assert _same_bits(got, want) and got.shape == x.shape


@pytest.mark.parametrize("geometry", [((2, 7, 9, 3), 2, None), ((1, 8, 11, 2), (2, 3), (3, 4))])
def test_gradients_through_the_kernels_pass_the_fd_checker(monkeypatch, geometry):
    shape, pool, stride = geometry
    # Distinct values, spaced well beyond the FD step: no ties for the step to break.
    rng = np.random.default_rng(3)
    x = (rng.permutation(int(np.prod(shape))) * 0.01).reshape(shape)
    calls = count_calls(monkeypatch, NAMES)
    check_gradients(lambda x: eo.max_pool2d(x, pool, stride), [x], name="max_pool2d")
    assert calls["max_pool_forward"] >= 1 and calls["max_pool_backward"] >= 1
