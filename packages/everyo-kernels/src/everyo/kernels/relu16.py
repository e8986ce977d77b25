"""ReLU on 16-bit float codes (float16 and bfloat16) in one pass each way (``everyo.functional``).

Core's ReLU for 16-bit activations works on the codes with NumPy, which takes three
passes and two temporaries forward (``codes - 0x8001``, ``>= inf``, the product) and two
passes and a boolean temporary backward (the live mask, then the product into the
float32 gradient of a ``Rounded``). These do each in one loop, with the same operations:

* ``relu_codes``: ``codes`` if ``(codes - 0x8001) mod 2**16 >= inf`` else 0, i.e. every
  negative non-NaN code other than -0 becomes +0 (``inf``: the type's +inf code,
  0x7C00 for float16, 0x7F80 for bfloat16).
* ``relu_codes_backward``: ``g * live`` in place, ``live`` being 1.0 where the output
  code's magnitude bits are not 0 (positive values and NaNs) and 0.0 elsewhere, as NumPy
  multiplies a float32 by a boolean: a float32 product by 1.0 or 0.0, so ``g * 0`` is a
  signed zero, or NaN for inf/NaN. The two factors come in an array (``factors``:
  ``[1.0, 0.0]``) so that the compiler cannot fold ``g * 1.0`` into ``g``, which would
  keep a signalling NaN signalling where NumPy's product quiets it. It returns whether a
  product was invalid (``inf * 0``, a signalling NaN), for which core issues NumPy's
  warning (or error, as ``np.errstate`` says).
"""

from __future__ import annotations

import numpy as np

from everyo.kernels._jit import kernel
from everyo.kernels.float16 import _as_bits

__all__ = ["relu_codes", "relu_codes_backward"]

_u = np.uint32


@kernel
def relu_codes(codes, inf, out):
    """ReLU of the 16-bit ``codes`` (uint16) into ``out``; ``inf``: the +inf code."""
    limit = _u(inf)
    for n in range(codes.size):
        c = _u(codes[n])
        keep = _u(_u(c + _u(0x10000 - 0x8001)) & _u(0xFFFF)) >= limit
        out[n] = np.uint16(c if keep else _u(0))


@kernel
def relu_codes_backward(g, out, factors):
    """``g *= factors[0]`` where ``out``'s code has magnitude bits, else ``g *= factors[1]``;
    returns whether a product was IEEE-invalid (inf * 0, or a signalling NaN), where NumPy's
    multiply would warn (or raise, under ``np.errstate``), so that core can do the same."""
    live_factor, dead_factor = factors[0], factors[1]
    invalid = _u(0)
    for n in range(g.size):
        dead = _u(_u(out[n]) & _u(0x7FFF)) == _u(0)
        v = g[n]
        magnitude = _u(_as_bits(v) & _u(0x7FFFFFFF))
        signalling = _u(magnitude - _u(0x7F800001)) < _u(0x003FFFFF)  # 0x7F800001 ..= 0x7FBFFFFF
        infinite_dead = (magnitude == _u(0x7F800000)) & dead
        invalid |= _u(signalling | infinite_dead)
        g[n] = v * (dead_factor if dead else live_factor)
    return invalid != _u(0)
