import sys

import numpy as np
import pytest

import everyo as eo


def test_gradients_accumulate_across_backward_calls():
    x = eo.tensor([1.0, 2.0], requires_grad=True)
    (x * x).sum().backward()
    (x * 3.0).sum().backward()
    np.testing.assert_allclose(x.grad, [2 + 3, 4 + 3])


def test_shared_subexpression_gets_both_contributions():
    x = eo.tensor([3.0], requires_grad=True)
    y = x * x
    (y + y * 2.0).sum().backward()
    np.testing.assert_allclose(x.grad, [3 * 2 * 3.0])


def test_backward_is_iterative_on_a_long_chain():
    x = eo.tensor([1.0], requires_grad=True)
    y = x
    for _ in range(sys.getrecursionlimit() * 3):
        y = y * 1.0 + 0.0
    y.sum().backward()
    np.testing.assert_allclose(x.grad, [1.0])


def test_graph_is_freed_after_backward():
    x = eo.tensor([1.0, 2.0], requires_grad=True)
    y = (x * x).sum()
    y.backward()
    assert y._parents == ()
    with pytest.raises(RuntimeError, match="second time"):
        mid = x * x
        z = mid.sum()
        z.backward()
        (mid * 1.0).sum().backward()


def test_no_grad_records_nothing_and_restores_state():
    w = eo.tensor([1.0], requires_grad=True)
    with eo.no_grad():
        y = w * 2.0
    assert not y.requires_grad and eo.is_grad_enabled()

    @eo.no_grad()
    def f(t):
        return t * 2.0

    assert not f(w).requires_grad and eo.is_grad_enabled()


def test_retain_grad_on_a_non_leaf():
    x = eo.tensor([1.0, -2.0], requires_grad=True)
    h = (x * 3.0).retain_grad()
    (h * h).sum().backward()
    np.testing.assert_allclose(h.grad, 2 * np.array([3.0, -6.0]))
    np.testing.assert_allclose(x.grad, 2 * np.array([3.0, -6.0]) * 3)


def test_unbroadcast_gives_parameter_shaped_gradients():
    b = eo.tensor(np.zeros((1, 3)), requires_grad=True)
    x = eo.tensor(np.ones((4, 5, 3)))
    (x + b).sum().backward()
    assert b.grad.shape == (1, 3)
    np.testing.assert_allclose(b.grad, 20.0)


def test_backward_on_non_scalar_needs_a_gradient():
    x = eo.tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="scalar"):
        (x * 2.0).backward()
    (x * 2.0).backward(np.array([1.0, 0.5]))
    np.testing.assert_allclose(x.grad, [2.0, 1.0])


def test_tensor_creation_and_dtypes():
    assert eo.tensor([1.0, 2.0]).dtype == "float32"
    assert eo.tensor(np.zeros(2)).dtype == "float64"
    assert eo.tensor([1, 2]).dtype == "int64"
    assert eo.ones(2, 3).shape == (2, 3) and eo.zeros((2, 3)).data.sum() == 0
    assert np.array_equal(eo.randn(3, seed=1).data, eo.randn(3, seed=1).data)
    with pytest.raises(TypeError):
        eo.tensor([1, 2], requires_grad=True)


def test_gradient_dtype_follows_the_tensor():
    w = eo.tensor(np.ones(3, dtype=np.float32), requires_grad=True)
    x = eo.tensor(np.ones(3, dtype=np.float64))
    (w * x).sum().backward()
    assert w.grad.dtype == np.float32
