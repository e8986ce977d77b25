"""The float16 conversion kernels against NumPy's ``astype`` and core's NumPy paths:
every float16 code going up; going down and rounding, every boundary (each float16
value's neighbourhood, the exact ties between neighbours and the float32 values either
side of them, the subnormal thresholds, 65504/65520, zeros, inf, NaN payloads, float32
subnormals) and random bit patterns, bit for bit for every value float16 holds finitely;
the reported largest magnitude that core uses to redo the rest; and core's conversions,
which use the kernels, bit for bit astype's on everything (warnings included)."""

import numpy as np
import pytest
from conftest import count_calls

from everyo import half, kernel_table
from everyo.kernels import float16

# Both implementations of the exported kernels: the integer loops, and the loops around the
# CPU's own float16 conversions (F16C), which the module exports where the CPU has them.
IMPLEMENTATIONS = [
    pytest.param("bits", id="integer"),
    pytest.param("f16c", id="f16c", marks=pytest.mark.skipif(not float16.F16C, reason="no F16C on this CPU")),
]


@pytest.fixture(params=IMPLEMENTATIONS)
def impl(request):
    return {
        name: getattr(float16, f"{name}_{request.param}") for name in ("half_codes", "round_to_half", "half_to_float")
    }


NAMES = ("half_codes", "round_to_half", "half_to_float")
LIMIT = 0x477FF000  # 65520.0's bits: from here on core redoes the values with NumPy


def _boundary_bits():
    """float32 bit patterns at every place where rounding to float16 changes."""
    codes = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    finite = codes.view(np.float16)[np.isfinite(codes.view(np.float16))]
    around = finite.astype(np.float32).view(np.uint32).astype(np.int64)
    parts = [around + d for d in range(-3, 4)]
    # the exact midpoints to both neighbours and one and two float32 ulps either side: where the
    # float16 spacing is 2**13 float32 ulps (normals) the midpoint is 4096 ulps away; all midpoints,
    # subnormal ones included, are also computed from consecutive codes (same sign: neighbours)
    for d in (-4096, 4096):
        parts += [around + d + e for e in (-2, -1, 0, 1, 2)]
    mid = ((finite[:-1].astype(np.float64) + finite[1:].astype(np.float64)) / 2).astype(np.float32)
    mid_bits = mid.view(np.uint32).astype(np.int64)
    parts += [mid_bits + e for e in (-2, -1, 0, 1, 2)]
    special = np.array(
        [
            0x00000000,
            0x80000000,
            0x00000001,
            0x80000001,
            0x007FFFFF,
            0x807FFFFF,
            0x00800000,  # zeros, float32 subnormals
            0x33000000,
            0x33000001,
            0x32FFFFFF,
            0xB3000000,  # 2**-25: half the smallest float16 subnormal (ties to 0)
            0x33800000,
            0x33C00000,
            0x33BFFFFF,
            0x33C00001,  # 2**-24 and 1.5 * 2**-24 (tie to even: 2**-23)
            0x387FC000,
            0x387FDFFF,
            0x387FE000,
            0x387FE001,
            0x387FFFFF,
            0x38800000,  # up to the smallest normal
            0x477FE000,
            0x477FEFFF,
            0x477FF000,
            0x477FF001,
            0x477FFFFF,
            0x47800000,  # 65504, 65520, 65536
            0xC77FEFFF,
            0xC77FF000,
            0x7F7FFFFF,
            0xFF7FFFFF,  # the largest float32
            0x7F800000,
            0xFF800000,
            0x7FC00000,
            0xFFC00000,
            0x7F800001,
            0x7FA00001,
            0xFFC00123,
            0x7FFFFFFF,
            0xFFFFFFFF,
        ],
        np.int64,
    )
    rng = np.random.default_rng(0)
    parts += [special, rng.integers(0, 2**32, 1_000_000, dtype=np.int64)]
    return np.concatenate(parts).clip(0, 2**32 - 1).astype(np.uint32)


@pytest.fixture(scope="module")
def bits():
    return _boundary_bits()


def _astype_codes(x):
    with np.errstate(all="ignore"):
        return x.astype(np.float16).view(np.uint16)


def test_every_float16_code_goes_up_exactly(impl):
    half_to_float = impl["half_to_float"]
    codes = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    out = np.empty(codes.size, np.uint32)
    half_to_float(codes, out)
    # NaN payloads and signalling NaNs included: NumPy keeps them too
    np.testing.assert_array_equal(out, codes.view(np.float16).astype(np.float32).view(np.uint32))


def test_down_is_astype_for_every_value_float16_holds_finitely(bits, impl):
    half_codes = impl["half_codes"]
    x = bits.view(np.float32)
    out = np.empty(bits.size, np.uint16)
    top = half_codes(bits, out)
    finite = np.abs(x) < np.float32(65520.0)
    assert finite.sum() > 1_000_000 and (~finite).sum() > 100
    np.testing.assert_array_equal(out[finite], _astype_codes(x)[finite])
    assert top == (bits & np.uint32(0x7FFFFFFF)).max()
    # what the kernel writes for [65504 + 8, 65520) is astype's too: it carries into inf's code
    near = (np.abs(x) >= np.float32(65512.0)) & finite
    assert near.any() and (out[near] & 0x7FFF == 0x7BFF).all()  # they round to 65504 ...
    assert ((out[np.abs(x) == np.float32(65520.0)] & 0x7FFF) == 0x7C00).all()  # ... and 65520 to inf


def test_round_is_down_and_up_for_every_value_float16_holds_finitely(bits, impl):
    round_to_half = impl["round_to_half"]
    x = bits.view(np.float32)
    out = np.empty(bits.size, np.uint32)
    top = round_to_half(bits, out)
    finite = np.abs(x) < np.float32(65520.0)
    with np.errstate(all="ignore"):
        want = x.astype(np.float16).astype(np.float32).view(np.uint32)
    np.testing.assert_array_equal(out[finite], want[finite])
    assert top == (bits & np.uint32(0x7FFFFFFF)).max()


@pytest.mark.parametrize("spot", [0x477FF000, 0x7F800000, 0x7FC00000, 0xFF800001, 0xC77FFFFF])
def test_the_largest_magnitude_flags_what_core_redoes(spot, impl):
    half_codes, round_to_half = impl["half_codes"], impl["round_to_half"]
    bits = np.full(5000, 0x3F800000, np.uint32)  # ones
    for kernel, dtype in ((half_codes, np.uint16), (round_to_half, np.uint32)):
        assert kernel(bits, np.empty(bits.size, dtype)) < LIMIT
        flagged = bits.copy()
        flagged[1234] = spot
        assert kernel(flagged, np.empty(bits.size, dtype)) >= LIMIT
    just_below = bits.copy()
    just_below[7] = 0xC77FEFFF  # -65519.996: float16 holds it (as -65504)
    assert half_codes(just_below, np.empty(bits.size, np.uint16)) < LIMIT


def test_the_exported_kernels_are_this_cpus():
    kind = "f16c" if float16.F16C else "bits"
    for name in ("half_codes", "round_to_half", "half_to_float"):
        assert getattr(float16, name) is getattr(float16, f"{name}_{kind}")


def _same_bits(a, b):
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and np.array_equal(a.reshape(-1).view(np.uint8), b.reshape(-1).view(np.uint8))
    )


def test_core_conversions_use_the_kernels_and_stay_astypes(monkeypatch, bits):
    x = bits.view(np.float32)
    with np.errstate(all="ignore"):
        want = x.astype(np.float16)
        want_up = want.astype(np.float32)
        with kernel_table.disabled():
            numpy_path = half._float_to_half(x), half._round_to_half(x), half._half_to_float(want)
    calls = count_calls(monkeypatch, NAMES)
    with np.errstate(all="ignore"):
        got = half._float_to_half(x), half._round_to_half(x), half._half_to_float(want)
        exact = half._exact_to_half(want_up)
    assert calls == dict.fromkeys(NAMES, 1) | {"half_codes": 2}
    assert _same_bits(got[0], want) and _same_bits(exact, want)
    assert _same_bits(got[1], want_up) and _same_bits(got[2], want_up)
    assert all(_same_bits(g, n) for g, n in zip(got, numpy_path))


def test_overflow_warning_and_errstate_stay_numpys():
    x = np.linspace(-7e4, 7e4, 10_001, dtype=np.float32)
    with pytest.warns(RuntimeWarning, match="overflow"):
        half._float_to_half(x)
    with np.errstate(over="raise"), pytest.raises(FloatingPointError):
        half._round_to_half(x)
    with np.errstate(over="ignore"):
        assert _same_bits(half._float_to_half(x), x.astype(np.float16))


@pytest.mark.parametrize("seed", range(4))
def test_strided_shaped_and_small_operands(seed):
    rng = np.random.default_rng(seed)
    shape = tuple(int(n) for n in rng.integers(1, 40, rng.integers(1, 4)))
    base = (rng.standard_normal(2 * int(np.prod(shape))) * 10.0 ** rng.integers(-9, 4)).astype(np.float32)
    base[::7] = 0.0
    x = base[::2].reshape(shape)  # every other value: not contiguous
    if x.ndim > 1:
        x = x.swapaxes(0, -1)
    h = x.astype(np.float16)
    assert _same_bits(half._float_to_half(x), h)
    assert _same_bits(half._round_to_half(x), h.astype(np.float32))
    assert _same_bits(half._half_to_float(h[..., ::-1]), h[..., ::-1].astype(np.float32))
    assert _same_bits(half._exact_to_half(h.astype(np.float32)), h)


def test_float16_training_identical_with_and_without_kernels():
    amp = pytest.importorskip("everyo.amp")
    import everyo as eo

    rng = np.random.default_rng(1)
    x = eo.tensor(rng.standard_normal((256, 16)).astype(np.float32))
    y = eo.tensor(rng.standard_normal((256, 1)).astype(np.float32))
    weights = []
    for off in (True, False):
        model = eo.Sequential(eo.Linear(16, 32, seed=0), eo.ReLU(), eo.Linear(32, 1, seed=1))
        opt = eo.SGD(model.parameters(), lr=0.05)
        scaler = eo.GradScaler()
        with kernel_table.disabled() if off else np.errstate():
            for _ in range(3):
                opt.zero_grad()
                with amp.autocast(dtype="float16"):
                    out = model(x)
                scaler.backward(eo.mse_loss(out, y))
                scaler.step(opt)
                scaler.update()
        weights.append([p.data.copy() for p in model.parameters()])
    assert all(_same_bits(a, b) for a, b in zip(*weights))


def test_cast_backend_names_the_kernels():
    amp = pytest.importorskip("everyo.amp")
    assert amp.cast_backend().startswith("everyo-kernels' one-pass conversions"), amp.cast_backend()
