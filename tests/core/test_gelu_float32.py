"""float32 exact GELU: Phi(x) computed in float32 (everyo.activations), checked
against math.erfc in float64 within the documented 10 ulp, across the whole
range (tails down to the subnormals, +-0, +-inf, NaN, subnormal inputs), and
its gradient against central differences."""

import math

import numpy as np
import pytest

import everyo as eo
from everyo.activations import _normal_cdf
from everyo.testing import check_gradients

BOUND_ULP = 10  # documented beside _normal_cdf32


def _exact_cdf(x32):
    return np.array([0.5 * math.erfc(-float(v) / math.sqrt(2)) for v in x32])


def _ulps(got, exact):
    ulp = np.spacing(np.abs(exact).astype(np.float32)).astype(np.float64)
    return np.abs(got.astype(np.float64) - exact) / np.where(ulp > 0, ulp, np.spacing(np.float32(0)))


def test_float32_normal_cdf_within_bound_of_math_erfc_over_the_whole_range():
    rng = np.random.default_rng(0)
    tiny = np.geomspace(1e-45, 16, 4000)  # down through float32's subnormals
    x = np.concatenate(
        [np.linspace(-16, 16, 200001), tiny, -tiny, rng.uniform(-15, 15, 50000), rng.normal(0, 2, 50000)]
    )
    x32 = x.astype(np.float32)
    got = _normal_cdf(x32)
    assert got.dtype == np.float32
    ulps = _ulps(got, _exact_cdf(x32))
    assert ulps.max() <= BOUND_ULP, (ulps.max(), x32[np.argmax(ulps)])
    # the deep tail keeps its relative precision (1 + erf(x / sqrt 2) would be 0 here)
    assert _normal_cdf(np.array([-10.0], np.float32))[0] > 0


def test_float32_normal_cdf_special_values():
    x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, -1e-40, 15.5, -15.5], np.float32)
    got = _normal_cdf(x)
    np.testing.assert_array_equal(got[:4], [0.5, 0.5, 1.0, 0.0])
    assert np.isnan(got[4])
    np.testing.assert_array_equal(got[5:7], [0.5, 0.5])
    np.testing.assert_array_equal(got[7:], [1.0, 0.0])
    with np.errstate(invalid="ignore"):  # -inf * Phi(-inf) = -inf * 0
        y = eo.gelu(eo.tensor(x)).data
    assert y[2] == np.inf and np.isnan(y[4]) and y[0] == 0 and y[8] == 0


@pytest.mark.parametrize("shape", [(), (7,), (3, 70001)])
def test_float32_normal_cdf_any_shape_and_strides(shape):
    # blocks of 65536 values: a size over one block, a 0-d array, a strided view
    x = np.random.default_rng(1).normal(0, 3, shape).astype(np.float32)
    got = _normal_cdf(x)
    assert got.shape == x.shape and got.dtype == np.float32
    assert _ulps(np.atleast_1d(got).ravel(), _exact_cdf(np.atleast_1d(x).ravel())).max() <= BOUND_ULP
    if x.ndim == 2:
        view = x[:, ::3]
        np.testing.assert_array_equal(_normal_cdf(view), got[:, ::3])


def test_float32_gelu_gradient_against_central_differences():
    # central differences on the float32 forward itself (eps = 2^-6, exact steps)
    x = (np.random.default_rng(2).normal(0, 2.5, 400).astype(np.float32) * 64).round() / 64
    x = x[np.abs(x) > 0.05]
    eps = np.float32(2.0**-6)
    xt = eo.tensor(x, requires_grad=True)
    eo.gelu(xt).sum().backward()
    assert xt.grad.dtype == np.float32
    up = eo.gelu(eo.tensor(x + eps)).data.astype(np.float64)
    down = eo.gelu(eo.tensor(x - eps)).data.astype(np.float64)
    # truncation eps^2 |f'''| / 6 <= 3.3e-5 (|f'''| = |x phi(x) (x^2 - 4)| <= 0.8)
    np.testing.assert_allclose(xt.grad, (up - down) / (2 * float(eps)), rtol=2e-4, atol=5e-5)
    # and the float32 gradient is the float64 one (which passes the shared checker) to float32 precision
    check_gradients(eo.gelu, [x.astype(np.float64)])
    x64 = eo.tensor(x.astype(np.float64), requires_grad=True)
    eo.gelu(x64).sum().backward()
    g64 = x64.grad
    np.testing.assert_allclose(xt.grad, g64, rtol=2e-6, atol=1e-7)
