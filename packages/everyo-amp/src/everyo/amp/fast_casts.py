"""float16 <-> float32 conversions at the CPU's own speed, through onnxruntime's Cast.

Under autocast most of a step on a CPU is spent converting between float16
and float32 (every 16-bit op converts its operands up and its result down),
and NumPy converts one element at a time: ~1.8 ns a value down and ~0.8 ns up
on the development machine, where the CPU's conversion instructions (F16C on
x86-64, NEON on ARM) need a small fraction of that. onnxruntime's ``Cast``
kernel uses them (MLAS): converting 512K values took 0.11 ms there against
0.96 ms for ``astype``. So when onnxruntime is installed (``pip install
everyo-amp[fast]``, or any install that has it), importing ``everyo.amp``
hands core (:func:`everyo.half.set_cast_kernel`) a converter that runs the
conversions of arrays of 4,096 values or more through two tiny ONNX graphs.

Nothing changes in the numbers:

* before its first use the converter checks itself against NumPy's
  ``astype``, bit for bit, on every finite float16 value and the float32
  values around each of them (ties, subnormals, both signs); any difference,
  or an onnxruntime that fails to import or to run, and core's own
  conversions are used instead, for the life of the process;
* values float16 cannot hold finitely (inf, NaN, ``|x| >= 65520``) are always
  converted again by NumPy (core does that), so NaN payloads, overflow
  warnings and ``np.errstate`` are exactly ``astype``'s;
* onnxruntime is imported at the first large conversion, not at import; its
  sessions run on the calling thread (one intra-op thread, no spinning;
  importing onnxruntime starts one idle thread of its own, as it does for
  ``run_onnx``), and a forked child builds its own (``os.register_at_fork``).

``EVERYO_AMP_CASTS=numpy`` in the environment keeps core's own conversions
(the benchmark uses it for its side-by-side check); :func:`cast_backend`
says which converter is in use. Where everyo-kernels is installed and active,
core's compiled one-pass conversions come before any converter installed here,
and ``EVERYO_AMP_CASTS=numpy`` leaves them on (``EVERYO_KERNELS=0`` turns them off).
"""

from __future__ import annotations

import os
import threading
from typing import Any

import numpy as np

from everyo import half

__all__ = ["cast_backend"]

_ENV = "EVERYO_AMP_CASTS"


def _check_vectors() -> tuple[np.ndarray, np.ndarray]:
    """float32 values around every finite float16 value, and every finite float16 code."""
    codes = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    h = codes.view(np.float16)
    finite = h[np.isfinite(h)]
    around = finite.astype(np.float32).view(np.uint32).astype(np.int64)
    # a few ulps either side, and the midpoints to both neighbours (float16's spacing is 2**13 float32 ulps)
    parts = [around + d for d in range(-3, 4)] + [around + d * 4096 for d in (-1, 1)]
    down = np.concatenate(parts).clip(0, 2**32 - 1).astype(np.uint32).view(np.float32)
    down = down[np.abs(down) < np.float32(65520.0)]  # the specials are NumPy's anyway
    return np.ascontiguousarray(down), np.ascontiguousarray(finite)


class OnnxRuntimeCasts:
    """The converter core calls (``down``/``up``, see :func:`everyo.half.set_cast_kernel`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sessions: tuple[Any, Any] | None = None
        self.status = "not used yet (onnxruntime is imported at the first large float16 conversion)"
        self.failed = False
        if hasattr(os, "register_at_fork"):  # a forked child builds its own sessions
            os.register_at_fork(after_in_child=self._forget)

    def _forget(self) -> None:
        self._lock = threading.Lock()
        self._sessions = None

    # -- what core calls ----------------------------------------------------------------------
    def down(self, x: np.ndarray) -> np.ndarray | None:
        out = self._run(0, x)
        return None if out is None else out[0]

    def up(self, h: np.ndarray) -> np.ndarray | None:
        out = self._run(1, h)
        return None if out is None else out[0]

    def _run(self, which: int, array: np.ndarray) -> list[np.ndarray] | None:
        """Session ``which`` (down, up) on ``array``, or None when the converter is unusable."""
        sessions = self._ready()
        if sessions is None:
            return None
        out: list[np.ndarray] = sessions[which].run(None, {"x": array})
        return out

    # -- set-up -----------------------------------------------------------------------------------
    def _ready(self) -> tuple[Any, Any] | None:
        sessions = self._sessions
        if sessions is not None or self.failed:
            return sessions
        with self._lock:
            if self.failed:
                return None
            if self._sessions is None:
                try:
                    built = self._build()
                    self._check(built)
                except Exception as exc:  # noqa: BLE001 - any failure means: use core's own conversions
                    self.failed = True
                    self.status = f"numpy (onnxruntime casts unavailable: {type(exc).__name__}: {exc})"
                    return None
                self._sessions = built
            return self._sessions

    @staticmethod
    def _build() -> tuple[Any, Any]:
        import onnxruntime as ort
        from onnx import TensorProto, helper

        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.log_severity_level = 3
        # Results are handed to the caller as NumPy arrays: plain allocations, no arena kept growing.
        options.enable_cpu_mem_arena = False
        options.enable_mem_pattern = False

        def cast(source: int, target: int, name: str) -> Any:
            """A session casting input ``x`` to output ``name``."""
            graph = helper.make_graph(
                [helper.make_node("Cast", ["x"], [name], to=target)],
                "everyo_cast",
                [helper.make_tensor_value_info("x", source, ["n"])],
                [helper.make_tensor_value_info(name, target, ["n"])],
            )
            model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
            model.ir_version = 7  # readable by every onnxruntime this package supports
            return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])

        f32, f16 = TensorProto.FLOAT, TensorProto.FLOAT16
        return cast(f32, f16, "h"), cast(f16, f32, "f")

    def _check(self, sessions: tuple[Any, Any]) -> None:
        import onnxruntime as ort

        down, up = _check_vectors()
        expected = down.astype(np.float16)
        got = sessions[0].run(None, {"x": down})[0]
        if got.dtype != np.float16 or not np.array_equal(got.view(np.uint16), expected.view(np.uint16)):
            raise ValueError("Cast float32 -> float16 differs from NumPy's astype")
        got = sessions[1].run(None, {"x": up})[0]
        if got.dtype != np.float32 or not np.array_equal(got.view(np.uint32), up.astype(np.float32).view(np.uint32)):
            raise ValueError("Cast float16 -> float32 differs from NumPy's astype")
        # Core finds the values it must redo by their codes: everything float16 cannot hold
        # finitely must come out with an all-ones exponent.
        with np.errstate(over="ignore"):
            special = np.array([np.inf, -np.inf, np.nan, -np.nan, 65520.0, -65520.0, 1e6, -3e38], np.float32)
        codes = sessions[0].run(None, {"x": special})[0].view(np.uint16)
        if not ((codes & 0x7C00) == 0x7C00).all():
            raise ValueError("Cast float32 -> float16 does not give inf or NaN codes for inf, NaN and overflow")
        # The calling thread's floating-point environment must be untouched (no flush-to-zero).
        tiny = np.array([1e-40], np.float32)
        if not (tiny * np.float32(1.0))[0] > 0:
            raise ValueError("onnxruntime changed this thread's floating-point mode (denormals flushed)")
        self.status = f"onnxruntime {ort.__version__} Cast (checked against NumPy's astype)"


_CASTS = OnnxRuntimeCasts()


def cast_backend() -> str:
    """Which float16 <-> float32 converter large arrays go through, and why.

    Example:
        >>> import everyo.amp
        >>> everyo.amp.cast_backend().split()[0] in ("everyo-kernels'", "onnxruntime", "numpy", "not")
        True
    """
    from everyo import kernel_table

    if kernel_table.get("half_codes") is not None:  # core prefers these over any installed converter
        return f"everyo-kernels' one-pass conversions ({kernel_table.kernels().reason})"
    if half._kernel is not _CASTS:
        reason = f"{_ENV}=numpy" if os.environ.get(_ENV, "").lower() == "numpy" else "no converter installed"
        return f"numpy ({reason})"
    return _CASTS.status


def _install() -> None:
    """Called by ``import everyo.amp``: hand core the converter unless the environment says not to."""
    if os.environ.get(_ENV, "").lower() == "numpy":
        return
    if half._kernel is None:
        half.set_cast_kernel(_CASTS)
