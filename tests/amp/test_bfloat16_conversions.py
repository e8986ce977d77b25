"""Core's bfloat16 conversions (everyo.half, no ml_dtypes import there) are
bit-identical to ml_dtypes' astype: every code up, a dense float32 sample down."""

import numpy as np
import pytest

ml_dtypes = pytest.importorskip("ml_dtypes")

from everyo import casting, half  # noqa: E402

BF16 = np.dtype(ml_dtypes.bfloat16)


def dense_float32_sample():
    """Every bfloat16 code as the top half, with low halves that probe the rounding:
    zero, one ulp, just below / exactly at / just above the tie, all ones; plus random bits.
    Covers ties both ways, float32 subnormals, the overflow to inf, inf and NaNs of every kind."""
    top = np.arange(2**16, dtype=np.uint32) << 16
    low = np.array([0, 1, 0x7FFF, 0x8000, 0x8001, 0xC000, 0xFFFF], np.uint32)
    structured = (top[:, None] | low[None, :]).reshape(-1)
    rng = np.random.default_rng(0)
    random = rng.integers(0, 2**32, size=1_000_000, dtype=np.uint64).astype(np.uint32)
    return np.concatenate([structured, random]).view(np.float32)


def reference_down(x):
    with np.errstate(invalid="ignore"):  # ml_dtypes warns on signalling NaNs
        return x.astype(BF16)


def test_up_conversion_is_exact_for_all_2_16_codes():
    b = np.arange(2**16, dtype=np.uint16).view(BF16)
    ours = casting.convert(b, np.float32)
    assert ours.dtype == np.float32
    assert np.array_equal(ours.view(np.uint32), b.astype(np.float32).view(np.uint32))


def test_down_conversion_matches_ml_dtypes_bit_for_bit():
    x = dense_float32_sample()
    ours = casting.convert(x, BF16)
    assert ours.dtype == BF16
    ref = reference_down(x)
    mismatch = np.flatnonzero(ours.view(np.uint16) != ref.view(np.uint16))
    assert mismatch.size == 0, [hex(v) for v in x.view(np.uint32)[mismatch[:5]]]


def test_ties_go_to_even_and_nan_stays_quiet_with_its_sign():
    bits = np.array(
        [
            0x3F808000,  # 1 + 2**-8: a tie, the kept bit is even -> down
            0x3F818000,  # a tie with the kept bit odd -> up
            0x7F7FFFFF,  # float32 max -> inf
            0x7F800001,  # signalling NaN -> quiet
            0xFFFFFFFF,  # negative NaN with a full payload: a naive carry would wrap to +0
            0x00000001,
        ],  # the smallest float32 subnormal -> +0
        np.uint32,
    )
    out = casting.convert(bits.view(np.float32), BF16).view(np.uint16)
    assert [hex(v) for v in out] == ["0x3f80", "0x3f82", "0x7f80", "0x7fc0", "0xffc0", "0x0"]


def test_rounding_kept_in_float32_and_its_exact_encoding():
    x = dense_float32_sample()
    ref = reference_down(x)
    kept = half._round_to_bfloat16(x)
    assert kept.dtype == np.float32
    assert np.array_equal(kept.view(np.uint32), ref.astype(np.float32).view(np.uint32))
    assert np.array_equal(half._exact_to_bfloat16(kept, BF16).view(np.uint16), ref.view(np.uint16))
    deferred = half._rounded(x, BF16)
    assert deferred.dtype == BF16 and np.array_equal(deferred.materialize().view(np.uint16), ref.view(np.uint16))


def test_shapes_and_non_contiguous_input_kept():
    x = np.random.default_rng(1).standard_normal((6, 10)).astype(np.float32)[:, ::3]
    out = casting.convert(x, BF16)
    assert out.shape == (6, 4)
    assert np.array_equal(out.view(np.uint16), reference_down(x).view(np.uint16))
    assert np.array_equal(casting.convert(out, np.float32), out.astype(np.float32))


def test_core_recognises_bfloat16_by_name():
    assert half.is_bfloat16(BF16) and half.is_low_precision(BF16) and casting.is_floating(BF16)
    assert not half.is_bfloat16(np.dtype("V2")) and not half.is_bfloat16(np.dtype(np.float16))
    assert half.is_low_precision(np.dtype(np.float16)) and not half.is_low_precision(np.dtype(np.float32))


def test_checkpoints_keep_bfloat16(tmp_path):
    import everyo as eo

    codes = np.arange(0, 2**16, 7, dtype=np.uint16)
    state = {"w": codes.view(BF16).reshape(-1, 1), "scalar": codes.view(BF16)[3], "f": np.ones(2, np.float32)}
    eo.save(state, tmp_path / "bf16.npz")
    back = eo.load(tmp_path / "bf16.npz")
    assert back["w"].dtype == BF16 and back["w"].shape == state["w"].shape
    assert np.array_equal(back["w"].view(np.uint16), state["w"].view(np.uint16))
    assert back["scalar"].dtype == BF16 and back["scalar"].view(np.uint16) == state["scalar"].view(np.uint16)
    assert back["f"].dtype == np.float32
