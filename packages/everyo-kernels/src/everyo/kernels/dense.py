"""A dense layer's elementwise steps in one pass each (core's ``linear`` and ``relu``).

- :func:`add_bias`: ``y += b`` over the rows of a C-contiguous (m, n) ``y``.
  NumPy's broadcast add walks the rows as an outer loop of 1-D adds; measured
  on the seed MLP's (4096, 128) float32 output: 107 us in NumPy, 46 us here.
- :func:`relu_forward`: ``out = max(a, 0)``, the ReLU. NumPy's ``maximum``
  with a scalar 0 runs at a quarter of memory speed; measured on the encoder's
  (2048, 512) float32 feed-forward activation: 390 us in NumPy, 90 us here.
  ``max(a, 0)`` as NumPy gives it: ``a`` where ``a > 0`` or ``a`` is NaN (the
  NaN itself passes), else +0 (also for -0).
- :func:`relu_backward`: ``res = g * (out != 0)``, the ReLU gradient (``out``
  is ``max(a, 0)``, never below 0, so ``out != 0`` is core's ``not (out <= 0)``:
  a NaN input passes its gradient). NumPy needs a pass for the mask and a
  multiply that converts it; measured on (4096, 128) float32: 330 us in NumPy,
  220 us here.

- :func:`column_sums`: ``out[j] = sum over i of a[i, j]``, a bias's gradient
  (``g.sum(axis=0)``). On a C-contiguous array with two or more columns NumPy's
  reduction walks the rows in order, adding each to the running row of sums
  (started at +0.0), with one call of its inner loop per row; measured in
  float32: (4096, 128) 127 us in NumPy, 47 us here; the CNN's first
  convolution, (100352, 32), 2.2 ms against 0.41 ms. With one column NumPy
  sums pairwise instead (other bits): not a case for this kernel.
- :func:`outer_product`: ``out = a[:, None] * b[None, :]``, the (m, 1) @ (1, n)
  product (the backward of a 1-unit output layer). NumPy's broadcast multiply
  calls its inner loop once per row; measured at (4096, 1) x (1, 128) float32:
  252 us in NumPy, 55 us here.

All five are **bit-identical** to the NumPy path: one IEEE add or one IEEE multiply
by 1.0 or 0.0 (or one product) per element, or the same adds in the same order
(:func:`column_sums`), in the same precision (a multiply by 0.0 keeps
NumPy's signed zero, and inf or NaN times 0.0 is NaN as there).
"""

from __future__ import annotations

from everyo.kernels._jit import kernel

__all__ = ["add_bias", "relu_forward", "relu_backward", "column_sums", "outer_product"]


@kernel
def add_bias(y, b):
    """``y[i, j] += b[j]`` in place; ``y`` is C-contiguous (m, n), ``b`` (n,)."""
    m, n = y.shape
    for i in range(m):
        for j in range(n):
            y[i, j] = y[i, j] + b[j]


@kernel
def relu_forward(a, out):
    """``out = max(a, 0)`` over 1-D C-contiguous arrays of one dtype (NumPy's
    ``maximum(a, 0)``: a NaN passes, -0 gives +0)."""
    zero = a.dtype.type(0)
    for n in range(a.size):
        v = a[n]
        out[n] = v if (v > zero or v != v) else zero


@kernel
def relu_backward(g, out, res):
    """``res = g * (out != 0)`` over 1-D C-contiguous arrays of one dtype."""
    one, zero = g.dtype.type(1), g.dtype.type(0)
    for n in range(g.size):
        res[n] = g[n] * (one if out[n] != 0 else zero)


@kernel
def column_sums(a, out):
    """``out[j] = ((0 + a[0, j]) + a[1, j]) + ...``, the rows in order (NumPy's
    ``a.sum(axis=0)`` for a C-contiguous (m, n) ``a`` with ``n >= 2``); ``out`` (n,)."""
    m, n = a.shape
    zero = a.dtype.type(0)
    for j in range(n):
        out[j] = zero
    for i in range(m):
        for j in range(n):
            out[j] = out[j] + a[i, j]


@kernel
def outer_product(a, b, out):
    """``out[i, j] = a[i] * b[j]``; ``a`` (m,), ``b`` (n,), ``out`` C-contiguous (m, n)."""
    for i in range(a.size):
        ai = a[i]
        for j in range(b.size):
            out[i, j] = ai * b[j]
