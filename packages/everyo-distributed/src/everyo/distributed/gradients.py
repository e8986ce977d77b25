"""``average_gradients``: one collective per optimizer step, whatever the model."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from collections.abc import Iterable

    from everyo.distributed.protocol import ProcessGroup
    from everyo.tensor import Tensor

__all__ = ["average_gradients"]


def average_gradients(parameters: Iterable[Tensor], group: ProcessGroup) -> None:
    """Replace every parameter's ``.grad`` by its mean over the ranks of ``group``.

    All gradients are flattened into one vector, with one presence flag per
    parameter appended, and averaged by a single ``group.all_reduce_mean``.
    The vector's dtype is the widest of the parameters' dtypes; since the
    reduction runs in float64 and is rounded once, the result each parameter
    gets back is the same as averaging its own gradient alone.

    A parameter whose ``.grad`` is ``None`` on some rank counts as a zero
    gradient there (the other ranks' contributions are still divided by
    ``world_size``, as if that rank's shard had no effect on it); afterwards
    every rank holds the same averaged gradient for it. A parameter whose
    ``.grad`` is ``None`` on *every* rank keeps ``None`` everywhere, so an
    optimizer skips it exactly as it would in one process.

    Every rank must pass the same parameters in the same order (same model);
    otherwise the collective's size differs and the group raises
    :class:`~everyo.errors.EveryODistributedError` naming the ranks.

    Args:
        parameters: an iterable of parameters (``.data`` and ``.grad`` NumPy arrays).
        group: any :class:`~everyo.distributed.ProcessGroup` (only
            ``all_reduce_mean`` is used).
    """
    params = list(parameters)
    if not params:
        return
    dtype = np.result_type(*[p.data.dtype for p in params])
    sizes = [p.data.size for p in params]
    total = sum(sizes)
    flat = np.zeros(total + len(params), dtype)
    flags = flat[total:]
    offset = 0
    for i, (p, n) in enumerate(zip(params, sizes)):
        if p.grad is not None:
            flat[offset : offset + n] = np.asarray(p.grad).reshape(-1)
            flags[i] = 1
        offset += n
    averaged = group.all_reduce_mean(flat)
    present = averaged[total:] > 0
    offset = 0
    for p, n, has_grad in zip(params, sizes, present):
        if has_grad:
            grad_dtype = p.grad.dtype if p.grad is not None else p.data.dtype
            p.grad = averaged[offset : offset + n].reshape(p.data.shape).astype(grad_dtype, copy=True)
        offset += n
