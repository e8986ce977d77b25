"""``einsum``: Einstein summation over Tensors, differentiable in every operand.

The gradient of operand ``i`` is itself an einsum: the output gradient
contracted with the other operands, producing operand ``i``'s subscripts.
Letters that appear only in operand ``i`` (summed away by the forward) are
broadcast back; a letter repeated in operand ``i`` (a diagonal) gets its
gradient on that diagonal. Runs in float16 under autocast, like matmul.
"""

from __future__ import annotations

import string
from typing import TYPE_CHECKING

import numpy as np

from everyo import _blas
from everyo.dispatch import LOW_PRECISION, primitive
from everyo.errors import EveryOShapeError
from everyo.functional import _t
from everyo.tensor import Tensor

if TYPE_CHECKING:
    from everyo._typing import TensorLike

__all__ = ["einsum"]


def _parse(subscripts, operands):
    """(terms, output) with every axis named by a letter: ``...`` becomes
    letters no term uses (the same ones, right-aligned, in every operand that
    has it), so the equation is also a valid ONNX ``Einsum`` one."""
    spec = subscripts.replace(" ", "")
    inputs, arrow, output = spec.partition("->")
    terms = inputs.split(",")
    if len(terms) != len(operands):
        raise EveryOShapeError(f"einsum: {subscripts!r} names {len(terms)} operands, got {len(operands)}")
    spare = [c for c in string.ascii_uppercase + string.ascii_lowercase if c not in spec]
    widths = []
    for term, t in zip(terms, operands):
        if "..." in term:
            widths.append(t.data.ndim - (len(term) - 3))
            if widths[-1] < 0:
                raise EveryOShapeError(
                    f"einsum: term {term!r} names {len(term) - 3} axes besides '...' but its operand has shape "
                    f"{t.data.shape} (rank {t.data.ndim})"
                )
    ellipsis = "".join(spare[: max(widths, default=0)])
    named = []
    for term, t in zip(terms, operands):
        if "..." in term:
            k = t.data.ndim - (len(term) - 3)
            term = term.replace("...", ellipsis[len(ellipsis) - k :], 1)
        if term and not term.isalpha():
            raise ValueError(f"einsum: subscripts must be letters and '...', got {term!r}")
        if len(term) != t.data.ndim:
            raise EveryOShapeError(
                f"einsum: term {term!r} has {len(term)} letters but its operand has shape "
                f"{t.data.shape} (rank {t.data.ndim})"
            )
        named.append(term)
    if arrow:
        output = output.replace("...", ellipsis, 1)  # without '...', the ellipsis axes are summed (PyTorch)
        if not output.isalpha() and output:
            raise ValueError(f"einsum: output subscripts must be letters and '...', got {output!r}")
        if len(set(output)) != len(output):
            raise ValueError(f"einsum: output {output!r} repeats a letter")
        missing = set(output) - set("".join(named))
        if missing:
            raise ValueError(f"einsum: output letters {sorted(missing)} appear in no operand of {subscripts!r}")
    else:  # implicit mode: '...' first, then letters seen once, in alphabetical order (NumPy's rule)
        joined = "".join(t for t in inputs.split(",")).replace("...", "")
        counts = {c: joined.count(c) for c in joined}
        output = ellipsis + "".join(sorted(c for c, n in counts.items() if n == 1))
    return named, output


def _sizes(terms, datas):
    """Each letter's length; an axis of length 1 broadcasts against a longer one."""
    sizes: dict[str, int] = {}
    for term, d in zip(terms, datas):
        for c, n in zip(term, d.shape):
            if sizes.get(c, 1) == 1:
                sizes[c] = n
            elif n not in (1, sizes[c]):
                raise EveryOShapeError(f"einsum: axis {c!r} has length {sizes[c]} in one place and {n} in another")
    for term, d in zip(terms, datas):
        for c, n in zip(term, d.shape):
            if term.count(c) > 1 and n != sizes[c]:
                raise EveryOShapeError(
                    f"einsum: the repeated axis {c!r} of term {term!r} has unequal lengths {d.shape}"
                )
    return sizes


def _onto(grad, term, unique, sizes):
    """The gradient for ``unique`` (``term``'s letters, once each) placed on
    ``term``'s diagonal where a letter repeats (``ii``); zeros elsewhere."""
    if unique == term:
        return grad
    full = np.zeros(tuple(sizes[c] for c in term), dtype=grad.dtype)
    index = []
    for c in term:
        j = unique.index(c)
        index.append(np.arange(sizes[c]).reshape([-1 if k == j else 1 for k in range(len(unique))]))
    full[tuple(index)] = grad
    return full


@primitive("einsum", LOW_PRECISION, kind="matmul", inputs=("*operands",))
def einsum(subscripts: str, *operands: TensorLike) -> Tensor:
    """Einstein summation, as ``numpy.einsum`` / ``torch.einsum`` (explicit
    ``'ij,jk->ik'`` or implicit ``'ij,jk'``). ``...`` stands for the
    remaining axes (broadcast between operands); a letter repeated within one
    operand takes its diagonal (``'ii->i'``, and ``'ii'`` the trace). As in
    PyTorch, an explicit output without ``...`` sums the ellipsis axes.

    Examples:
        >>> a, b = eo.ones(2, 3), eo.ones(3, 4)
        >>> eo.einsum("ij,jk->ik", a, b).shape
        (2, 4)
        >>> eo.einsum("ii->i", eo.tensor([[1.0, 2.0], [3.0, 4.0]])).tolist()
        [1.0, 4.0]
    """
    tensors = [_t(t) for t in operands]
    terms, output = _parse(subscripts, tensors)
    datas = [t.data for t in tensors]
    sizes = _sizes(terms, datas)
    half = all(d.dtype == np.float16 for d in datas)
    # NumPy's float16 einsum is a slow loop without BLAS: contract in float32, round once.
    work = [d.astype(np.float32) for d in datas] if half else datas
    # Length-1 axes broadcast against longer ones (as NumPy and PyTorch do).
    work = [np.broadcast_to(w, tuple(sizes[c] for c in term)) for w, term in zip(work, terms)]
    with _blas.wide(_blas.OPENBLAS_SINGLE):  # einsum may hand a contraction to OpenBLAS's threads
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
            unique = "".join(dict.fromkeys(term))
            kept = "".join(c for c in unique if c in seen)
            spec = ",".join([output] + [s for s, _ in others]) + "->" + kept
            with _blas.wide(_blas.OPENBLAS_SINGLE):
                part = np.einsum(spec, g, *[w for _, w in others], optimize=len(others) > 1)
            # Letters only this operand had were summed away: every element got the same gradient.
            shape = tuple(sizes[c] if c in seen else 1 for c in unique)
            grad = np.broadcast_to(part.reshape(shape), tuple(sizes[c] for c in unique))
            grad = _onto(grad, term, unique, sizes)
            wide = tuple(k for k, n in enumerate(t.data.shape) if n == 1 and sizes[term[k]] != 1)
            if wide:
                grad = grad.sum(axis=wide, keepdims=True)
            grads.append(grad.astype(np.float16) if half else grad)
        return tuple(grads)

    return Tensor._from_op(out, tuple(tensors), backward)
