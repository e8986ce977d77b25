"""Compiled building blocks for threads that share the words of an ``int64`` array
without the GIL (the pair's worker and its callers: :mod:`everyo.kernels.pair`).

Each is an LLVM instruction or a call through a C function's address. The
addresses (libc's ``sched_yield``, ``syscall``, ...) differ between processes,
so kernels take them as integer arguments, never as compile-time constants:
the compiled code stays cacheable on disk.
"""

from __future__ import annotations

import ctypes

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

__all__ = ["FUTEX_WAIT", "FUTEX_WAKE", "SYS_FUTEX", "libc_address"]

SYS_FUTEX = 202  # x86-64's futex system call (the pair's futex is used on x86-64 Linux only)
FUTEX_WAIT, FUTEX_WAKE = 128, 129  # FUTEX_WAIT_PRIVATE, FUTEX_WAKE_PRIVATE


def libc_address(name: str) -> int:
    """The address of the C library's function ``name`` in this process."""
    return int(ctypes.cast(getattr(ctypes.CDLL(None), name), ctypes.c_void_p).value or 0)


@intrinsic
def call0(typingctx, address):
    """``int f(void)`` at ``address`` (``sched_yield``, ``getpid``)."""
    sig = types.int32(types.int64)

    def codegen(context, builder, signature, args):
        fnty = ir.FunctionType(ir.IntType(32), [])
        return builder.call(builder.inttoptr(args[0], fnty.as_pointer()), [])

    return sig, codegen


@intrinsic
def cycles(typingctx):
    """The CPU's cycle counter (``llvm.readcyclecounter``: ``rdtsc`` on x86-64)."""
    sig = types.int64()

    def codegen(context, builder, signature, args):
        fnty = ir.FunctionType(ir.IntType(64), [])
        fn = builder.module.declare_intrinsic("llvm.readcyclecounter", fnty=fnty)
        return builder.call(fn, [])

    return sig, codegen


def _word(context, builder, array_type, array, index):
    data = context.make_array(array_type)(context, builder, array).data
    return builder.gep(data, [index])


@intrinsic
def load(typingctx, words, index):
    """``words[index]``, loaded from memory each time (volatile: another thread writes it)."""
    sig = types.int64(words, types.int64)

    def codegen(context, builder, signature, args):
        return builder.load_atomic(_word(context, builder, signature.args[0], args[0], args[1]), "seq_cst", 8)

    return sig, codegen


@intrinsic
def store(typingctx, words, index, value):
    """``words[index] = value``, seen by other threads in program order (sequentially consistent)."""
    sig = types.void(words, types.int64, types.int64)

    def codegen(context, builder, signature, args):
        builder.store_atomic(args[2], _word(context, builder, signature.args[0], args[0], args[1]), "seq_cst", 8)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def swap_if(typingctx, words, index, expected, value):
    """``words[index] = value`` if it holds ``expected`` (True), atomically; else False."""
    sig = types.boolean(words, types.int64, types.int64, types.int64)

    def codegen(context, builder, signature, args):
        pointer = _word(context, builder, signature.args[0], args[0], args[1])
        pair = builder.cmpxchg(pointer, args[2], args[3], "seq_cst", "seq_cst")
        return builder.extract_value(pair, 1)

    return sig, codegen


@intrinsic
def add(typingctx, words, index, value):
    """``words[index] += value``, atomically."""
    sig = types.void(words, types.int64, types.int64)

    def codegen(context, builder, signature, args):
        builder.atomic_rmw("add", _word(context, builder, signature.args[0], args[0], args[1]), args[2], "seq_cst")
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def futex(typingctx, syscall, words, index, op, value):
    """``syscall(SYS_futex, &words[index], op, value, NULL)`` on the word's low 32 bits
    (x86-64 is little-endian): ``FUTEX_WAIT`` sleeps while the word holds ``value``,
    ``FUTEX_WAKE`` wakes ``value`` sleepers."""
    sig = types.int64(types.int64, words, types.int64, types.int64, types.int64)

    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)
        fnty = ir.FunctionType(i64, [i64], var_arg=True)
        target = builder.inttoptr(args[0], fnty.as_pointer())
        address = builder.ptrtoint(_word(context, builder, signature.args[1], args[1], args[2]), i64)
        zero = ir.Constant(i64, 0)
        return builder.call(target, [ir.Constant(i64, SYS_FUTEX), address, args[3], args[4], zero, zero, zero])

    return sig, codegen
