"""NumPy's own BLAS product and ufunc loops, callable from compiled kernels.

A kernel that runs a whole loop of small steps (the LSTM's time loop) must
still make the same matrix products and the same ``tanh`` as the NumPy path,
or its results are not bit-identical to it. So it does not bring its own:

- :func:`gemm` calls the ``cblas_?gemm`` that NumPy's ``matmul`` calls (found
  through the handle of NumPy's own extension module, so it is the library
  NumPy links, whatever its name), with the arguments ``matmul`` passes for a
  2-D product of row-major operands with unit column stride: the same kernel,
  the same arithmetic, the same bits;
- :func:`ufunc_call` calls the strided inner loop NumPy itself picks for a
  ufunc and dtype (NEP 43's ``ufunc._get_strided_loop``, NumPy >= 1.24), on
  contiguous operands as NumPy does for a contiguous array: for ``np.tanh``
  that is NumPy's SIMD loop.

The function addresses differ between processes, so kernels take them as
integer arguments (never as compile-time constants): the compiled code stays
cacheable on disk. :data:`AVAILABLE` is False (and the kernels that need this
are not registered) where any of it cannot be found: another BLAS layout, an
older NumPy.
"""

from __future__ import annotations

import ctypes
import importlib
from typing import Any

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

__all__ = ["AVAILABLE", "blas_threads", "gemm_address", "ufunc_loop", "gemm", "ufunc_call"]

_CALL_INFO = b"numpy_1.24_ufunc_call_info"
_keep: list[Any] = []  # the loops' capsules (their context and auxdata must outlive every call)
# PyCapsule_GetPointer through a prototype of our own: setting restype/argtypes on
# ctypes.pythonapi's shared function object would change it for the whole process.
_capsule_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi)
)


_thread_count: Any = None  # OpenBLAS's openblas_get_num_threads, once found


def _gemm_addresses() -> dict[str, int]:
    """``{"float32": &cblas_sgemm, "float64": &cblas_dgemm}`` as NumPy links them
    (64-bit BLAS integers: NumPy's scipy-openblas64 wheels), or empty."""
    global _thread_count
    umath: Any = importlib.import_module("numpy._core._multiarray_umath")  # NumPy's extension module
    try:
        lib = ctypes.CDLL(umath.__file__)
    except OSError:
        return {}
    for prefix, suffix in (("scipy_", "64_"), ("", "64_")):
        s, d = (getattr(lib, f"{prefix}cblas_{t}gemm{suffix}", None) for t in "sd")
        if s is not None and d is not None:
            s_address, d_address = ctypes.cast(s, ctypes.c_void_p).value, ctypes.cast(d, ctypes.c_void_p).value
            if s_address and d_address:
                # through a PyDLL: the call keeps the GIL (a CDLL call lets go of it and takes it
                # back, and where the pair's worker took it meanwhile, sleeps ~10 us until it is free)
                count = getattr(ctypes.PyDLL(umath.__file__), f"{prefix}openblas_get_num_threads{suffix}", None)
                if count is not None:  # this PyDLL object is ours alone: its function objects too
                    count.restype, count.argtypes = ctypes.c_int, []
                    _thread_count = count
                return {"float32": s_address, "float64": d_address}
    return {}


def blas_threads() -> int:
    """The thread count of the BLAS whose gemm :func:`gemm` calls, as set now
    (``OPENBLAS_NUM_THREADS``, ``threadpool_limits``, a ``spawn`` worker's one
    thread); 1 where it cannot be read."""
    return max(1, int(_thread_count())) if _thread_count is not None else 1


def ufunc_loop(ufunc: np.ufunc, dtype: Any) -> np.ndarray:
    """NumPy's strided loop of a unary ``ufunc`` for contiguous ``dtype`` operands:
    ``[loop, context, auxdata]`` addresses (int64), for :func:`ufunc_call`."""
    d = np.dtype(dtype)
    private: Any = ufunc  # NEP 43's experimental methods, not in NumPy's stubs
    _, info = private._resolve_dtypes_and_context((d, d))
    private._get_strided_loop(info, fixed_strides=(d.itemsize, d.itemsize))
    loop, context, aux = (ctypes.c_void_p * 3).from_address(_capsule_pointer(info, _CALL_INFO))
    if not loop:
        raise RuntimeError(f"NumPy gave no strided loop for {ufunc.__name__} {d}")
    _keep.append(info)
    return np.array([loop, context or 0, aux or 0], dtype=np.int64)


def _find() -> tuple[dict[str, int], dict[str, np.ndarray]]:
    try:
        gemms = _gemm_addresses()
        tanh = {name: ufunc_loop(np.tanh, name) for name in ("float32", "float64")} if gemms else {}
    except Exception:  # an older NumPy, a BLAS without these symbols: the kernels are not offered
        return {}, {}
    return gemms, tanh


_GEMM, TANH = _find()
AVAILABLE = bool(_GEMM and TANH)


def gemm_address(dtype: Any) -> int:
    return _GEMM[np.dtype(dtype).name]


@intrinsic
def gemm(typingctx, address, m, n, k, a, lda, b, ldb, c, ldc):
    """``c = a @ b`` through the ``cblas_?gemm`` at ``address``: row-major, no
    transposes, ``a`` (m, k), ``b`` (k, n), ``c`` (m, n) with leading dimensions
    ``lda``, ``ldb``, ``ldc`` (their row strides in elements; unit column stride)."""
    dt = a.dtype
    sig = types.void(types.int64, types.int64, types.int64, types.int64, a, types.int64, b, types.int64, c, types.int64)

    def codegen(context, builder, signature, args):
        fn, m, n, k, a, lda, b, ldb, c, ldc = args
        real = ir.FloatType() if dt == types.float32 else ir.DoubleType()
        i32, i64, ptr = ir.IntType(32), ir.IntType(64), real.as_pointer()
        fnty = ir.FunctionType(ir.VoidType(), [i32, i32, i32, i64, i64, i64, real, ptr, i64, ptr, i64, real, ptr, i64])
        target = builder.inttoptr(fn, fnty.as_pointer())

        def data(value, ty):
            return builder.bitcast(context.make_array(ty)(context, builder, value).data, ptr)

        row_major, no_trans = ir.Constant(i32, 101), ir.Constant(i32, 111)
        one, zero = ir.Constant(real, 1.0), ir.Constant(real, 0.0)
        a_, b_, c_ = data(a, signature.args[4]), data(b, signature.args[6]), data(c, signature.args[8])
        builder.call(target, [row_major, no_trans, no_trans, m, n, k, one, a_, lda, b_, ldb, zero, c_, ldc])
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def ufunc_call(typingctx, loop, x, y, n):
    """``y[:n] = f(x[:n])`` through the strided loop ``loop`` (:func:`ufunc_loop`),
    both operands contiguous (they may be the same array)."""
    sig = types.int32(loop, x, y, types.int64)

    def codegen(context, builder, signature, args):
        loop, x, y, n = args
        i64, i8p = ir.IntType(64), ir.IntType(8).as_pointer()
        fnty = ir.FunctionType(ir.IntType(32), [i8p, i8p.as_pointer(), i64.as_pointer(), i64.as_pointer(), i8p])
        words = context.make_array(signature.args[0])(context, builder, loop).data
        fn, ctx, aux = (builder.load(builder.gep(words, [ir.Constant(i64, j)])) for j in range(3))
        xs = context.make_array(signature.args[1])(context, builder, x)
        ys = context.make_array(signature.args[2])(context, builder, y)
        data = builder.alloca(i8p, 2)
        builder.store(builder.bitcast(xs.data, i8p), data)
        builder.store(builder.bitcast(ys.data, i8p), builder.gep(data, [ir.Constant(i64, 1)]))
        dims = builder.alloca(i64, 1)
        builder.store(n, dims)
        size = ir.Constant(i64, context.get_abi_sizeof(context.get_data_type(signature.args[1].dtype)))
        strides = builder.alloca(i64, 2)
        builder.store(size, strides)
        builder.store(size, builder.gep(strides, [ir.Constant(i64, 1)]))
        target = builder.inttoptr(fn, fnty.as_pointer())
        return builder.call(target, [builder.inttoptr(ctx, i8p), data, dims, strides, builder.inttoptr(aux, i8p)])

    return sig, codegen
