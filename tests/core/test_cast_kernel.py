"""everyo.half.set_cast_kernel: core's contract with an outside float16 converter.

Core redoes, with NumPy, every value a converter may get wrong without being
wrong on finite values (NaN payloads, signalling NaNs, inf, overflow), only
hands it large C-contiguous arrays, and falls back to its own conversions
when the converter declines. Tested with plain-NumPy stand-ins (everyo-amp's
onnxruntime converter is tested in the amp cell).
"""

import numpy as np
import pytest

import everyo.half as half
from everyo import kernel_table


@pytest.fixture(autouse=True)
def _converter_not_compiled_kernels():
    """With everyo-kernels active its one-pass conversions come before any installed
    converter (everyo.half); these tests are about the converter: kernels off."""
    with kernel_table.disabled():
        yield


class _Careless:
    """Right on finite values; every inf/NaN code comes back as a bare quiet NaN or inf of the wrong sign."""

    def __init__(self):
        self.calls = []

    def down(self, x):
        self.calls.append(("down", x.size, x.flags.c_contiguous, x.ndim))
        with np.errstate(over="ignore"):
            h = x.astype(np.float16)
        codes = h.view(np.uint16)
        special = (codes & 0x7C00) == 0x7C00
        codes[special] = 0x7E00  # every special becomes the same quiet NaN
        return h

    def up(self, h):
        self.calls.append(("up", h.size, h.flags.c_contiguous, h.ndim))
        f = h.astype(np.float32)
        f[~np.isfinite(f)] = -np.inf
        return f


class _Declining:
    def down(self, x):
        return None

    def up(self, h):
        return None


@pytest.fixture
def install():
    installed = []

    def put(kernel):
        installed.append(half.set_cast_kernel(kernel))
        return kernel

    yield put
    half.set_cast_kernel(installed[0] if installed else None)


def _edge_array(n, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n).astype(np.float32)
    x[:6] = [np.inf, -np.inf, 1e6, -65520.0, 65519.0, -0.0]
    x[6:8] = np.array([0x7FA00001, 0xFFC00123], np.uint32).view(np.float32)  # signalling and payload NaNs
    return x


@pytest.mark.parametrize("kernel_cls", [_Careless, _Declining])
def test_results_are_astypes_bits_whatever_the_converter_does(install, kernel_cls):
    install(kernel_cls())
    x = _edge_array(10_000, 0)
    with np.errstate(over="ignore"):
        expected = x.astype(np.float16)
        got = half._float_to_half(x)
        kept = half._round_to_half(x)
        exact = half._exact_to_half(expected.astype(np.float32))
    np.testing.assert_array_equal(got.view(np.uint16), expected.view(np.uint16))
    np.testing.assert_array_equal(kept.view(np.uint32), expected.astype(np.float32).view(np.uint32))
    np.testing.assert_array_equal(exact.view(np.uint16), expected.view(np.uint16))
    codes = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    np.testing.assert_array_equal(half._half_to_float(codes).view(np.uint32), codes.astype(np.float32).view(np.uint32))


def test_only_large_float32_arrays_reach_the_converter_as_contiguous_vectors(install):
    kernel = install(_Careless())
    big = np.arange(12800, dtype=np.float32).reshape(128, 100) / np.float32(7.0)
    half._float_to_half(big)
    half._float_to_half(big[:10])  # 1,000 values: below the threshold
    half._float_to_half(big.astype(np.float64))  # not float32
    half._half_to_float(big.astype(np.float16))
    assert kernel.calls == [("down", 12800, True, 1), ("up", 12800, True, 1)]
    # a strided view (a transpose, every other column) goes as a contiguous copy, and comes back
    # in the caller's shape with astype's values
    for view in (big.T, big[:, ::2]):
        kernel.calls.clear()
        got = half._float_to_half(view)
        assert kernel.calls == [("down", view.size, True, 1)]
        assert got.shape == view.shape
        np.testing.assert_array_equal(got.view(np.uint16), view.astype(np.float16).view(np.uint16))
        kernel.calls.clear()
        back = half._half_to_float(got.T)
        assert kernel.calls == [("up", view.size, True, 1)] and back.shape == got.T.shape
        np.testing.assert_array_equal(back, got.T.astype(np.float32))


def test_the_overflow_warning_and_errstate_stay_numpys(install):
    install(_Careless())
    x = _edge_array(5000, 1)
    with pytest.warns(RuntimeWarning, match="overflow"):
        half._float_to_half(x)
    with np.errstate(over="raise"), pytest.raises(FloatingPointError):
        half._float_to_half(x)


def test_set_cast_kernel_returns_the_previous_one(install):
    first, second = _Careless(), _Declining()
    install(first)
    assert half.set_cast_kernel(second) is first
    assert half.set_cast_kernel(first) is second
