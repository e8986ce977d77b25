"""Compiled building blocks for threads that share the words of an ``int64`` array
without the GIL (the pair's worker and OpenBLAS's calls: :mod:`everyo.kernels.pair`).

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


@intrinsic
def dojob(typingctx, address, thread_num, jobdata, data):
    """OpenBLAS's ``void dojob(int thread_num, void *jobdata, int dojob_data)`` at ``address``."""
    sig = types.void(types.int64, types.int64, types.int64, types.int64)

    def codegen(context, builder, signature, args):
        i32, i8p = ir.IntType(32), ir.IntType(8).as_pointer()
        fnty = ir.FunctionType(ir.VoidType(), [i32, i8p, i32])
        fn, num, job, value = args
        target = builder.inttoptr(fn, fnty.as_pointer())
        builder.call(target, [builder.trunc(num, i32), builder.inttoptr(job, i8p), builder.trunc(value, i32)])
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def start_thread(typingctx, create, handles, index, routine, argument):
    """``pthread_create(&handles[index], NULL, routine, argument)`` through ``create``
    (``pthread_create``'s address); ``routine`` and ``argument`` are addresses. 0 on success."""
    sig = types.int64(types.int64, handles, types.int64, types.int64, types.int64)

    def codegen(context, builder, signature, args):
        i32, i8p = ir.IntType(32), ir.IntType(8).as_pointer()
        routine_type = ir.FunctionType(i8p, [i8p]).as_pointer()
        fnty = ir.FunctionType(i32, [i8p, i8p, routine_type, i8p])
        target = builder.inttoptr(args[0], fnty.as_pointer())
        handle = builder.bitcast(_word(context, builder, signature.args[1], args[1], args[2]), i8p)
        result = builder.call(
            target,
            [
                handle,
                ir.Constant(i8p, None),
                builder.inttoptr(args[3], routine_type),
                builder.inttoptr(args[4], i8p),
            ],
        )
        return builder.sext(result, ir.IntType(64))

    return sig, codegen


@intrinsic
def join_thread(typingctx, join, handle):
    """``pthread_join(handle, NULL)`` through ``join`` (``pthread_join``'s address)."""
    sig = types.int64(types.int64, types.int64)

    def codegen(context, builder, signature, args):
        i32, i64, i8p = ir.IntType(32), ir.IntType(64), ir.IntType(8).as_pointer()
        fnty = ir.FunctionType(i32, [i64, i8p.as_pointer()])
        target = builder.inttoptr(args[0], fnty.as_pointer())
        return builder.sext(builder.call(target, [args[1], ir.Constant(i8p.as_pointer(), None)]), i64)

    return sig, codegen


@intrinsic
def address_of(typingctx, pointer):
    """A ``void *`` as an integer."""
    sig = types.int64(types.voidptr)

    def codegen(context, builder, signature, args):
        return builder.ptrtoint(args[0], ir.IntType(64))

    return sig, codegen


@intrinsic
def words_at(typingctx, address):
    """The ``int64 *`` at an integer address (for ``numba.carray``)."""
    sig = types.CPointer(types.int64)(types.int64)

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], ir.IntType(64).as_pointer())

    return sig, codegen


@intrinsic
def own_word(typingctx):
    """The address of an ``int64`` of the calling function's own machine code (a global
    variable of its LLVM module, 0 at first): one per compiled function, kept for the
    process's life."""
    sig = types.CPointer(types.int64)()

    def codegen(context, builder, signature, args):
        module = builder.module
        name = "everyo_kernels_own_word"
        try:
            word = module.get_global(name)
        except KeyError:
            word = ir.GlobalVariable(module, ir.IntType(64), name=name)
            word.linkage = "internal"
            word.initializer = ir.Constant(ir.IntType(64), 0)
        return word

    return sig, codegen
