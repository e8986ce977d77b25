"""Core's large NumPy passes, offered to everyo-kernels to run as two halves.

Some of a training step's passes over whole activations are plain NumPy calls,
not kernels: a residual ``add``, the gradient sums of a tensor used twice,
softmax's ``exp``, the scaling of attention's queries, the copy of attention's
heads back into rows, the concatenation of Q, K and V's gradients. Each runs on
one thread; on a 2-core machine the other core idles. Where everyo-kernels is
installed and its pair owns the second core (``everyo.kernels.pair``), its
table's ``numpy_halves`` runs such a pass as two halves of the output's first
axis, one on each core. Every value of the output is computed by the same NumPy
loop from the same input values either way (the passes offered here are
position-independent: elementwise ufuncs, copies, concatenations along a later
axis), so the bits are the same; without the kernels, or where the pair does
not own the second core, or below its size, the pass runs whole, here.

Nothing is looked up below :data:`MIN_SIZE` values (``kernel_table.MIN_SIZE``):
a small pass never loads the kernels.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from everyo import kernel_table

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

__all__ = ["run", "copy"]

MIN_SIZE = kernel_table.MIN_SIZE
_FLOATS = kernel_table.FLOAT_DTYPES


def run(fn: Callable[..., Any], args: Sequence[Any], out: np.ndarray) -> np.ndarray:
    """``fn(*args, out=out)``, as two halves on everyo-kernels' pair where that applies; ``out``.

    ``fn`` must compute each value of ``out`` from the values of ``args`` at the
    same position only (an elementwise ufunc, :func:`copy`, a concatenation along
    an axis other than the first): the halves then give the bits of the whole."""
    if out.size >= MIN_SIZE and out.dtype in _FLOATS:
        halves = kernel_table.get("numpy_halves")
        if halves is not None and halves(fn, args, out):
            return out
    fn(*args, out=out)
    return out


def copy(a: np.ndarray, *, out: np.ndarray) -> None:
    """``np.copyto(out, a, casting="unsafe")`` in ``fn(*args, out=)`` form, for :func:`run`."""
    np.copyto(out, a, casting="unsafe")
