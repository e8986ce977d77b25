"""Large passes of the kernels whose parts are independent, in two halves on the pair.

On a machine whose BLAS has two threads (a 2-core machine, as OpenBLAS sets
itself), a training step's passes over whole activations (im2col and col2im,
max pooling, ReLU, the bias add, softmax, LayerNorm's forward, GELU) ran on one
core while the other one idled, or spun in OpenBLAS's worker after the last
product. Here each such pass, from ``MIN_VALUES`` values up, runs as two halves:
one on the caller's thread, one on the pair's worker (:mod:`everyo.kernels.pair`),
while :func:`everyo.kernels.pair.split_matmul` keeps the step's large products
on the same two threads, so that OpenBLAS's own worker is never woken to spin
on the core the worker needs (one product on OpenBLAS's threads per CNN step
made the halves twice as slow, measured).

Every split is **bit-identical** to the whole kernel: each output value is
computed by the same code from the same inputs in either half. The halves are
whole images (im2col, col2im, pooling), whole rows (the bias add, softmax,
LayerNorm's forward: a row's sums stay in one half; a softmax's rows are cut
where its repeated mask starts again), or plain element ranges (ReLU, GELU, the
float16 and bfloat16 conversions of autocast; the float16 ones return the larger
of their halves' largest magnitudes).
Core's own large NumPy passes (a residual add, softmax's ``exp``, a copy of
attention's heads: ``everyo._passes``) are offered to :func:`numpy_halves`, which
runs them the same way, in halves of their output's first axis.

Not split: ``column_sums`` (a bias's gradient). Its halves by columns as strided
arrays were 2-5x slower than the whole kernel; as ranges of columns of the whole
array (contiguous row slices, a vectorised loop) still slower at (4096, 128), 43 ->
52 us, and (100352, 32), 370 -> 553, faster only at (2048, 512), 160 -> 110
(measured: each thread reads every row's cache lines for half of their values).
``outer_product`` runs as two halves of its output's rows ((4096, 128): 57 -> 38 us).
``layer_norm_backward``'s parameter gradients sum over all rows in order, so they
stay on one thread: :func:`layer_norm_backward_parts` gives that
thread the parameter sums and the first rows' input gradients, the other thread
the remaining rows.

Nothing is split where :func:`everyo.kernels.pair.owns_second_core` is False:
a BLAS with one thread or more than two, or a busy machine (then one thread
makes the whole pass, as before).
"""

from __future__ import annotations

import contextvars
from typing import TYPE_CHECKING, Any

import numpy as np

from everyo.kernels import pair

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = [
    "MIN_VALUES",
    "by_leading_axis",
    "by_images",
    "softmax_shift_rows",
    "layer_norm_backward_parts",
    "numpy_halves",
]

# Below this many values a half's work (~0.1 ms of float32 ReLU at this size on the
# development machine) is too close to the handshake's cost to be worth it.
MIN_VALUES = 1 << 18


def _split(size: int) -> bool:
    return size >= MIN_VALUES and pair.owns_second_core()


def _wrapping(split: Callable[..., Any], kernel: Callable[..., Any]) -> Callable[..., Any]:
    """``split`` under ``kernel``'s name and doc, with the kernel itself as ``.whole``."""
    split.__name__ = split.__qualname__ = getattr(kernel, "__name__", "kernel")
    split.__doc__ = getattr(kernel, "__doc__", None)
    split.whole = kernel  # type: ignore[attr-defined]
    return split


def by_leading_axis(
    kernel: Callable[..., Any],
    cut: tuple[int, ...],
    size_of: int = 0,
    combine: Callable[[Any, Any], Any] | None = None,
) -> Callable[..., Any]:
    """``kernel`` with its positional arguments at ``cut`` split in two along their
    first axis (at half of argument ``size_of``'s length; its size decides whether to
    split), the halves on the pair. ``combine``: what the split returns from the two
    halves' returns (the float16 conversions' largest magnitudes: ``max``); without it,
    None."""

    def split(*args: Any) -> Any:
        measure = args[size_of]
        n = measure.shape[0]
        if n < 2 or not _split(measure.size):
            return kernel(*args)
        h = n // 2
        lo = [a[:h] if i in cut else a for i, a in enumerate(args)]
        hi = [a[h:] if i in cut else a for i, a in enumerate(args)]
        got = [None, None]

        def mine() -> None:
            got[0] = kernel(*lo)

        def theirs() -> None:
            got[1] = kernel(*hi)

        pair.run(mine, theirs)
        return None if combine is None else combine(got[0], got[1])

    return _wrapping(split, kernel)


def by_images(kernel: Callable[..., Any], image: int, columns: int, geometry: slice) -> Callable[..., Any]:
    """im2col / col2im: the (N, H, W, C) argument at ``image`` split by images, the
    (N * OH * OW, K) columns at ``columns`` at the same image (``OH, OW`` the last two
    of ``args[geometry]``)."""

    def split(*args: Any) -> Any:
        images, cols = args[image], args[columns]
        n = images.shape[0]
        if n < 2 or not _split(cols.size):
            return kernel(*args)
        oh, ow = args[geometry][-2:]
        h, r = n // 2, (n // 2) * oh * ow
        lo, hi = list(args), list(args)
        lo[image], hi[image] = images[:h], images[h:]
        lo[columns], hi[columns] = cols[:r], cols[r:]
        pair.run(lambda: kernel(*lo), lambda: kernel(*hi))
        return None

    return _wrapping(split, kernel)


def softmax_shift_rows(kernel: Callable[..., Any]) -> Callable[..., Any]:
    """``softmax_shift(x, blocked, out)`` in two halves of rows, cut where the mask's
    rows start again (row ``i`` reads mask row ``i % len(blocked)``)."""

    def split(x: Any, blocked: Any, out: Any) -> Any:
        period = 1 if blocked is None else blocked.shape[0]
        h = (x.shape[0] // 2) // period * period
        if h == 0 or not _split(x.size):
            return kernel(x, blocked, out)
        pair.run(lambda: kernel(x[:h], blocked, out[:h]), lambda: kernel(x[h:], blocked, out[h:]))
        return None

    return _wrapping(split, kernel)


# The share of the rows whose input gradients the thread that also sums the parameter
# gradients computes: at (2048, 128) float32 the input gradients took 189 us, the
# parameter sums 43 (one thread), so 0.4 of the rows evens the two threads out.
PARAMS_THREAD_ROWS = 0.4


def layer_norm_backward_parts(
    kernel: Callable[..., Any], inputs: Callable[..., Any], params: Callable[..., Any]
) -> Callable[..., Any]:
    """``layer_norm_backward(x, g, mean, rstd, w, gx, gw, gb)`` on the pair: this thread
    the parameter gradients (``params``: all rows, in order) and the input gradients of
    the first rows, the worker the input gradients of the others (``inputs``)."""

    def split(x: Any, g: Any, mean: Any, rstd: Any, w: Any, gx: Any, gw: Any, gb: Any) -> Any:
        rows = x.shape[0]
        h = int(rows * PARAMS_THREAD_ROWS)
        if rows < 2 or not _split(x.size):
            return kernel(x, g, mean, rstd, w, gx, gw, gb)

        def mine() -> None:
            params(x, g, mean, rstd, gw, gb)
            if h:
                inputs(x[:h], g[:h], mean[:h], rstd[:h], w, gx[:h])

        pair.run(mine, lambda: inputs(x[h:], g[h:], mean[h:], rstd[h:], w, gx[h:]))
        return None

    return _wrapping(split, kernel)


def numpy_halves(fn: Callable[..., Any], args: Any, out: np.ndarray) -> bool:
    """``fn(*args, out=out)`` (one of core's NumPy passes, ``everyo._passes``) in two halves
    of ``out``'s first axis on the pair; False, with nothing done, where it does not apply.

    ``fn`` computes each value of ``out`` from the values of ``args`` at the same position
    (core offers only such passes), so each half is ``fn`` on the matching halves of the
    arguments: an array with ``out``'s rank and first axis is cut with it, one that
    broadcasts along that axis (a lower rank, a first axis of 1) and a scalar are passed
    whole to both. The worker's half runs in a copy of the caller's context, so NumPy's
    ``errstate`` (a context variable) is the caller's there too."""
    n = out.shape[0] if out.ndim else 0
    if n < 2 or not _split(out.size):
        return False
    h = n // 2
    lo: list[Any] = []
    hi: list[Any] = []
    for a in args:
        if isinstance(a, np.ndarray) and a.ndim == out.ndim and a.shape[0] != 1:
            if a.shape[0] != n:
                return False  # NumPy will raise its own error, whole
            lo.append(a[:h])
            hi.append(a[h:])
        elif not isinstance(a, np.ndarray) and not np.isscalar(a):
            return False  # a list or a Tensor: not cut here
        else:
            lo.append(a)
            hi.append(a)
    context = contextvars.copy_context()
    pair.run(lambda: fn(*lo, out=out[:h]), lambda: context.run(fn, *hi, out=out[h:]))
    return True
