"""The float16 fast paths autocast relies on are exact: conversions are
bit-identical to NumPy's astype, ReLU matches np.maximum code for code, and
float16 layers agree with float32 math on float16-rounded operands."""

import warnings

import numpy as np
import pytest

import everyo as eo
from everyo.half import _exact_to_half, _float_to_half, _float_to_half_own, _half_to_float, _round_to_half

ALL_HALF_CODES = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)


@pytest.fixture(autouse=True, params=["kernels", "onnxruntime", "numpy"])
def converter(request):
    """Every test here runs with everyo-amp's onnxruntime converter installed in core
    (onnxruntime is a dependency of this test cell, so it must work) and with core's own,
    everyo-kernels off; and as it comes, with everyo-kernels' conversions where they are
    active (they come before an installed converter)."""
    import everyo.half as half
    from everyo import kernel_table
    from everyo.amp.fast_casts import _CASTS

    if request.param == "kernels":
        if kernel_table.get("half_codes") is None:
            pytest.skip(f"everyo-kernels' float16 conversions are not active: {kernel_table.kernels().reason}")
        yield request.param
        return
    if request.param == "onnxruntime":
        assert _CASTS._ready() is not None, _CASTS.status
        previous = half.set_cast_kernel(_CASTS)
    else:
        previous = half.set_cast_kernel(None)
    with kernel_table.disabled():
        yield request.param
    half.set_cast_kernel(previous)


def test_half_to_float_matches_astype_for_every_float16_code():
    h = ALL_HALF_CODES.view(np.float16)
    np.testing.assert_array_equal(_half_to_float(h).view(np.uint32), h.astype(np.float32).view(np.uint32))


def assert_rounds_like_astype(x):
    """Both roundings (to float16, and to float16 values kept in float32) are astype's, bit for bit."""
    with np.errstate(all="ignore"):
        expected = x.astype(np.float16)
        got = _float_to_half(x)
        own = _float_to_half_own(x)  # the arithmetic path, whatever the sample would choose
        kept = _round_to_half(x)
    np.testing.assert_array_equal(got.view(np.uint16), expected.view(np.uint16))
    np.testing.assert_array_equal(own.view(np.uint16), expected.view(np.uint16))
    np.testing.assert_array_equal(kept.view(np.uint32), expected.astype(np.float32).view(np.uint32))


@pytest.mark.parametrize("start", range(0, 1 << 32, 1 << 29))
def test_float_to_half_matches_astype_across_all_float32_bit_patterns(start):
    # Every 61st bit pattern of a 2**29 slice: all exponents, both signs,
    # ties, subnormals, overflow, inf and NaN payloads.
    assert_rounds_like_astype(
        np.arange(start, start + (1 << 29), 61, dtype=np.uint64).astype(np.uint32).view(np.float32)
    )


def _around_every_half(min_magnitude):
    # Every finite float16 value of at least ``min_magnitude``, the float32
    # values a few ulps either side, and the midpoints to both neighbours.
    h = ALL_HALF_CODES.view(np.float16)
    c = h[np.isfinite(h) & (np.abs(h) >= min_magnitude)].astype(np.float32).view(np.uint32).astype(np.int64)
    parts = [c + d for d in range(-3, 4)] + [c + d * 4096 for d in (-1, 1)]
    return np.concatenate(parts).clip(0, 2**32 - 1).astype(np.uint32).view(np.float32)


def test_roundings_fast_path_every_float16_neighbourhood():
    # No zero and nothing below 2**-14: the signed fast path, ties included.
    x = _around_every_half(2.0**-14)
    x = x[(np.abs(x) >= 2.0**-14) & (np.abs(x) < 65520)]
    assert_rounds_like_astype(x)


def test_roundings_fast_path_just_below_the_smallest_normal():
    # Just below 2**-14 the fast rounding (relative) and float16's (absolute
    # spacing 2**-24) meet: values that round up to 2**-14 are left alone,
    # the rest are redone. A few such values among normal ones.
    below = (np.uint32(0x38800000) - np.arange(1, 40, dtype=np.uint32) * np.uint32(512)).view(np.float32)
    x = np.random.default_rng(8).standard_normal(40 * 64).astype(np.float32)
    x[np.abs(x) < 2**-14] = 1.0
    x[::64][:39] = below * np.where(np.arange(39) % 2, 1, -1).astype(np.float32)
    assert_rounds_like_astype(x)


def test_roundings_fast_path_with_overflow_inf_and_nan():
    x = _around_every_half(1.0)
    x = np.concatenate([x, np.array([65520.0, -7e4, np.inf, -np.inf, np.nan, 3e38], np.float32)])
    assert_rounds_like_astype(np.random.default_rng(5).permutation(x))


def test_roundings_general_path_every_float16_neighbourhood():
    assert_rounds_like_astype(_around_every_half(0.0))  # zeros and subnormals included


def test_float_to_half_rounding_ties_to_even_and_subnormals():
    values = np.array(
        [
            2049.0,
            2051.0,
            1 + 2**-11,
            1 + 3 * 2**-11,
            2**-25,
            2**-24,
            1.5 * 2**-24,
            65504.0,
            65519.0,
            -(2**-14),
            -0.0,
            6e-8,
            3e-8,
        ],
        dtype=np.float32,
    )
    np.testing.assert_array_equal(_float_to_half(values).view(np.uint16), values.astype(np.float16).view(np.uint16))


def test_conversions_keep_shape_for_0d_empty_and_strided_arrays():
    for a in (np.array(3.5, np.float32), np.zeros((0, 3), np.float32), np.ones((4, 3), np.float32).T):
        h = _float_to_half(a)
        assert h.shape == a.shape and h.dtype == np.float16
        assert _half_to_float(h).shape == a.shape


def test_overflow_warns_like_astype_and_respects_errstate():
    big = np.array([1.0, 1e6], dtype=np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(RuntimeWarning, match="overflow"):
            _float_to_half(big)
        with np.errstate(over="ignore"):
            assert np.isinf(_float_to_half(big)[1])


def test_relu_on_float16_matches_numpy_for_every_code():
    h = ALL_HALF_CODES.view(np.float16)
    with np.errstate(all="ignore"):
        expected = np.maximum(h, 0)
    out = eo.relu(eo.tensor(h))
    np.testing.assert_array_equal(out.data.view(np.uint16), expected.view(np.uint16))


def test_relu_backward_on_float16_matches_numpy():
    h = ALL_HALF_CODES.view(np.float16)
    rng = np.random.default_rng(0)
    x = eo.tensor(rng.permutation(h), requires_grad=True)
    out = eo.relu(x)
    out.backward(h)  # every float16 code as an incoming gradient
    with np.errstate(all="ignore"):
        expected = h * ~(out.data <= 0)  # the gradient passes at NaN, as in the float32 path and PyTorch
    finite = np.isfinite(expected)
    np.testing.assert_array_equal(x.grad[finite].view(np.uint16), expected[finite].view(np.uint16))
    np.testing.assert_array_equal(np.isnan(x.grad), np.isnan(expected))
    np.testing.assert_array_equal(np.isinf(x.grad), np.isinf(expected))


def test_float16_conv_backward_matches_float32_on_rounded_operands():
    rng = np.random.default_rng(1)
    x16 = rng.standard_normal((2, 6, 6, 3)).astype(np.float16)
    k16 = rng.standard_normal((3, 3, 3, 4)).astype(np.float16)
    g16 = rng.standard_normal((2, 3, 3, 4)).astype(np.float16)
    grads = {}
    for dtype in ("float16", "float32"):
        x = eo.tensor(x16.astype(dtype), requires_grad=True)
        k = eo.tensor(k16.astype(dtype), requires_grad=True)
        eo.conv2d(x, k, stride=2, padding="same").backward(g16.astype(dtype))
        grads[dtype] = (x.grad, k.grad)
    for half, full in zip(grads["float16"], grads["float32"]):
        assert half.dtype == np.float16
        # float32 accumulation rounded once: the float32 result, rounded
        np.testing.assert_array_equal(half, full.astype(np.float16))


@pytest.mark.parametrize("pool", [eo.max_pool2d, eo.avg_pool2d])
@pytest.mark.parametrize("size, stride, padding", [(2, None, "valid"), (3, 2, "same"), (3, 1, "valid")])
def test_float16_pools_are_the_float32_pools_rounded_once(pool, size, stride, padding):
    # Large enough (> 256 elements) for the fast conversion paths. The float16
    # pool works in float32 on the exact upcast and rounds once, forward and
    # backward, so it equals the float32 pool of the same values, rounded.
    rng = np.random.default_rng(2)
    x16 = rng.standard_normal((4, 9, 9, 8)).astype(np.float16)
    results = {}
    for dtype in ("float16", "float32"):
        x = eo.tensor(x16.astype(dtype), requires_grad=True)
        out = pool(x, size, stride, padding=padding)
        g16 = np.random.default_rng(3).standard_normal(out.shape).astype(np.float16)
        out.backward(g16.astype(dtype))
        results[dtype] = (out.data, x.grad)
    for half, full in zip(results["float16"], results["float32"]):
        assert half.dtype == np.float16
        np.testing.assert_array_equal(half.view(np.uint16), full.astype(np.float16).view(np.uint16))


def test_exact_to_half_encodes_every_float16_value():
    h = np.random.default_rng(6).permutation(ALL_HALF_CODES).view(np.float16)
    np.testing.assert_array_equal(
        _exact_to_half(h.astype(np.float32)).view(np.uint16), h.astype(np.float32).astype(np.float16).view(np.uint16)
    )


def test_roundings_of_relu_like_data_with_many_zeros_of_both_signs():
    rng = np.random.default_rng(7)
    x = rng.standard_normal(8192).astype(np.float32)
    x[x < 0] = 0.0
    x[rng.choice(8192, 500, replace=False)] = -0.0
    x[rng.choice(8192, 5, replace=False)] = [3e-6, -4e-7, 2**-25, -(2**-24) * 1.5, 2**-14 * 0.75]
    assert_rounds_like_astype(x)


@pytest.mark.parametrize("tiny_count", [0, 5, 2000])
def test_roundings_with_few_or_many_values_below_the_float16_normals(tiny_count):
    # Values below 2**-14 (and zeros), where the fast rounding is not
    # float16's: NumPy redoes a few, the general path takes over for many;
    # with none the fast path stands alone.
    rng = np.random.default_rng(4)
    x = rng.standard_normal(4096).astype(np.float32)
    x[np.abs(x) < 2**-14] = 0.5
    x[:6] = [2049.0, 2051.0, 1 + 2**-11, -(1 + 3 * 2**-11), 65504.0, 65519.0]
    idx = rng.choice(np.arange(8, 4096), size=tiny_count, replace=False)
    x[idx] = rng.uniform(-(2**-14), 2**-14, size=tiny_count).astype(np.float32)
    if tiny_count:
        x[idx[:4]] = [2**-25, -3 * 2**-25, 0.0, -0.0]  # ties at the smallest subnormal; signed zeros
    assert_rounds_like_astype(x)


def test_half_to_float_fast_path_keeps_inf_nan_and_layout():
    h = ALL_HALF_CODES.view(np.float16).reshape(256, 256)[:, ::3]  # strided, with inf/NaN codes
    np.testing.assert_array_equal(_half_to_float(h).view(np.uint32), h.astype(np.float32).view(np.uint32))


def test_float_to_half_takes_numpys_cast_only_when_the_sample_has_no_small_values(monkeypatch, converter):
    # Both paths are exact; which one runs is a speed decision. Normal-range
    # data goes to astype, data with zeros or subnormals in the sample to the
    # arithmetic path (NumPy is slow on those), and the result is astype's.
    import everyo.half as half

    calls = []
    own = half._float_to_half_own
    monkeypatch.setattr(half, "_float_to_half_own", lambda x: calls.append(x.size) or own(x))
    if converter == "kernels":
        pytest.skip("with everyo-kernels the compiled conversion runs, whatever the sample")
    monkeypatch.setattr(half, "_kernel", None)  # the choice made without a converter installed
    rng = np.random.default_rng(3)
    normal = (rng.standard_normal(4096).astype(np.float32) + np.float32(8.0)).astype(np.float32)
    relu = np.maximum(rng.standard_normal(4096).astype(np.float32), np.float32(0.0))
    tiny = (rng.standard_normal(4096) * 1e-6).astype(np.float32)
    few = normal.copy()
    few[::500] = 0.0  # one zero in 500: still NumPy's
    for x in (normal, relu, tiny, normal[::2], few):
        np.testing.assert_array_equal(half._float_to_half(x).view(np.uint16), x.astype(np.float16).view(np.uint16))
    assert calls == [4096, 4096, 2048]  # relu, tiny, and the strided one


def test_large_arrays_are_converted_block_by_block_with_the_same_bits():
    # Large arrays go through the conversions in L2-sized blocks (everyo.half._BLOCK); each
    # block picks its own path (fast, a few redone, general, specials), and the
    # whole must still be astype's, bit for bit, including a last partial block.
    from everyo.half import _BLOCK

    rng = np.random.default_rng(11)
    n = 5 * _BLOCK + 123
    x = rng.standard_normal(n).astype(np.float32)
    x[_BLOCK : 2 * _BLOCK] *= np.float32(1e-5)  # block 1: many float16 subnormals (general path)
    x[2 * _BLOCK : 3 * _BLOCK : 7] = 0.0  # block 2: ReLU-like zeros of both signs
    x[2 * _BLOCK + 3 : 3 * _BLOCK : 11] = -0.0
    specials = [np.nan, np.inf, -7e4, 65520.0, 2**-25, -(2**-24) * 1.5]  # block 3: overflow, inf, NaN, a few tiny
    x[3 * _BLOCK + 5 + 9973 * np.arange(len(specials))] = specials
    x[-3:] = [2049.0, 1 + 2**-11, 2**-14 * 0.75]  # the partial last block
    assert_rounds_like_astype(x)
    assert_rounds_like_astype(x.reshape(-1, 1)[::2])  # strided and 2-D: made contiguous, shape kept
