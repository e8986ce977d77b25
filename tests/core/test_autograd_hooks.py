"""Gradient hooks, end-of-backward callbacks, retain_graph and eo.grad."""

import inspect

import numpy as np
import pytest

import everyo as eo
from everyo import autograd


def _mlp_loss(x, w1, w2):
    return ((eo.relu(x @ w1) @ w2) ** 2).sum()


def _params(seed=0):
    rng = np.random.default_rng(seed)
    x = eo.tensor(rng.standard_normal((5, 4)))
    w1 = eo.tensor(rng.standard_normal((4, 3)), requires_grad=True)
    w2 = eo.tensor(rng.standard_normal((3, 2)), requires_grad=True)
    return x, w1, w2


def test_register_hook_sees_the_gradient_and_can_replace_it():
    x = eo.tensor([1.0, 2.0, 3.0], requires_grad=True)
    h = x * 2.0
    seen = []
    h.register_hook(lambda g: seen.append(g.copy()))
    x.register_hook(lambda g: g * 10)
    (h * h).sum().backward()
    np.testing.assert_array_equal(seen[0], 2 * np.array([2.0, 4.0, 6.0], np.float32))
    # d/dx sum((2x)^2) = 8x, replaced by 10x that before accumulation
    np.testing.assert_array_equal(x.grad, 80 * np.array([1.0, 2.0, 3.0], np.float32))


def test_hook_handle_removes_the_hook():
    x = eo.tensor([1.0], requires_grad=True)
    handle = x.register_hook(lambda g: g * 0)
    handle.remove()
    handle.remove()  # twice is harmless
    (x * 3.0).sum().backward()
    np.testing.assert_array_equal(x.grad, [3.0])


def test_post_accumulate_hook_runs_once_with_the_complete_gradient():
    x, w1, w2 = _params()
    calls = []
    for name, p in (("w1", w1), ("w2", w2)):
        p.register_post_accumulate_grad_hook(lambda t, name=name: calls.append((name, t.grad.copy())))
    # w1 is used twice: the hook must see the sum of both contributions, once.
    loss = _mlp_loss(x, w1, w2) + (w1 * w1).sum()
    loss.backward()
    assert [c[0] for c in calls] == ["w2", "w1"]  # reverse order of use: w2 is complete first
    reference = eo.grad(_mlp_loss(x, w1, w2) + (w1 * w1).sum(), [w1, w2])
    np.testing.assert_array_equal(calls[1][1], reference[0])
    np.testing.assert_array_equal(calls[0][1], reference[1])


def test_post_accumulate_hook_only_on_leaves():
    x = eo.tensor([1.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="leaves"):
        (x * 2.0).register_post_accumulate_grad_hook(lambda t: None)
    with pytest.raises(RuntimeError, match="does not require grad"):
        eo.tensor([1.0]).register_hook(lambda g: None)


def test_queue_callback_runs_after_the_whole_pass_in_order():
    x, w1, w2 = _params()
    events = []

    def on_w2(t):
        events.append("w2 hook")
        autograd.queue_callback(lambda: events.append(("first", w1.grad is not None)))
        autograd.queue_callback(lambda: events.append("second"))

    w2.register_post_accumulate_grad_hook(on_w2)
    w1.register_post_accumulate_grad_hook(lambda t: events.append("w1 hook"))
    _mlp_loss(x, w1, w2).backward()
    # Callbacks run after every gradient is in place (w1's included), in order.
    assert events == ["w2 hook", "w1 hook", ("first", True), "second"]


def test_queue_callback_outside_backward_is_an_error():
    with pytest.raises(RuntimeError, match="during a backward pass"):
        autograd.queue_callback(lambda: None)


def test_retain_graph_allows_a_second_backward_with_the_same_result():
    x, w1, w2 = _params()
    loss = _mlp_loss(x, w1, w2)
    loss.backward(retain_graph=True)
    first = w1.grad.copy()
    loss.backward()
    np.testing.assert_allclose(w1.grad, 2 * first, rtol=1e-12)
    with pytest.raises(RuntimeError, match="retain_graph=True"):
        loss.backward()


def test_grad_matches_finite_differences_and_leaves_dot_grad_alone():
    x, w1, w2 = _params(3)
    gw1, gw2 = eo.grad(_mlp_loss(x, w1, w2), [w1, w2])
    assert w1.grad is None and w2.grad is None
    for got, p in ((gw1, w1), (gw2, w2)):
        numeric = np.zeros_like(p.data)
        for i in np.ndindex(p.data.shape):
            orig = p.data[i]
            p.data[i] = orig + 1e-6
            up = float(_mlp_loss(x, w1, w2).data)
            p.data[i] = orig - 1e-6
            down = float(_mlp_loss(x, w1, w2).data)
            p.data[i] = orig
            numeric[i] = (up - down) / 2e-6
        np.testing.assert_allclose(got, numeric, rtol=1e-6, atol=1e-8)


def test_grad_of_an_intermediate_and_with_grad_outputs():
    x = eo.tensor([1.0, -2.0, 3.0], requires_grad=True)
    h = x * 3.0
    y = eo.tanh(h)
    g = np.array([1.0, 2.0, 3.0], np.float32)
    (dh,) = eo.grad(y, h, grad_outputs=g, retain_graph=True)
    np.testing.assert_allclose(dh, g * (1 - np.tanh(h.data) ** 2), rtol=1e-6)
    (dx,) = eo.grad(y, x, grad_outputs=g)
    np.testing.assert_allclose(dx, 3 * dh, rtol=1e-6)


def test_grad_unused_input():
    x = eo.tensor([1.0], requires_grad=True)
    z = eo.tensor([2.0], requires_grad=True)
    with pytest.raises(ValueError, match="not used"):
        eo.grad((x * 2.0).sum(), [x, z], retain_graph=True)
    dx, dz = eo.grad((x * 2.0).sum(), [x, z], allow_unused=True)
    assert dz is None and dx[0] == 2.0


def test_engine_names_no_float16_type():
    source = inspect.getsource(autograd)
    assert "Rounded" not in source and "float16" not in source and "everyo.half" not in source
