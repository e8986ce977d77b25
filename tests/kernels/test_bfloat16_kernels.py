"""The bfloat16 conversion kernels against core's NumPy conversions and
ml_dtypes' ``astype``: bit-identical on random, strided and special values
(every bfloat16 code going up; NaN payloads, infs, -0, subnormals, the
largest finite values that round into inf, ties going down)."""

import numpy as np
import pytest
from conftest import count_calls

from everyo import half, kernel_table

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = np.dtype(ml_dtypes.bfloat16)
DOWN = ("bfloat16_codes", "round_to_bfloat16")


def _hard_values(rng):
    """float32 values where rounding to bfloat16 is delicate, plus random ones."""
    bits = np.concatenate(
        [
            rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32),  # any bits: NaNs with payloads too
            (rng.integers(0, 2**16, 20_000, dtype=np.uint32) << 16) | np.uint32(0x8000),  # exact ties
            (rng.integers(0, 2**16, 20_000, dtype=np.uint32) << 16) | np.uint32(0x7FFF),  # just below a tie
            np.array([0x7F7FFFFF, 0xFF7FFFFF, 0x7F7F8000, 0x7F7F7FFF], np.uint32),  # the largest finites
            np.array([0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00001, 0x7F800001, 0xFFBFFFFF], np.uint32),
            np.array([0x00000001, 0x80000001, 0x00008000, 0x00018000, 0x007FFFFF, 0x80000000, 0], np.uint32),
        ]
    )
    return bits.view(np.float32)


def _same_bits(a, b):
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and np.array_equal(a.reshape(-1).view(np.uint8), b.reshape(-1).view(np.uint8))
    )


def test_down_matches_numpy_path_and_ml_dtypes(monkeypatch):
    x = _hard_values(np.random.default_rng(0))
    with kernel_table.disabled():
        codes_np, rounded_np = half._float_to_bfloat16(x, BF16), half._round_to_bfloat16(x)
    calls = count_calls(monkeypatch, DOWN)
    codes, rounded = half._float_to_bfloat16(x, BF16), half._round_to_bfloat16(x)
    assert calls == dict.fromkeys(DOWN, 1)
    assert _same_bits(codes, codes_np) and _same_bits(rounded, rounded_np)
    with np.errstate(all="ignore"):
        assert _same_bits(codes, x.astype(BF16))


def test_every_code_goes_up_exactly(monkeypatch):
    codes = np.arange(2**16, dtype=np.uint16).view(BF16)
    with kernel_table.disabled():
        want = half._bfloat16_to_float(codes)
    calls = count_calls(monkeypatch, ("bfloat16_to_float",))
    got = half._bfloat16_to_float(codes)
    assert calls["bfloat16_to_float"] == 1
    assert _same_bits(got, want) and _same_bits(got, codes.astype(np.float32))


@pytest.mark.parametrize("seed", range(4))
def test_strided_and_shaped_operands(seed):
    rng = np.random.default_rng(seed)
    shape = tuple(int(n) for n in rng.integers(1, 7, rng.integers(1, 4)))
    base = _hard_values(rng)[: 2 * int(np.prod(shape)) * 3].reshape(-1)
    x = base[: 2 * int(np.prod(shape))][::2].reshape(shape)  # every other value: not contiguous
    if x.ndim > 1:
        x = x.swapaxes(0, -1)
    with kernel_table.disabled():
        want = half._float_to_bfloat16(x, BF16), half._round_to_bfloat16(x)
    got = half._float_to_bfloat16(x, BF16), half._round_to_bfloat16(x)
    assert all(_same_bits(g, w) for g, w in zip(got, want))
    codes = want[0][..., ::-1]
    with kernel_table.disabled():
        up_want = half._bfloat16_to_float(codes)
    assert _same_bits(half._bfloat16_to_float(codes), up_want)


def test_empty_and_scalar():
    for x in (np.zeros((0, 3), np.float32), np.float32(1.00390625), np.array(-2.5e-39, np.float32)):
        with kernel_table.disabled():
            want = half._round_to_bfloat16(x)
        assert _same_bits(np.asarray(half._round_to_bfloat16(x)), np.asarray(want))


def test_bfloat16_training_identical_with_and_without_kernels():
    amp = pytest.importorskip("everyo.amp")
    import everyo as eo

    rng = np.random.default_rng(1)
    x = eo.tensor(rng.standard_normal((256, 16)).astype(np.float32))
    y = eo.tensor(rng.standard_normal((256, 1)).astype(np.float32))
    weights = []
    for off in (True, False):
        model = eo.Sequential(eo.Linear(16, 32, seed=0), eo.ReLU(), eo.Linear(32, 1, seed=1))
        opt = eo.SGD(model.parameters(), lr=0.05)
        with kernel_table.disabled() if off else np.errstate():
            for _ in range(3):
                opt.zero_grad()
                with amp.autocast(dtype="bfloat16"):
                    out = model(x)
                eo.mse_loss(out, y).backward()
                opt.step()
        weights.append([p.data.copy() for p in model.parameters()])
    assert all(_same_bits(a, b) for a, b in zip(*weights))
