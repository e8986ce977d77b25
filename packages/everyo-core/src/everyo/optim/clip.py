import numpy as np


def clip_grad_norm(parameters, max_norm, eps=1e-6):
    """Scale gradients so their global L2 norm is at most ``max_norm``.

    Returns the norm before clipping (computed in float64). Non-finite norms are
    returned as they are and leave the gradients untouched, so a GradScaler can
    still see the overflow.
    """
    grads = [p for p in parameters if p.grad is not None]
    total = float(np.sqrt(sum(np.sum(np.square(p.grad, dtype=np.float64)) for p in grads)))
    if np.isfinite(total) and total > max_norm:
        coef = max_norm / (total + eps)
        for p in grads:
            p.grad = (p.grad * coef).astype(p.grad.dtype, copy=False)
    return total
