"""Adam's and AdamW's update of one parameter, fused (``everyo.optim.Adam._step``).

The reference updates a parameter in ten NumPy passes (decay, the two moment
updates, ``sqrt``, bias corrections, the step), each reading and writing whole
arrays, and pays a NumPy call's own cost ten times per parameter (the GPT has
52). Here each element goes through the same float operations in the same
order, with the same constants rounded to the parameter's dtype once (as NumPy
rounds a Python float operand), in one pass and one call: no ``fastmath``, so
no FMA contraction or reassociation, and ``sqrt`` is correctly rounded in both:
the results are **bit-identical**. Not for ``amsgrad`` (the reference runs).
"""

from __future__ import annotations

import math

import numpy as np

from everyo.kernels._jit import kernel

__all__ = ["adam_update", "adam_pass"]


@kernel
def adam_pass(p, g, m, v, decay, wd, b1, c1, b2, c2, bias2, eps, step_size, mode):
    """One pass over flat, contiguous ``p``, ``g``, ``m``, ``v`` of one dtype;
    scalars of that dtype. ``mode``: 0 no weight decay, 1 decoupled
    (``p *= decay``), 2 L2 (``g + wd * p``)."""
    for i in range(p.size):
        pi, gi = p[i], g[i]
        if mode == 1:
            pi = pi * decay
        elif mode == 2:
            gi = gi + wd * pi
        mi = m[i] * b1
        mi = mi + c1 * gi
        vi = v[i] * b2
        gg = gi * gi
        gg = gg * c2
        vi = vi + gg
        d = np.sqrt(vi)
        d = d / bias2
        d = d + eps
        d = mi / d
        d = d * step_size
        m[i] = mi
        v[i] = vi
        p[i] = pi - d


def adam_update(
    p: np.ndarray,
    g: np.ndarray,
    m: np.ndarray,
    v: np.ndarray,
    t: int,
    lr: float,
    betas: tuple[float, float],
    eps: float,
    weight_decay: float,
    decoupled: bool,
) -> None:
    """Adam's step ``t`` (already counted) on ``p`` in place, ``m`` and ``v``
    (``exp_avg``, ``exp_avg_sq``) updated in place: all C-contiguous arrays of
    one float dtype (float32 or float64), as ``Adam._step`` without ``amsgrad``.
    The Python floats are formed exactly as the reference forms them, then
    rounded to the dtype as NumPy rounds a Python scalar operand."""
    b1, b2 = betas
    f = p.dtype.type
    mode = 0 if not weight_decay else (1 if decoupled else 2)
    adam_pass(
        p.reshape(-1),
        g.reshape(-1),
        m.reshape(-1),
        v.reshape(-1),
        f(1 - lr * weight_decay),
        f(weight_decay),
        f(b1),
        f(1 - b1),
        f(b2),
        f(1 - b2),
        f(math.sqrt(1 - b2**t)),
        f(eps),
        f(lr / (1 - b1**t)),
        mode,
    )
