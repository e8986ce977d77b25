"""16-bit float operands (float16, bfloat16) compute in float32 and round once.

NumPy's float16 loops convert every element on its own (several times slower
than float32, ~40x on subnormals), and ml_dtypes' bfloat16 loops do the same.
The op table (:mod:`everyo.dispatch`) hands every elementwise and reduction
op (and dropout) given such operands to :func:`call_in_float32`: each 16-bit
operand is converted up exactly, as a graph node whose backward rounds the
gradient once back to the operand's type (a :class:`~everyo.half.Rounded`
hand-over); the op's own float32 forward runs on those; its result is rounded
once with the fast conversions of :mod:`everyo.half`, and its backward gets
the incoming 16-bit gradient as float32 values. One place for every op: no
op has a 16-bit twin, and composite forwards (ops calling ops) are covered.

Why that is exact: for +, -, *, / and sqrt, float32's 24 significant bits are
at least twice float16's 11 (bfloat16's 8) plus two, so rounding the float32
result again gives the correctly rounded 16-bit result, NumPy's own. Other
functions give the float32 function rounded once: within one unit in the last
place of NumPy's float16 kernels, which on CPUs with AVX512-FP16 are
half-precision kernels of their own (exp differs on 4 of the 65,536 float16
codes, log on 1, all near rounding ties; tanh on none). Reductions accumulate
in float32, where NumPy's float16 sum and var accumulate in float16.

Mixed operands (a 16-bit with a float32 tensor) promote to float32 as NumPy
does: the 16-bit ones are converted up here, faster than NumPy's cast, and
their gradients are rounded back to their own type.

Examples:
    >>> x = eo.tensor(np.array([1.0, 2.0], np.float16), requires_grad=True)
    >>> y = eo.tanh(x) * x          # each op: float32 inside, one rounding
    >>> y.dtype
    dtype('float16')
"""

import numpy as np

from everyo import _buffers, autograd, dispatch
from everyo.half import _SMALL, Rounded, _down, _half_to_float, _rounded, _up, is_low_precision
from everyo.tensor import Tensor

_F32 = np.dtype(np.float32)


def _is_16bit(value):
    # itemsize first: it turns float32 and wider away with one attribute read
    return isinstance(value, Tensor) and value.data.dtype.itemsize == 2 and is_low_precision(value.data.dtype)


def low_precision_operands(slots, args, kwargs):
    """Whether any Tensor operand (``slots``: the op table's (name, index,
    is_sequence) triples) holds float16 or bfloat16 data."""
    for pname, index, is_sequence in slots:
        if index is not None and index < len(args):
            value = args[index]
        else:
            value = kwargs.get(pname)
        if is_sequence and isinstance(value, (list, tuple)):
            if any(_is_16bit(v) for v in value):
                return True
        elif _is_16bit(value):
            return True
    return False


def call_in_float32(forward, slots, args, kwargs, reads_operands=True, passes_gradient=False, recompute=False):
    """``forward(*args, **kwargs)`` with its 16-bit Tensor operands computed in
    float32 and the result (and the gradients) rounded once; see the module
    docstring. ``slots`` as for :func:`low_precision_operands`.
    ``reads_operands=False`` says the op's backward never reads its operands'
    values (add, tanh, ...): their float32 copies are then not rebuilt for it;
    ``reads_operands="others"`` (mul) that it reads an operand's value only for
    another operand's gradient: a copy is rebuilt only when some other operand
    requires grad.
    ``passes_gradient=True`` says each operand's gradient is the incoming one
    or its negation, summed over broadcast axes (add, sub, neg): where nothing
    was summed it already holds 16-bit values and is handed on unrounded.
    ``recompute=True`` (unary ops whose backward uses their float32 output:
    tanh, sigmoid, sqrt, exp) keeps no float32 output for backward: backward
    runs the float32 forward again on the rebuilt float32 operand (the same
    values, so the same gradient) and uses that node's backward."""
    args, kwargs = list(args), dict(kwargs)
    ups = {}  # id(16-bit operand) -> (operand, its float32 cast); id(cast) -> the same
    floating = []  # every floating operand's dtype, to find the result's
    for pname, index, is_sequence in slots:
        if index is not None and index < len(args):
            where, key = args, index
        elif pname in kwargs:
            where, key = kwargs, pname
        else:
            continue
        value = where[key]
        if is_sequence and isinstance(value, (list, tuple)):
            where[key] = type(value)(_upcast(v, ups, floating) for v in value)
        else:
            where[key] = _upcast(value, ups, floating)
    low = {d for d in floating if is_low_precision(d)}
    # The result is 16-bit only when every floating operand is of that one
    # 16-bit type (Python scalars are weak, as in NumPy); otherwise it is
    # the wider type the float32 forward already gives.
    target = low.pop() if len(low) == 1 and all(is_low_precision(d) for d in floating) else None
    out = forward(*args, **kwargs)
    if isinstance(out, Tensor):
        again = (forward, args, kwargs) if recompute and target is not None else None
        return _finish(out, ups, target, reads_operands, passes_gradient, again)
    if isinstance(out, (list, tuple)):
        return type(out)(_finish(o, ups, target, reads_operands) if isinstance(o, Tensor) else o for o in out)
    return out


def _upcast(value, ups, floating):
    """A 16-bit Tensor's float32 twin: a graph node whose backward rounds the
    gradient once to the operand's type (so composite forwards, which reach
    the operand through nested ops, are covered too)."""
    if not isinstance(value, Tensor):
        if isinstance(value, np.ndarray) and (value.dtype.kind == "f" or is_low_precision(value.dtype)):
            floating.append(value.dtype)  # a floating array is typed as a Tensor would be (float32 wins)
        return value
    dtype = value.data.dtype
    if dtype.kind == "f" or is_low_precision(dtype):
        floating.append(dtype)
    if not is_low_precision(dtype):
        return value
    if id(value) in ups:  # the same operand twice (x * x): one conversion
        return ups[id(value)][1]
    twin = Tensor._from_op(_up(value.data), (value,), _rounding_backward(dtype))
    ups[id(value)] = ups[id(twin)] = (value, twin)
    return twin


def _rounding_backward(dtype):
    def backward(g):
        return (_rounded(g, dtype) if g.dtype == _F32 else g,)

    # The twin is an implicit cast: autograd's messages call it one.
    backward.__qualname__, backward.__module__ = "astype", "everyo.functional"
    return backward


def _placeholder(like):
    """A zero-byte stand-in for a dropped float32 copy: the engine still sees
    its dtype and shape (a gradient is made to match them)."""
    return np.broadcast_to(np.zeros((), like.dtype), like.shape)


def _finish(out, ups, target, reads_operands=True, passes_gradient=False, again=None):
    if id(out) in ups:  # the op handed an operand back (dropout with p=0)
        return ups[id(out)][0]
    if target is not None and out.data.dtype == _F32:
        out._data = _down(out.data, target)  # still construction: not an in-place change
    else:
        target = None  # a boolean or integer result, or a mixed op's float32 one
    if out._backward is None:
        return out
    if autograd.snapshots is not None:
        # detect_inplace_writes is on (debugging): keep the twins as they are
        # and snapshot the output again, now that it holds its 16-bit values.
        autograd.snapshot(out)
        return _wrap_backward(out, (), (), target, False)
    # The float32 twins would keep a float32 copy of every operand alive until
    # backward (add's closure holds its operands just for their shapes), twice
    # the 16-bit operand's memory: drop their arrays now (a zero-byte
    # placeholder keeps dtype and shape) and, for an op whose backward reads
    # them, rebuild them from the 16-bit operands when backward reaches it.
    # (Arrays a closure captured itself, like exp's output, stay as they are.)
    twins = tuple({id(twin): (operand, twin) for operand, twin in ups.values()}.values())
    stubs = []
    for _, twin in twins:
        twin._data = _placeholder(twin._data)
        stubs.append(twin._data)
    if passes_gradient and target is not None:
        return _pass_through(out, ups)
    if again is not None:
        return _recomputing(out, twins, stubs, again)
    return _wrap_backward(out, twins, stubs, target, reads_operands)


def _recomputing(out, twins, stubs, again):
    """``out``'s backward without the float32 arrays its closure saved: the
    op's float32 forward runs again in backward (see :func:`call_in_float32`)."""
    forward, args, kwargs = again
    name = getattr(out._backward, "__qualname__", None)
    module = getattr(out._backward, "__module__", None)

    def backward(g):
        for (operand, twin), stub in zip(twins, stubs):
            if twin._data is stub:
                twin._data = _up(operand.data)
        with autograd.enable_grad():
            rebuilt = forward(*args, **kwargs)
        return rebuilt._backward(_up(g))

    backward.accepts_deferred = True
    if name is not None:
        backward.__qualname__, backward.__module__ = name, module
    out._backward = backward  # the forward's closure (and its float32 output) goes now
    return out


def _pass_through(out, ups):
    """add, sub, neg with every floating operand of one 16-bit type: the node
    hangs on the 16-bit operands themselves (not on their float32 twins), and
    an operand's gradient that was not summed over broadcast axes -- the
    incoming 16-bit gradient or its negation, exact -- is handed on as a
    :class:`~everyo.half.Rounded` without rounding it again; a summed one is
    rounded once, as the twin would have."""
    operands = []
    for parent in out._parents:
        entry = ups.get(id(parent))
        operands.append(entry[0] if entry is not None and entry[1] is parent else parent)
    out._parents = tuple(operands)
    inner = out._backward

    def backward(g):
        g32 = _up(g)
        grads, handed = [], set()
        for grad, operand in zip(inner(g32), operands):
            if grad is None or not is_low_precision(operand.data.dtype):
                grads.append(grad)
            elif grad.shape == g32.shape:
                if id(grad) in handed:  # add hands one array to both operands: each gets its own
                    grad = _buffers.copy_of(grad)  # recycled: 0.02 ms per 512 KiB copy, 0.22 ms fresh (measured)
                handed.add(id(grad))
                grads.append(Rounded(grad, operand.data.dtype))
            else:
                grads.append(_rounded(grad, operand.data.dtype))
        return tuple(grads)

    backward.accepts_deferred = True
    backward.__qualname__ = getattr(inner, "__qualname__", backward.__qualname__)
    backward.__module__ = getattr(inner, "__module__", backward.__module__)
    out._backward = backward
    return out


def _wrap_backward(out, twins, stubs, target, reads_operands):
    inner = out._backward
    rebuild = tuple(zip(twins, stubs)) if reads_operands else ()
    if reads_operands == "others":  # a value is read only for the gradient of an operand in another position
        parents = out._parents
        read = {id(p) for i, p in enumerate(parents) if any(q.requires_grad for j, q in enumerate(parents) if j != i)}
        rebuild = tuple(pair for pair in rebuild if id(pair[0][1]) in read)

    def backward(g):
        for (operand, twin), stub in rebuild:
            if twin._data is stub:
                twin._data = _up(operand.data)
        return inner(_up(g) if target is not None else g)  # 16-bit g (array or Rounded) as float32 values

    backward.accepts_deferred = target is not None
    # The op's own name, for autograd's messages (in-place errors name the op).
    backward.__qualname__ = getattr(inner, "__qualname__", backward.__qualname__)
    backward.__module__ = getattr(inner, "__module__", backward.__module__)
    out._backward = backward
    return out


def _sum_half(a, b):
    """``a + b`` for two float16 gradient arrays (autograd's ``array_sums``): NumPy's float16
    add converts element by element; the float32 sum rounded once is the same sum, bit for
    bit (see ``Rounded.accumulate``), handed on as a Rounded. Where both are NaN the result
    is NaN, but which payload it keeps is NumPy's float32 add's choice, and NumPy's own
    float16 add keeps a's in NumPy 2.2 and b's in 2.4 (whose float32 add keeps a's in the
    scalar tail and b's in the SIMD body): no payload is promised."""
    if a.size <= _SMALL:
        return np.add(a, b)
    return Rounded(_half_to_float(b)).accumulate(a)


autograd.array_sums[np.dtype(np.float16)] = _sum_half
dispatch.bind_float32_route(low_precision_operands, call_in_float32)
