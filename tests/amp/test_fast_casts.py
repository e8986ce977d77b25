"""everyo.amp.fast_casts: onnxruntime's Cast as core's float16 converter, checked, and never a different bit.

The bit-for-bit conversion tests of test_float16_paths.py run with this
converter installed and without it; here: that importing everyo.amp installs
it, that it is really used (and is faster than NumPy, measured only as a
sanity ratio in the benchmark, never here), that a converter which disagrees
with NumPy is refused, that EVERYO_AMP_CASTS=numpy keeps NumPy's, and that the
floating-point environment is untouched.
"""

import os
import subprocess
import sys

import numpy as np
import pytest

import everyo.amp
import everyo.half as half
from everyo import kernel_table
from everyo.amp.fast_casts import _CASTS, OnnxRuntimeCasts


@pytest.fixture(autouse=True)
def _converter_not_compiled_kernels():
    """With everyo-kernels active its one-pass conversions come before any installed
    converter (everyo.half); these tests are about the converter: kernels off."""
    with kernel_table.disabled():
        yield


def test_importing_amp_installs_the_checked_onnxruntime_converter():
    assert half._kernel is _CASTS
    x = np.random.default_rng(0).standard_normal(50_000).astype(np.float32)
    np.testing.assert_array_equal(half._float_to_half(x).view(np.uint16), x.astype(np.float16).view(np.uint16))
    # onnxruntime is a dependency of this test cell: the converter must have passed its check
    assert everyo.amp.cast_backend().startswith("onnxruntime "), everyo.amp.cast_backend()


def test_the_converter_is_what_converts_large_arrays(monkeypatch):
    calls = []
    for name in ("down", "up"):
        original = getattr(_CASTS, name)
        monkeypatch.setattr(_CASTS, name, lambda a, _f=original, _n=name: calls.append((_n, a.size)) or _f(a))
    x = np.random.default_rng(1).standard_normal((64, 128)).astype(np.float32)
    h = half._float_to_half(x)
    half._half_to_float(h)
    half._round_to_half(x)
    half._float_to_half(x[:8])  # small: NumPy's own astype, no converter call
    # rounding: down, then up of the codes just checked
    assert calls == [("down", 8192), ("up", 8192), ("down", 8192), ("up", 8192)]


class _Lying:
    """A session whose float16 results are off by one code: the self-check must refuse it."""

    def run(self, _outputs, feeds):
        x = feeds["x"]
        if x.dtype == np.float32:
            h = x.astype(np.float16)
            h.view(np.uint16)[::997] ^= 1
            return [h]
        return [x.astype(np.float32)]


def test_a_converter_that_differs_from_numpy_by_one_bit_is_refused(monkeypatch):
    casts = OnnxRuntimeCasts()
    monkeypatch.setattr(OnnxRuntimeCasts, "_build", staticmethod(lambda: (_Lying(), _Lying())))
    x = np.ones(10_000, np.float32)
    assert casts.down(x) is None and casts.up(x.astype(np.float16)) is None
    assert casts.failed and "differs from NumPy's astype" in casts.status
    # installed in core, it is declined, and core's own conversion gives astype's bits
    previous = half.set_cast_kernel(casts)
    try:
        y = np.random.default_rng(2).standard_normal(10_000).astype(np.float32)
        np.testing.assert_array_equal(half._float_to_half(y).view(np.uint16), y.astype(np.float16).view(np.uint16))
    finally:
        half.set_cast_kernel(previous)


def test_an_onnxruntime_that_will_not_import_means_numpy(monkeypatch):
    casts = OnnxRuntimeCasts()
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import raises ImportError
    assert casts.down(np.ones(5000, np.float32)) is None
    assert casts.failed and casts.status.startswith("numpy (onnxruntime casts unavailable: ModuleNotFoundError")


def test_importing_amp_does_not_import_onnxruntime():
    code = "import sys, everyo as eo, everyo.amp; print('onnxruntime' in sys.modules, everyo.amp.cast_backend())"
    env = {**os.environ, "EVERYO_KERNELS": "0"}  # with them, cast_backend names everyo-kernels
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("False not used yet"), out.stdout


def test_environment_variable_keeps_numpys_conversions():
    code = (
        "import everyo.amp, everyo.half as h, numpy as np;"
        "x = np.ones(10000, np.float32); h._float_to_half(x);"
        "print(h._kernel is None, everyo.amp.cast_backend())"
    )
    env = {**os.environ, "EVERYO_AMP_CASTS": "numpy", "EVERYO_KERNELS": "0"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True numpy (EVERYO_AMP_CASTS=numpy)"


def test_onnxruntime_leaves_this_threads_floating_point_mode_alone():
    x = np.random.default_rng(3).standard_normal(20_000).astype(np.float32)
    half._round_to_half(x)
    assert half._kernel is _CASTS and not _CASTS.failed
    tiny = np.array([1e-40, 2.0**-149], np.float32)  # float32 subnormals: flushed under FTZ/DAZ
    assert ((tiny * np.float32(1.0)) == tiny).all() and (tiny / np.float32(2.0))[0] > 0


@pytest.mark.parametrize("n", [4096, 4097, 300_001])
def test_specials_are_numpys_whatever_the_converter_says(n):
    # inf, NaN (with payloads, signalling too) and overflow: core redoes them with NumPy, so the
    # codes, the float32 values and the overflow warning are astype's.
    rng = np.random.default_rng(n)
    x = rng.standard_normal(n).astype(np.float32)
    payload_nan = np.array([0x7FA00001, 0xFF800003], np.uint32).view(np.float32)  # signalling NaNs
    x[[1, 7, n // 2, n - 2]] = [np.inf, -np.inf, 1e6, -65520.0]
    x[[3, n - 1]] = payload_nan
    with pytest.warns(RuntimeWarning, match="overflow"):
        expected = x.astype(np.float16)
    with pytest.warns(RuntimeWarning, match="overflow"):
        got = half._float_to_half(x)
    np.testing.assert_array_equal(got.view(np.uint16), expected.view(np.uint16))
    with np.errstate(over="ignore"):
        kept = half._round_to_half(x)
    np.testing.assert_array_equal(kept.view(np.uint32), expected.astype(np.float32).view(np.uint32))
    codes = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    np.testing.assert_array_equal(half._half_to_float(codes).view(np.uint32), codes.astype(np.float32).view(np.uint32))


def test_threads_converting_at_once_all_get_astypes_bits():
    import threading

    rng = np.random.default_rng(4)
    arrays = [rng.standard_normal(30_000 + 1000 * k).astype(np.float32) * np.float32(10.0**-k) for k in range(6)]
    wrong = []

    def work(x):
        for _ in range(20):
            h = half._float_to_half(x)
            if not np.array_equal(h.view(np.uint16), x.astype(np.float16).view(np.uint16)):
                wrong.append("down")
            if not np.array_equal(half._half_to_float(h).view(np.uint32), h.astype(np.float32).view(np.uint32)):
                wrong.append("up")

    threads = [threading.Thread(target=work, args=(x,)) for x in arrays]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert half._kernel is _CASTS and not _CASTS.failed
    assert not wrong and not any(t.is_alive() for t in threads)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX-only")
def test_a_forked_child_builds_its_own_sessions_and_converts_exactly():
    half._float_to_half(np.ones(10_000, np.float32))  # the parent's sessions exist
    assert _CASTS._sessions is not None
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, never return into pytest
        ok = 0
        try:
            fresh = _CASTS._sessions is None
            x = np.random.default_rng(5).standard_normal(20_000).astype(np.float32)
            same = np.array_equal(half._float_to_half(x).view(np.uint16), x.astype(np.float16).view(np.uint16))
            ok = int(fresh and same and _CASTS._sessions is not None and not _CASTS.failed)
        finally:
            os.write(write, bytes([ok]))
            os._exit(0)
    os.close(write)
    result = os.read(read, 1)
    os.close(read)
    os.waitpid(pid, 0)
    assert result == b"\x01"
