"""reduce_in_rank_order (shared by every backend) against a plain float64 loop, edge cases included.

The reduction has shortcuts (two ranks: one addition in the input dtype;
power-of-two ranks: multiply instead of divide) that must give exactly the
bits of float64 accumulation in rank order, rounded once. No processes here.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from everyo.distributed import reduce_in_rank_order


def float64_reference(inputs, op):
    acc = inputs[0].astype(np.float64)
    for x in inputs[1:]:
        acc = acc + x.astype(np.float64)
    if op == "mean":
        acc = acc / len(inputs)
    with np.errstate(over="ignore"):
        return acc.astype(inputs[0].dtype)


def edge_values(dtype):
    info = np.finfo(dtype)
    tiny, sub = info.tiny, info.smallest_subnormal
    values = [
        0.0,
        -0.0,
        1.0,
        -1.0,
        info.max,
        -info.max,
        info.max / 2,
        tiny,
        -tiny,
        tiny * 2,
        sub,
        -sub,
        sub * 3,
        tiny - sub,
        np.inf,
        -np.inf,
        np.nan,
        1.0 + info.eps,
        2.0 ** (info.nmant + 1),
        1.0 / 3,
        info.eps / 2,
        1e-3,
        12345.678,
    ]
    return np.array(values, dtype=dtype)


def assert_same_bits(got, expected):
    assert got.dtype == expected.dtype and got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)  # NaN == NaN here
    np.testing.assert_array_equal(np.signbit(got), np.signbit(expected))  # -0.0 vs 0.0


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("op", ["sum", "mean"])
def test_every_pair_of_edge_values(dtype, world, op):
    edges = edge_values(dtype)
    # All ordered pairs (for world > 2 the other ranks get shifted copies).
    a, b = np.meshgrid(edges, edges)
    inputs = [a.ravel(), b.ravel()] + [np.roll(b.ravel(), k) for k in range(1, world - 1)]
    inputs = inputs[:world]
    with np.errstate(all="ignore"):
        assert_same_bits(reduce_in_rank_order(inputs, op), float64_reference(inputs, op))
        # Longer, with edge values straddling the block edges.
        long_inputs = [np.tile(x, 13) for x in inputs]
        assert_same_bits(reduce_in_rank_order(long_inputs, op, block=1000), float64_reference(long_inputs, op))


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), exponent_range=st.integers(0, 40))
def test_two_rank_float32_mean_on_wide_ranges(seed, exponent_range):
    # Magnitudes from 2**-149 (subnormal) to 2**127: overflowing sums, subnormal halves.
    rng = np.random.default_rng(seed)
    n = 6000
    exponents = rng.integers(-150 + exponent_range, 128 - exponent_range, size=(2, n))
    with np.errstate(all="ignore"):
        inputs = [
            (rng.uniform(-2, 2, n) * np.exp2(exponents[r].astype(np.float64))).astype(np.float32) for r in range(2)
        ]
        assert_same_bits(reduce_in_rank_order(inputs, "mean", block=2048), float64_reference(inputs, "mean"))


def test_two_rank_mean_with_aliased_output():
    a = np.linspace(-1, 1, 5000, dtype=np.float32)
    b = np.full(5000, 3.0, np.float32)
    expected = float64_reference([a, b], "mean")
    assert_same_bits(reduce_in_rank_order([a, b], "mean", out=a), expected)


@settings(max_examples=60, deadline=None)
@given(
    data=st.data(),
    dtype=st.sampled_from(["float16", "float32", "float64"]),
    world=st.integers(1, 5),
    op=st.sampled_from(["sum", "mean"]),
)
def test_random_arrays(data, dtype, world, op):
    n = data.draw(st.integers(0, 300))
    seed = data.draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    scale = 10.0 ** rng.integers(-6, 6, size=(world, n))
    with np.errstate(all="ignore"):
        inputs = [(rng.standard_normal(n) * scale[r]).astype(dtype) for r in range(world)]
        # Small blocks so the block loop's boundaries are exercised too.
        assert_same_bits(reduce_in_rank_order(inputs, op, block=64), float64_reference(inputs, op))


def test_float64_accumulation_beats_input_dtype_accumulation():
    inputs = [np.array([1.0], np.float32), np.array([2.0**30], np.float32), np.array([-(2.0**30)], np.float32)]
    assert reduce_in_rank_order(inputs, "sum")[0] == 1.0  # float32 running sum: 0.0


@pytest.mark.parametrize("dtype", ["int8", "int32", "int64", "uint8", "uint64"])
def test_integers_sum_exactly_in_64_bits(dtype):
    info = np.iinfo(dtype)
    inputs = [np.array([info.max, 1, info.min], dtype), np.array([0, 2, 0], dtype), np.array([0, 3, 0], dtype)]
    expected = inputs[0].astype(object) + inputs[1].astype(object) + inputs[2].astype(object)
    got = reduce_in_rank_order(inputs, "sum")
    assert got.dtype == np.dtype(dtype)
    assert got.tolist() == [int(v) for v in expected]


def test_out_and_shape():
    inputs = [np.ones((2, 3), np.float32), np.full((2, 3), 2, np.float32), np.zeros((2, 3), np.float32)]
    out = np.empty((2, 3), np.float32)
    assert reduce_in_rank_order(inputs, "mean", out=out) is out
    np.testing.assert_array_equal(out, np.ones((2, 3)))
    with pytest.raises(ValueError, match="unknown reduction 'max'"):
        reduce_in_rank_order(inputs, "max")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_two_rank_mean_falls_back_whole_when_a_later_block_overflows(dtype):
    # The two-rank mean works in blocks and learns of an overflow from the IEEE flag: an overflow
    # (or inf - inf) in a later block must still recompute the whole array in float64, and NaN
    # inputs must give the float64 path's very bits (payload and sign included).
    block = 4096
    info = np.finfo(dtype)
    n = 2 * block + 5
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal(n).astype(dtype) for _ in range(2))
    nan_bits = np.array(np.nan, dtype).view(np.uint32 if dtype == "float32" else np.uint64)
    payload_nan = (nan_bits | 0x5).view(dtype)  # a quiet NaN with a payload
    a[7], b[7] = -payload_nan, 1.0
    b[8] = payload_nan
    for where, (x, y) in ((block + 3, (info.max, info.max)), (2 * block + 1, (np.inf, -np.inf))):
        a2, b2 = a.copy(), b.copy()
        a2[where], b2[where] = x, y
        with np.errstate(all="ignore"):  # the float64 fallback warns of inf - inf as NumPy does
            expected = float64_reference([a2, b2], "mean")
            got = reduce_in_rank_order([a2, b2], "mean", block=block)
        assert_same_bits(got, expected)
        np.testing.assert_array_equal(got.view(nan_bits.dtype), expected.view(nan_bits.dtype))
        if x == info.max and dtype == "float32":
            assert got[where] == info.max  # finite in float64; a float32 add would have said inf
    with np.errstate(all="ignore"):
        expected = float64_reference([a, b], "mean")
    got = reduce_in_rank_order([a, b], "mean", block=block)  # no overflow: the blocked float32 path throughout
    np.testing.assert_array_equal(got.view(nan_bits.dtype), expected.view(nan_bits.dtype))
