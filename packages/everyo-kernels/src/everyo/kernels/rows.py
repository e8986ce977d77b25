"""Softmax and LayerNorm over the last axis, row by row (core's ``softmax`` and ``normalize``).

Both ops reduce each row of a C-contiguous (rows, n) array and then rewrite
it; the reference does that in NumPy passes over the whole array (a masked
copy, a max, a ``where``, a subtract, ``exp``, a sum, a divide; LayerNorm's
mean, centring, square, sum, divide, scale and shift, and twice as many
backward), each a fresh megabyte-sized temporary and, for a reduction over a
last axis of 64, one inner-loop call per row. Here each is one or two passes
over the rows, each row's temporaries in L1.

The kernels are the reference's arithmetic, operation for operation in the
same order and precision (no ``fastmath``, no FMA contraction), and their
sums are NumPy's own summation order (:func:`row_sum`, which is what
``ndarray.sum`` over a contiguous last axis computes; a sum over the rows is
NumPy's, row after row). So the results are **bit-identical** to the NumPy
path. The softmax forward leaves its ``exp`` to NumPy (``np.exp`` on the
shifted rows, between :func:`softmax_shift` and :func:`softmax_scale`): the
same SIMD loop the reference runs, hence the same bits (a scalar ``exp`` in
numba was measured 3x slower than that loop; issue 24).

- :func:`softmax_shift`: ``out = where(blocked, -inf, x) - peak`` per row,
  ``peak`` the row's maximum, or 0 where that is not finite (NaN, +inf, or
  -inf for a row with every entry ignored).
- :func:`softmax_scale`: ``e / total`` per row in place, ``total`` the row's
  sum, or 1 where that is 0 (a fully ignored row stays all zeros).
- :func:`softmax_backward`: ``out * (g - sum(g * out))`` per row.
- :func:`layer_norm_forward`: ``(x - mean) / sqrt(var + eps)`` per row
  (``var`` with ddof 0), then ``* w + b`` when ``affine``; also stores each
  row's mean and ``1 / sqrt(var + eps)`` for the backward.
- :func:`layer_norm_backward`: the input gradient
  ``(gxhat - mean(gxhat) - xhat * mean(gxhat * xhat)) * rstd``, ``gxhat = g * w``
  (:func:`layer_norm_backward_input`), and the parameter gradients ``sum(g * xhat)``
  and ``sum(g)`` over the rows (:func:`layer_norm_backward_params`): two passes, which
  two threads can make at once (everyo.kernels.halves). Alone on one thread, the two
  passes take ~5% more than the one pass they replaced (214-225 against 207-210 us at
  (2048, 128)); one copy of the arithmetic instead of three that must agree bit for bit.

Float32 in training; float64 too (the gradient checker), compiled per type at
first use.
"""

from __future__ import annotations

import numpy as np

from everyo.kernels._jit import helper, kernel

_U = np.uint64  # an unsigned index (see _block_sum)

__all__ = [
    "row_sum",
    "softmax_shift",
    "softmax_scale",
    "softmax_backward",
    "layer_norm_forward",
    "layer_norm_backward",
    "layer_norm_backward_input",
    "layer_norm_backward_params",
]


@helper
def _block_sum(a, i, lo, n):
    # NumPy's pairwise_sum of a[i, lo:lo + n] for n <= 128: below 8 values in
    # order from 0, else 8 interleaved partial sums combined as a tree, then
    # the rest in order. The indices are unsigned: numba then skips its
    # negative-index wraparound, which made this loop 2.6x slower.
    r, start = _U(i), _U(lo)
    if n < 8:
        res = a.dtype.type(0)
        for k in range(n):
            res += a[r, start + _U(k)]
        return res
    r0, r1, r2, r3 = a[r, start], a[r, start + _U(1)], a[r, start + _U(2)], a[r, start + _U(3)]
    r4, r5, r6, r7 = a[r, start + _U(4)], a[r, start + _U(5)], a[r, start + _U(6)], a[r, start + _U(7)]
    blocks = n // 8
    for b in range(1, blocks):
        j = start + _U(8 * b)
        r0 += a[r, j]
        r1 += a[r, j + _U(1)]
        r2 += a[r, j + _U(2)]
        r3 += a[r, j + _U(3)]
        r4 += a[r, j + _U(4)]
        r5 += a[r, j + _U(5)]
        r6 += a[r, j + _U(6)]
        r7 += a[r, j + _U(7)]
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    for k in range(8 * blocks, n):
        res += a[r, start + _U(k)]
    return res


@kernel
def _long_sum(a, i, n):
    # pairwise_sum of a[i, :n] for n > 128: split in two halves (the first a
    # multiple of 8 long), each summed so, and added. The recursion is walked
    # with an explicit stack: numba's on-disk cache crashed (segfault) loading
    # a self-recursive kernel.
    los = np.empty(64, np.int64)
    ns = np.empty(64, np.int64)
    state = np.empty(64, np.int8)  # 1: left half pending; 2: right half pending
    left = np.empty(64, a.dtype)
    sp = 0
    los[0], ns[0], state[0] = 0, n, 0
    while True:
        m = ns[sp]
        if m > 128:  # split: the left half first
            half = m // 2
            half -= half % 8
            state[sp] = 1
            sp += 1
            los[sp], ns[sp], state[sp] = los[sp - 1], half, 0
            continue
        v = _block_sum(a, i, los[sp], m)
        while True:  # hand v to the frames above
            sp -= 1
            if sp < 0:
                return v
            if state[sp] == 1:
                left[sp] = v
                state[sp] = 2
                half = ns[sp] // 2
                half -= half % 8
                los[sp + 1], ns[sp + 1], state[sp + 1] = los[sp] + half, ns[sp] - half, 0
                sp += 1
                break
            v = left[sp] + v


@helper
def row_sum(a, i):
    """``a[i].sum()`` of a C-contiguous 2-D ``a`` as NumPy computes it: the
    reduction starts from 0 and adds ``pairwise_sum`` of the row (NumPy's
    ``loops_utils.h``: up to 128 values as :func:`_block_sum`, more split in
    two halves, the first a multiple of 8 long, each summed so)."""
    n = a.shape[1]
    return a.dtype.type(0) + (_block_sum(a, i, 0, n) if n <= 128 else _long_sum(a, i, n))


@helper
def _row_max(a, i, n):
    # The largest of a[i, :n] (-inf for none), NaNs passed over: 8 running
    # maxima (independent chains, unsigned indices as in _block_sum), then
    # the largest of them and of the rest. A maximum is exact in any order.
    r = _U(i)
    m0 = m1 = m2 = m3 = m4 = m5 = m6 = m7 = a.dtype.type(-np.inf)
    blocks = n // 8
    for b in range(blocks):
        j = _U(8 * b)
        v0, v1, v2, v3 = a[r, j], a[r, j + _U(1)], a[r, j + _U(2)], a[r, j + _U(3)]
        v4, v5, v6, v7 = a[r, j + _U(4)], a[r, j + _U(5)], a[r, j + _U(6)], a[r, j + _U(7)]
        m0 = v0 if v0 > m0 else m0
        m1 = v1 if v1 > m1 else m1
        m2 = v2 if v2 > m2 else m2
        m3 = v3 if v3 > m3 else m3
        m4 = v4 if v4 > m4 else m4
        m5 = v5 if v5 > m5 else m5
        m6 = v6 if v6 > m6 else m6
        m7 = v7 if v7 > m7 else m7
    for k in range(8 * blocks, n):
        v = a[r, _U(k)]
        m0 = v if v > m0 else m0
    m0 = m1 if m1 > m0 else m0
    m2 = m3 if m3 > m2 else m2
    m4 = m5 if m5 > m4 else m4
    m6 = m7 if m7 > m6 else m6
    m0 = m2 if m2 > m0 else m0
    m4 = m6 if m6 > m4 else m4
    return m4 if m4 > m0 else m0


@kernel
def softmax_shift(x, blocked, out):
    """``out[i] = where(blocked[i % len(blocked)], -inf, x[i]) - peak[i]``.

    ``x`` and ``out`` are C-contiguous (rows, n); ``blocked`` is None or a
    C-contiguous boolean (mrows, n) whose rows repeat over ``x``'s (a mask
    broadcast over leading axes). ``peak[i]`` is the row's maximum where that
    is finite, else 0 (the reference's ``where(isfinite(peak), peak, 0)``).
    NaNs are passed over in the maximum (the reference's is NaN, so it shifts
    by 0): either way a row holding a NaN sums to NaN and comes out all NaN."""
    rows, n = x.shape
    ninf = x.dtype.type(-np.inf)
    zero = x.dtype.type(0)
    codes = None if blocked is None else blocked.view(np.uint8)
    for i in range(rows):
        if blocked is None:
            peak = _row_max(x, i, n)
            if peak == ninf or peak == -ninf:
                peak = zero
            for j in range(n):
                out[i, j] = x[i, j] - peak
        else:
            # The masked row first (a select per value; the mask read as bytes),
            # then its maximum, then the shift in place: 2.3x faster than
            # selecting in both the maximum's and the shift's loop.
            k = i % blocked.shape[0]
            for j in range(n):
                out[i, j] = ninf if codes[k, j] != 0 else x[i, j]
            peak = _row_max(out, i, n)
            if peak == ninf or peak == -ninf:
                peak = zero
            for j in range(n):
                out[i, j] = out[i, j] - peak


@kernel
def softmax_scale(e):
    """``e[i] /= total`` in place per row of a C-contiguous (rows, n), ``total``
    the row's sum, or 1 where that is 0."""
    rows, n = e.shape
    one = e.dtype.type(1)
    for i in range(rows):
        total = row_sum(e, i)
        if total == 0:
            total = one
        for j in range(n):
            e[i, j] = e[i, j] / total


@kernel
def softmax_backward(g, out, gx):
    """``gx[i] = (g[i] - sum(g[i] * out[i])) * out[i]``; all C-contiguous (rows, n)."""
    rows, n = g.shape
    for i in range(rows):
        for j in range(n):
            gx[i, j] = g[i, j] * out[i, j]
        dot = row_sum(gx, i)
        for j in range(n):
            gx[i, j] = (g[i, j] - dot) * out[i, j]


@kernel
def layer_norm_forward(x, w, b, affine, eps, y, mean, rstd):
    """LayerNorm of each row of the C-contiguous (rows, n) ``x`` into ``y``.

    ``w`` and ``b`` are (n,) (used only when ``affine``); ``eps`` a scalar of
    ``x``'s type; ``mean`` and ``rstd`` (rows,) receive each row's mean and
    ``1 / sqrt(var + eps)``. The reference's order: ``mean = sum / n``,
    ``d = x - mean``, ``var = sum(d * d) / n``, ``std = sqrt(var + eps)``,
    ``y = d / std``, then ``y * w``, then ``+ b``."""
    rows, n = x.shape
    count = x.dtype.type(n)
    one = x.dtype.type(1)
    sq = np.empty((1, n), x.dtype)
    for i in range(rows):
        mu = row_sum(x, i) / count
        for j in range(n):
            d = x[i, j] - mu
            y[i, j] = d
            sq[0, j] = d * d
        std = np.sqrt(row_sum(sq, 0) / count + eps)
        if affine:
            for j in range(n):
                y[i, j] = (y[i, j] / std) * w[j] + b[j]
        else:
            for j in range(n):
                y[i, j] = y[i, j] / std
        mean[i] = mu
        rstd[i] = one / std


# layer_norm_backward's two parts, which two threads can make at once (everyo.kernels.halves).
@kernel
def layer_norm_backward_input(x, g, mean, rstd, w, gx):
    """The input gradient ``gx`` of :func:`layer_norm_backward` alone."""
    rows, n = x.shape
    count = x.dtype.type(n)
    xhat = np.empty(n, x.dtype)
    prod = np.empty((1, n), x.dtype)
    for i in range(rows):
        mu, r = mean[i], rstd[i]
        for j in range(n):
            xh = (x[i, j] - mu) * r
            gh = g[i, j] * w[j]
            xhat[j] = xh
            gx[i, j] = gh
            prod[0, j] = gh * xh
        m2 = row_sum(prod, 0) / count
        m1 = row_sum(gx, i) / count
        for j in range(n):
            gx[i, j] = ((gx[i, j] - m1) - xhat[j] * m2) * r


@kernel
def layer_norm_backward_params(x, g, mean, rstd, gw, gb):
    """The parameter gradients ``gw`` and ``gb`` of :func:`layer_norm_backward` alone
    (zeros in, accumulated row after row)."""
    rows, n = x.shape
    for i in range(rows):
        mu, r = mean[i], rstd[i]
        for j in range(n):
            xh = (x[i, j] - mu) * r
            gj = g[i, j]
            gw[j] = gw[j] + gj * xh
            gb[j] = gb[j] + gj


@kernel
def layer_norm_backward(x, g, mean, rstd, w, gx, gw, gb):
    """The gradients of :func:`layer_norm_forward` (the reference's order).

    ``x``, ``g``, ``gx`` C-contiguous (rows, n); ``mean``, ``rstd`` (rows,);
    ``w`` (n,) (ones without an affine: ``g * 1`` is ``g``); ``gw`` and ``gb``
    (n,) zeros, accumulating ``g * xhat`` and ``g`` row after row (NumPy's
    order for a sum over leading axes). Per row, ``xhat = (x - mean) * rstd``,
    ``gxhat = g * w`` and ``gx = ((gxhat - mean(gxhat)) - xhat * mean(gxhat * xhat)) * rstd``:
    its two parts, one after the other."""
    layer_norm_backward_params(x, g, mean, rstd, gw, gb)
    layer_norm_backward_input(x, g, mean, rstd, w, gx)
