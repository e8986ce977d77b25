"""The dtype rule for mixed operands (issue 28), over every binary op and
every pair of {bool, int32, int64, float16, bfloat16, float32}:

- an integer or bool operand with a floating one takes the floating dtype
  (PyTorch and JAX; NumPy would give float64 for int32/int64 with float32);
- two floating types promote as PyTorch does (float16 with bfloat16: float32);
- integer / integer is float32 (true division, PyTorch's default dtype);
- a Python number is weakly typed: it takes the other operand's dtype, and a
  float with an integer tensor gives float32;
- float64 appears only when a float64 operand is given.
"""

import itertools

import numpy as np
import pytest

import everyo as eo

try:  # bfloat16 comes with ml_dtypes (everyo-core[amp]); the lowest-versions cell has none
    import ml_dtypes

    BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:
    BF16 = None
F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
DTYPES = [d for d in (np.dtype(bool), np.dtype(np.int32), np.dtype(np.int64), F16, BF16, F32) if d is not None]
FLOATS = {d for d in (F16, BF16, F32, F64) if d is not None}
RANK = {F16: 0, BF16: 0, F32: 1, F64: 2}

BINARY = {
    "add": eo.add,
    "sub": eo.sub,
    "mul": eo.mul,
    "div": eo.div,
    "pow": eo.pow,
    "maximum": eo.maximum,
    "minimum": eo.minimum,
    "matmul": eo.matmul,
    "where": lambda a, b: eo.where(np.array([[True, False], [False, True]]), a, b),
}


def expected(op, a, b):
    fa, fb = a in FLOATS, b in FLOATS
    if fa and fb:
        if a == b:
            return a
        if RANK[a] == RANK[b]:  # float16 with bfloat16
            return np.dtype(np.float32)
        return a if RANK[a] > RANK[b] else b
    if fa or fb:
        return a if fa else b
    if op == "div":
        return np.dtype(np.float32)
    return np.result_type(a, b)  # integer promotion (int32 with int64: int64)


def operand(dtype, kind):
    values = np.array([[1, 2], [3, 1]]).astype(dtype)
    if kind == "tensor":
        return eo.tensor(values)
    return values  # a NumPy array


CASES = [
    (op, a, b, kinds)
    for op in BINARY
    for a, b in itertools.product(DTYPES, DTYPES)
    for kinds in (("tensor", "tensor"), ("tensor", "array"), ("array", "tensor"))
    # bool - bool and bool ** bool: refused by PyTorch (NumPy refuses the first, gives int8 for the second)
    if not (op in ("sub", "pow") and a == b == np.dtype(bool))
]


@pytest.mark.parametrize(
    "op,a,b,kinds", CASES, ids=[f"{c[0]}-{c[1].name}-{c[2].name}-{c[3][0][0]}{c[3][1][0]}" for c in CASES]
)
def test_binary_op_dtype_table(op, a, b, kinds):
    out = BINARY[op](operand(a, kinds[0]), operand(b, kinds[1]))
    assert out.dtype == expected(op, a, b), (op, a, b, kinds, out.dtype)


SCALAR_CASES = [
    (op, dtype, number)
    for op in sorted(BINARY)
    for dtype in DTYPES
    for number in (2, 2.5, True)
    # matmul takes no scalar; bool - bool and bool ** bool: see CASES
    if op != "matmul" and not (op in ("sub", "pow") and dtype == np.dtype(bool) and number is True)
]


@pytest.mark.parametrize("op,dtype,number", SCALAR_CASES, ids=[f"{o}-{d.name}-{n!r}" for o, d, n in SCALAR_CASES])
def test_python_numbers_are_weakly_typed(op, dtype, number):
    x = operand(dtype, "tensor")
    for out in (BINARY[op](x, number), BINARY[op](number, x)):
        if dtype in FLOATS:
            want = dtype
        elif isinstance(number, float) or op == "div":
            want = np.dtype(np.float32)
        else:
            want = np.result_type(dtype, number)
        assert out.dtype == want, (op, dtype, number, out.dtype)


def test_float64_only_from_a_float64_operand():
    x64 = eo.tensor(np.ones(3))
    assert (x64 + np.arange(3, dtype=np.int64)).dtype == np.float64
    assert (eo.ones(3) + np.arange(3)).dtype == np.float32
    assert eo.div(np.arange(1, 4), np.arange(1, 4)).dtype == np.float32


def test_the_values_are_those_of_the_float_computation():
    ints = np.arange(5, dtype=np.int64)
    out = eo.add(ints, eo.ones(5))
    np.testing.assert_array_equal(out.data, np.arange(1, 6, dtype=np.float32))
    np.testing.assert_allclose(eo.div(np.array([1, 7]), np.array([3, 2])).data, [1 / 3, 3.5], rtol=1e-7)


def test_gradients_flow_to_the_floating_operand_only():
    w = eo.tensor(np.ones(3, np.float32), requires_grad=True)
    (w * np.array([1, 2, 3], dtype=np.int64)).sum().backward()
    assert w.grad.dtype == np.float32
    np.testing.assert_array_equal(w.grad.data, [1, 2, 3])


def test_matches_torch_promotion():
    torch = pytest.importorskip("torch")
    tdt = {
        np.dtype(bool): torch.bool,
        np.dtype(np.int32): torch.int32,
        np.dtype(np.int64): torch.int64,
        F16: torch.float16,
        BF16: torch.bfloat16,
        F32: torch.float32,
    }
    back = {v: k for k, v in tdt.items()}
    for a, b in itertools.product(DTYPES, DTYPES):
        for op, tfn in (("add", torch.add), ("mul", torch.mul), ("div", torch.div), ("maximum", torch.maximum)):
            ours = BINARY[op](operand(a, "tensor"), operand(b, "tensor")).dtype
            theirs = tfn(torch.ones(2, dtype=tdt[a]), torch.ones(2, dtype=tdt[b])).dtype
            assert ours == back[theirs], (op, a, b, ours, theirs)
