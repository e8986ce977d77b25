"""Comparisons are elementwise and boolean (0.1: ``tensor == y`` was Python
identity, silently False), Tensor stays hashable by identity, and truth
values follow NumPy."""

import operator

import numpy as np
import pytest

import everyo as eo
from everyo import dispatch
from everyo.testing import check_gradients

OPS = [operator.eq, operator.ne, operator.lt, operator.le, operator.gt, operator.ge]
A = np.array([[1.0, 2.0, 3.0], [3.0, 2.0, 1.0]], np.float32)
B = np.array([2.0, 2.0, 2.0], np.float32)


@pytest.mark.parametrize("op", OPS, ids=lambda o: o.__name__)
@pytest.mark.parametrize("form", ["tensor-tensor", "tensor-array", "array-tensor", "tensor-scalar", "scalar-tensor"])
def test_elementwise_against_numpy(op, form):
    x = eo.tensor(A, requires_grad=True)
    left, right = {
        "tensor-tensor": (x, eo.tensor(B)),
        "tensor-array": (x, B),
        "array-tensor": (A, eo.tensor(B)),
        "tensor-scalar": (x, 2.0),
        "scalar-tensor": (2.0, x),
    }[form]
    raw = lambda v: v.data if isinstance(v, eo.Tensor) else v  # noqa: E731
    got = op(left, right)
    assert isinstance(got, eo.Tensor) and got.data.dtype == np.bool_
    np.testing.assert_array_equal(got.data, op(raw(left), raw(right)))
    assert not got.requires_grad and got.is_leaf


def test_integer_tensor_against_fractional_scalar():
    i = eo.tensor(np.array([1, 2, 3]))
    np.testing.assert_array_equal((i == 2.5).data, [False, False, False])
    np.testing.assert_array_equal((i < 2.5).data, [True, True, False])
    # Python scalars are weakly typed as in NumPy: int + 2.5 is not int + 2.
    np.testing.assert_array_equal((i + 2.5).data, [3.5, 4.5, 5.5])
    assert (eo.tensor(np.ones(2, np.float16)) * 2.0).dtype == "float16"


def test_hashable_by_identity():
    a, b = eo.tensor([1.0, 2.0]), eo.tensor([1.0, 2.0])
    table = {a: "a", b: "b"}
    assert table[a] == "a" and table[b] == "b" and len({a, b, a}) == 2
    assert hash(a) == object.__hash__(a)


def test_truth_values_follow_numpy():
    with pytest.raises(ValueError, match="truth value of an array with more than one element is ambiguous"):
        bool(eo.tensor([1.0, 2.0]) == eo.tensor([1.0, 2.0]))
    assert bool(eo.tensor([1.0]) == 1.0) and not bool(eo.tensor(0.0))
    assert (eo.tensor([1.0, 2.0]) == eo.tensor([1.0, 2.0])).data.all()


def test_masks_from_comparisons_drive_where():
    x = np.array([[-1.0, 0.5], [2.0, -3.0]])
    check_gradients(lambda t: eo.where(t > 0, t, t * 0.1), [x])
    np.testing.assert_allclose(eo.where(eo.tensor(x) > 0, eo.tensor(x), 0.0).data, np.where(x > 0, x, 0.0))


def test_comparisons_are_table_ops_without_gradient():
    for name in ("equal", "not_equal", "less", "less_equal", "greater", "greater_equal"):
        op = dispatch.OPS[name]
        assert op.kind == "compare" and not op.differentiable and op.category is None


def test_parameters_deduplicate_by_identity():
    # Two parameters with equal values are still two parameters.
    model = eo.Sequential(eo.Linear(2, 2, seed=0), eo.Linear(2, 2, seed=0))
    assert len(list(model.parameters())) == 4
    shared = eo.Linear(2, 2, seed=0)
    assert len(list(eo.Sequential(shared, shared).parameters())) == 2
