"""The exact float32 GELU kernels (gelu_forward, gelu_backward) against core's NumPy path.

They are that path's float32 operations in its order, except exp (their own,
within 1 ulp; NumPy's is its SIMD loop): so Phi, the output and the gradient
are checked within the bound documented in everyo.kernels.gelu (BOUND_REL) of
the NumPy path, out = x * Phi bit for bit given Phi, Phi within core's
documented 10 ulp of math.erfc, on dense grids, random values and special
values (+-inf, NaN, +-0, huge, tiny, subnormal, the tails where Phi underflows);
the gradient through eo.gelu with the kernels on passes the FD checker."""

import math

import numpy as np
import pytest
from conftest import count_calls

import everyo as eo
from everyo import kernel_table
from everyo.activations import _normal_cdf
from everyo.kernels._jit import kernel
from everyo.kernels.gelu import BOUND_REL, _exp_small, exp32, gelu_backward, gelu_forward
from everyo.testing import check_gradients

CORE_BOUND_ULP = 10  # core's documented bound against math.erfc (tests/core/test_gelu_float32.py)
SPECIALS = [0.0, -0.0, np.nan, -np.nan, np.inf, -np.inf, 1e-45, -1e-45, 1e-40, -1e-40, 1e-30, -1e-30, 3e38, -3e38]


def _grid():
    rng = np.random.default_rng(0)
    tiny = np.geomspace(1e-45, 16, 4000)
    x = np.concatenate(
        [
            np.linspace(-16, 16, 200001),
            tiny,
            -tiny,
            np.linspace(-15.5, -12.5, 30001),  # where Phi(x) is subnormal, and underflows to 0
            rng.uniform(-15, 15, 50000),
            rng.normal(0, 2, 50000),
            SPECIALS,
        ]
    )
    return x.astype(np.float32)


def _within_bound(got, want, scale, x):
    """NaN where the NumPy path has NaN, equal infinities, and elsewhere
    |got - want| <= BOUND_REL * |scale| + 2^-148 (1 + |x|) (everyo.kernels.gelu's doc)."""
    nan = np.isnan(want)
    if not np.array_equal(np.isnan(got), nan):
        return False
    inf = np.isinf(want)
    if not np.array_equal(got[inf], want[inf]):
        return False
    ok = ~nan & ~inf
    err = np.abs(got[ok].astype(np.float64) - want[ok].astype(np.float64))
    allowed = BOUND_REL * np.abs(scale[ok].astype(np.float64)) + 2.0**-148 * (1 + np.abs(x[ok].astype(np.float64)))
    return bool(np.all(err <= allowed))


def _backward_scale(x, g, cdf):
    """|g| (|Phi(x)| + |x phi(x)|): the size of the gradient's two terms."""
    x64 = x.astype(np.float64)
    with np.errstate(all="ignore"):
        return np.abs(g.astype(np.float64)) * (
            np.abs(cdf) + np.abs(x64 * np.exp(-0.5 * x64 * x64)) / math.sqrt(2 * math.pi)
        )


def _run(x):
    out, cdf = np.empty_like(x), np.empty_like(x)
    with np.errstate(all="ignore"):
        gelu_forward(x, out, cdf)
    return out, cdf


def test_exp32_within_one_ulp_of_exp():
    # every float32 in [-104, -87] (subnormal results, and underflow) and 2M others in [-104, 0]
    rng = np.random.default_rng(1)
    lo, hi = np.float32(-104).view(np.uint32), np.float32(-87).view(np.uint32)
    x = np.concatenate(
        [
            np.arange(hi, lo + 1, dtype=np.uint32).view(np.float32),
            rng.integers(0x80000000, lo, 2_000_000, dtype=np.uint32).view(np.float32),
            -rng.uniform(0, 20, 500_000).astype(np.float32),
        ]
    )
    got = np.empty_like(x)
    exp32(x, got)
    exact = np.exp(x.astype(np.float64))
    ulp = np.maximum(np.spacing(exact.astype(np.float32)).astype(np.float64), 2.0**-149)
    assert (np.abs(got - exact) / ulp).max() < 1.0
    special = np.array([0.0, -0.0, np.nan, -np.inf, np.inf, 89.0, -104.0, -1e-45], np.float32)
    got = np.empty_like(special)
    exp32(special, got)
    np.testing.assert_array_equal(got, [1.0, 1.0, np.nan, 0.0, np.inf, np.inf, 0.0, 1.0])


@kernel
def _exp_small_all(b, out):
    for n in range(b.size):
        out[n] = _exp_small(b[n])


def test_exp_small_within_one_ulp_of_exp_where_the_forward_uses_it():
    # the forward's exp(low), |low| <= 2^-11 * 15^2 < 0.11: 2M float32 patterns of [2^-40, 0.11]
    # (either sign), the top 200,000 below 0.11, and zeros and subnormals
    rng = np.random.default_rng(2)
    lo, hi = np.float32(2.0**-40).view(np.uint32), np.float32(0.11).view(np.uint32)
    pos = np.concatenate(
        [rng.integers(lo, hi + 1, 2_000_000, dtype=np.uint32), np.arange(hi - 200_000, hi + 1, dtype=np.uint32)]
    ).view(np.float32)
    b = np.concatenate([pos, -pos, np.array([0.0, -0.0, 1e-45, -1e-45], np.float32)])
    got = np.empty_like(b)
    _exp_small_all(b, got)
    exact = np.exp(b.astype(np.float64))
    assert (np.abs(got - exact) / np.spacing(exact.astype(np.float32)).astype(np.float64)).max() < 1.0


def test_forward_within_bound_of_numpy_path_and_of_erfc():
    x = _grid()
    out, cdf = _run(x)
    want_cdf = _normal_cdf(x)
    with np.errstate(invalid="ignore"):
        want_out = x * want_cdf
    assert np.array_equal(np.isnan(cdf), np.isnan(want_cdf)) and np.array_equal(np.isnan(out), np.isnan(want_out))
    assert _within_bound(cdf, want_cdf, want_cdf, x)
    assert _within_bound(out, want_out, want_out, x)
    # out is x * cdf, one float32 product: the same bits given the same cdf
    with np.errstate(invalid="ignore"):
        assert np.array_equal(out.view(np.int32)[~np.isnan(out)], (x * cdf).view(np.int32)[~np.isnan(out)])
    finite = np.isfinite(x)
    exact = np.array([0.5 * math.erfc(-float(v) / math.sqrt(2)) for v in x[finite]])
    ulp = np.maximum(np.spacing(np.abs(exact).astype(np.float32)).astype(np.float64), 2.0**-149)
    assert (np.abs(cdf[finite] - exact) / ulp).max() <= CORE_BOUND_ULP


def test_forward_special_values_exactly():
    x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, -1e-40, 15.5, -15.5, 3e38, -3e38], np.float32)
    out, cdf = _run(x)
    np.testing.assert_array_equal(cdf, [0.5, 0.5, 1.0, 0.0, np.nan, 0.5, 0.5, 1.0, 0.0, 1.0, 0.0])
    assert out[2] == np.inf and np.isnan(out[3]) and np.isnan(out[4]) and out[8] == 0 and out[10] == 0
    assert out[9] == np.float32(3e38) and np.signbit(out[1]) and out[5] == np.float32(5e-41)


def test_backward_within_bound_of_numpy_path():
    x = _grid()
    g = np.random.default_rng(2).standard_normal(x.size).astype(np.float32)
    g[::97] = np.array(SPECIALS, np.float32)[np.arange(g[::97].size) % len(SPECIALS)]
    _, cdf = _run(x)
    res = np.empty_like(x)
    with np.errstate(all="ignore"):
        gelu_backward(g, x, cdf, res)
        d = np.multiply(x, x)  # core's derivative on the same cdf
        d *= -0.5
        np.exp(d, out=d)
        d *= x
        d *= np.float32(1 / math.sqrt(2 * math.pi))
        d += cdf
        want = g * d
    assert _within_bound(res, want, _backward_scale(x, g, cdf), x.astype(np.float64) * g)


def _gelu_grad(x, g):
    xt = eo.tensor(x, requires_grad=True)
    out = eo.gelu(xt)
    with np.errstate(all="ignore"):
        out.backward(eo.tensor(g))
    return out.data.copy(), xt.grad.copy()


@pytest.mark.parametrize("shape", [(32, 64, 512), (130, 129)])
def test_eo_gelu_uses_the_kernels_within_bound(monkeypatch, shape):
    rng = np.random.default_rng(shape[0])
    x = (3 * rng.standard_normal(shape)).astype(np.float32)
    x.reshape(-1)[::1000] = np.array(SPECIALS, np.float32)[np.arange(x.reshape(-1)[::1000].size) % len(SPECIALS)]
    g = rng.standard_normal(shape).astype(np.float32)
    with kernel_table.disabled():
        want_out, want_grad = _gelu_grad(x, g)
    calls = count_calls(monkeypatch, ("gelu_forward", "gelu_backward"))
    got_out, got_grad = _gelu_grad(x, g)
    assert calls == {"gelu_forward": 1, "gelu_backward": 1}
    assert got_out.dtype == got_grad.dtype == np.float32
    with kernel_table.disabled():
        cdf = _normal_cdf(x)
    assert _within_bound(got_out, want_out, want_out, x)
    assert _within_bound(got_grad, want_grad, _backward_scale(x, g, cdf), x.astype(np.float64) * g)


def test_float16_is_the_kernel_result_rounded_once(monkeypatch):
    # core computes float16 GELU in float32 and rounds once: with the kernels that float32 value
    # is within the bound above, so the float16 result is the NumPy path's or one float16 ulp off
    # (where the two float32 values straddle a float16 rounding boundary).
    calls = count_calls(monkeypatch, ("gelu_forward", "gelu_backward"))
    x = np.random.default_rng(4).standard_normal((256, 256)).astype(np.float16)
    g = np.random.default_rng(5).standard_normal((256, 256)).astype(np.float16)
    with kernel_table.disabled():
        want = _gelu_grad(x, g)
    got = _gelu_grad(x, g)
    assert calls["gelu_forward"] == 1
    for a, e in zip(got, want):
        assert a.dtype == np.float16
        codes = np.abs(a.view(np.int16).astype(np.int32) - e.view(np.int16).astype(np.int32))
        assert codes.max() <= 1 and (codes == 0).mean() > 0.99


def test_small_strided_and_float64_keep_the_numpy_path(monkeypatch):
    calls = count_calls(monkeypatch, ("gelu_forward", "gelu_backward"))
    rng = np.random.default_rng(4)
    for x in [
        rng.standard_normal((10, 10)).astype(np.float32),
        rng.standard_normal((256, 256)).astype(np.float32)[:, ::2],
        rng.standard_normal((256, 256)),
    ]:
        with kernel_table.disabled():
            want_out, want_grad = _gelu_grad(x, np.ones_like(x))
        got_out, got_grad = _gelu_grad(x, np.ones_like(x))
        assert np.array_equal(got_out, want_out) and np.array_equal(got_grad, want_grad)
    assert calls == {"gelu_forward": 0, "gelu_backward": 0}


def test_gradient_through_the_kernels_against_central_differences(monkeypatch):
    # float32 only (float64 keeps the NumPy path): central differences on the kernel forward itself
    calls = count_calls(monkeypatch, ("gelu_forward", "gelu_backward"))
    rng = np.random.default_rng(5)
    x = ((rng.normal(0, 2.5, (128, 128)).astype(np.float32) * 64).round() / 64).astype(np.float32)
    x[np.abs(x) <= 0.05] = 0.5
    eps = np.float32(2.0**-6)
    xt = eo.tensor(x, requires_grad=True)
    eo.gelu(xt).sum().backward()
    up = eo.gelu(eo.tensor(x + eps)).data.astype(np.float64)
    down = eo.gelu(eo.tensor(x - eps)).data.astype(np.float64)
    assert calls == {"gelu_forward": 3, "gelu_backward": 1}
    np.testing.assert_allclose(xt.grad, (up - down) / (2 * float(eps)), rtol=2e-4, atol=5e-5)


def test_gradient_through_the_kernels_passes_the_fd_checker(monkeypatch):
    # check_gradients works in float64 and the kernels take float32 from 16,384 values: each of
    # 16 float64 inputs t_i (on a 2^-6 grid, as are the offsets, so t_i +- eps and the sums are
    # exact in float32) feeds 1,024 float32 GELU inputs t_i + offset_j; eps 2^-6 and tolerances
    # sized for float32 rounding and the eps^2 truncation.
    calls = count_calls(monkeypatch, ("gelu_forward", "gelu_backward"))
    rng = np.random.default_rng(6)
    t = (rng.normal(0, 1, (16, 1)) * 64).round() / 64
    offsets = eo.tensor((rng.normal(0, 2, (16, 1024)) * 64).round().astype(np.float32) / 64)
    check_gradients(
        lambda v: eo.gelu(v.astype(np.float32) + offsets), [t], eps=2.0**-6, atol=2e-3, rtol=1e-3, name="gelu kernels"
    )
    assert calls["gelu_forward"] > 0 and calls["gelu_backward"] > 0
