"""Letting go of an intermediate result no backward reads (saved activations under autocast).

A graph node holds its inputs as Tensors, so an op's output stays alive as
long as any op that used it does, whether or not that op's backward reads its
values. Under ``autocast`` this keeps float32 arrays that nothing needs: a
post-norm transformer layer's LayerNorm output is used only by a cast to
16 bits (for the next linear layer, which saves the 16-bit copy) and by a
residual ``+`` (whose gradient needs no value), and attention's dropped-out
weights only by their cast to 16 bits for the product with ``V``.

:func:`release_unread` swaps such a tensor's array for a zero-byte stand-in
of the same shape and dtype (what the engine reads of it), once the module
that made it is done with it. It does so only when that is certainly safe:

* every op that has the tensor as an input is found in the graph between it
  and ``root``, and each of them is an op whose backward reads no input value
  (``astype``, ``+``, ``-``, ...: :data:`_READS_NO_VALUE`);
* nothing else refers to the tensor (its reference count is exactly those
  uses plus the caller's one variable): no forward hook, user variable or
  other op kept it, so no one can see the stand-in;
* it is float32 or wider (a 16-bit tensor's float32 copies are rebuilt from
  its values in backward, :mod:`everyo.low_precision`), it is part of a
  recorded graph, and neither a tracer (export) nor
  :class:`~everyo.autograd.detect_inplace_writes` (which compares values) is on.

The values computed, forward and backward, are the same: no backward that
runs reads the released array. In float32 the same places are kept (there the
next linear layer or product reads them), so only autocast saves memory here.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import numpy as np

from everyo import autograd, dispatch
from everyo.half import is_low_precision
from everyo.tensor import Tensor

if TYPE_CHECKING:
    from collections.abc import Iterable

# Backward closures (module.op) that read no input's value: the ones autograd's
# in-place check lets through (add, sub, sum, ...: shapes and requires_grad only)
# and astype (the casts autocast makes). The float16 wrappers of
# :mod:`everyo.low_precision` keep these names.
_READS_NO_VALUE = autograd._READS_NO_INPUT | {"everyo.functional.astype"}

_getrefcount = sys.getrefcount

enabled = True  # tests turn it off to compare the results with and without it


def _op(backward: object) -> str:
    return f"{getattr(backward, '__module__', '')}.{autograd._op_name(backward)}"


def _cells(backward: object, t: Tensor, depth: int = 0) -> int:
    """How many closure cells of ``backward`` (and of backward functions it wraps) hold ``t``:
    add's backward keeps its operands for ``requires_grad``."""
    count = 0
    for cell in getattr(backward, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if value is t:
            count += 1
        elif depth < 2 and callable(value) and getattr(value, "__closure__", None):
            count += _cells(value, t, depth + 1)
    return count


def _uses(t: Tensor, root: Tensor, stop: Iterable[Any]) -> int:
    """How many references the ops between ``t`` and ``root`` hold to ``t`` (input
    slots, and closure cells of the ones that use it), or -1 if one of those ops
    reads its inputs' values. The walk goes from ``root`` back to ``t`` and to the
    tensors in ``stop`` (the module's inputs), not beyond."""
    seen = {id(s) for s in stop}
    seen.add(id(t))
    uses, stack = 0, [root]
    if root is t:
        return -1
    seen.add(id(root))
    while stack:
        node = stack.pop()
        parents = node._parents
        if not parents:
            continue
        reads = _op(node._backward) not in _READS_NO_VALUE
        used = False
        for parent in parents:
            if parent is t:
                if reads:
                    return -1
                uses += 1
                used = True
            elif id(parent) not in seen:
                seen.add(id(parent))
                stack.append(parent)
        if used:
            uses += _cells(node._backward, t)
    return uses


def _references(t: object, uses: int) -> int:
    """References to ``t`` beyond its ``uses`` in the graph (counted with this call chain's own)."""
    return _getrefcount(t) - uses


def _through(t: object) -> int:  # the same call depth as release_unread's
    return _references(t, 0)


def _calibrate() -> int:
    probe = object()  # held by one variable, as the caller holds the tensor it releases
    return _through(probe)


_ONE_VARIABLE = _calibrate()


def release_unread(t: Any, root: Any, stop: Iterable[Any] = ()) -> None:
    """Drop ``t``'s array (keeping its shape and dtype) if no backward can read it.

    Call it with ``t`` held by exactly one variable of the caller, after the
    module computed ``root`` (the result every use of ``t`` led to); ``stop``:
    the module's inputs, where the search for uses of ``t`` ends. See the
    module docstring for the conditions; when one fails, nothing changes.
    """
    if not enabled or not isinstance(t, Tensor) or not isinstance(root, Tensor) or t._backward is None:
        return
    data = t._data
    if is_low_precision(data.dtype) or data.dtype.kind != "f" or data.ndim == 0 or data.strides == (0,) * data.ndim:
        return
    if autograd.snapshots is not None or dispatch._tracer.get() is not None:
        return
    del data
    uses = _uses(t, root, stop)
    if uses <= 0 or _references(t, uses) != _ONE_VARIABLE:
        return
    t._data = np.broadcast_to(np.zeros((), t._data.dtype), t._data.shape)
