"""``einsum``: Einstein summation over Tensors, differentiable in every operand.

The gradient of operand ``i`` is itself an einsum: the output gradient
contracted with the other operands, producing operand ``i``'s subscripts.
Letters that appear only in operand ``i`` (summed away by the forward) are
broadcast back. Runs in float16 under autocast, like matmul.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from everyo.dispatch import LOW_PRECISION, primitive
from everyo.errors import EveryOShapeError
from everyo.functional import _t
from everyo.tensor import Tensor

if TYPE_CHECKING:
    from everyo._typing import TensorLike

__all__ = ["einsum"]


def _parse(subscripts, operands):
    spec = subscripts.replace(" ", "")
    if "." in spec:
        raise NotImplementedError("einsum: '...' (ellipsis) subscripts are not supported yet; name every axis")
    inputs, arrow, output = spec.partition("->")
    terms = inputs.split(",")
    if len(terms) != len(operands):
        raise EveryOShapeError(f"einsum: {subscripts!r} names {len(terms)} operands, got {len(operands)}")
    for term, t in zip(terms, operands):
        if not term.isalpha() and term:
            raise ValueError(f"einsum: subscripts must be letters, got {term!r}")
        if len(term) != t.data.ndim:
            raise EveryOShapeError(
                f"einsum: term {term!r} has {len(term)} letters but its operand has shape "
                f"{t.data.shape} (rank {t.data.ndim})"
            )
        if len(set(term)) != len(term):
            raise NotImplementedError(
                f"einsum: repeated letters within one operand ({term!r}, a diagonal or trace) are not supported yet"
            )
    if not arrow:  # implicit mode: letters seen once, in alphabetical order (NumPy's rule)
        counts = {c: inputs.count(c) for c in inputs if c != ","}
        output = "".join(sorted(c for c, n in counts.items() if n == 1))
    return terms, output


@primitive("einsum", LOW_PRECISION, kind="matmul", inputs=("*operands",))
def einsum(subscripts: str, *operands: TensorLike) -> Tensor:
    """Einstein summation, as ``numpy.einsum`` (explicit ``'ij,jk->ik'`` or
    implicit ``'ij,jk'``). Ellipsis and repeated letters within one operand
    are not supported.

    Examples:
        >>> a, b = eo.ones(2, 3), eo.ones(3, 4)
        >>> eo.einsum("ij,jk->ik", a, b).shape
        (2, 4)
    """
    tensors = [_t(t) for t in operands]
    terms, output = _parse(subscripts, tensors)
    datas = [t.data for t in tensors]
    half = all(d.dtype == np.float16 for d in datas)
    # NumPy's float16 einsum is a slow loop without BLAS: contract in float32, round once.
    work = [d.astype(np.float32) for d in datas] if half else datas
    out = np.einsum(f"{','.join(terms)}->{output}", *work, optimize=len(work) > 2)
    out = out.astype(np.float16) if half else out

    def backward(g):
        g = g.astype(np.float32) if half else g
        grads = []
        for i, (t, term) in enumerate(zip(tensors, terms)):
            if not t.requires_grad:
                grads.append(None)
                continue
            others = [(terms[j], work[j]) for j in range(len(terms)) if j != i]
            seen = set(output).union(*(set(s) for s, _ in others))
            kept = "".join(c for c in term if c in seen)
            spec = ",".join([output] + [s for s, _ in others]) + "->" + kept
            part = np.einsum(spec, g, *[w for _, w in others], optimize=len(others) > 1)
            # Letters only this operand had were summed away: every element got the same gradient.
            shape = tuple(t.data.shape[k] if c in seen else 1 for k, c in enumerate(term))
            grad = np.broadcast_to(part.reshape(shape), t.data.shape)
            grads.append(grad.astype(np.float16) if half else grad)
        return tuple(grads)

    return Tensor._from_op(out, tuple(tensors), backward)
