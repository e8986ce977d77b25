from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from collections.abc import Iterable

    from everyo.tensor import Tensor


def clip_grad_norm(parameters: Iterable[Tensor], max_norm: float, eps: float = 1e-6) -> float:
    """Scale gradients so their global L2 norm is at most ``max_norm``.

    Returns the norm before clipping (computed in float64). Non-finite norms are
    returned as they are and leave the gradients untouched, so a GradScaler can
    still see the overflow.
    """
    grads = [(p, p.grad) for p in parameters if p.grad is not None]
    total = float(np.sqrt(sum(np.sum(np.square(g, dtype=np.float64)) for _, g in grads)))
    if np.isfinite(total) and total > max_norm:
        coef = max_norm / (total + eps)
        for p, g in grads:
            p.grad = (g * coef).astype(g.dtype, copy=False)
    return total
