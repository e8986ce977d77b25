"""Values changed in place between the forward pass and backward() are caught."""

import numpy as np
import pytest

import everyo as eo


def _layer(seed=0):
    rng = np.random.default_rng(seed)
    lin = eo.Linear(3, 2, seed=seed)
    x = eo.tensor(rng.standard_normal((4, 3)).astype(np.float32))
    return lin, x


def test_optimizer_step_between_forward_and_backward_raises_and_changes_nothing():
    lin, x = _layer()
    opt = eo.SGD(lin.parameters(), lr=0.1)
    loss = eo.relu(lin(x)).sum()
    for p in lin.parameters():
        p.grad = np.ones_like(p.data)
    before = [p.data.copy() for p in lin.parameters()]
    # The graph holds the parameters' arrays (read-only): the step is refused before it changes any.
    with pytest.raises(eo.EveryOInPlaceError, match=r"SGD.step\(\): a parameter .* is still held by a forward pass"):
        opt.step()
    assert all(np.array_equal(b, p.data) for b, p in zip(before, lin.parameters()))
    assert issubclass(eo.EveryOInPlaceError, RuntimeError)
    # A .data assignment (a new array, not a write) is still caught by backward, before any gradient.
    opt.zero_grad()
    lin.weight.data = lin.weight.data - 0.1
    with pytest.raises(
        eo.EveryOInPlaceError,
        match=r"backward through linear: its input 1 \(a Parameter of shape "
        r"\(3, 2\), float32\) was changed in place",
    ):
        loss.backward()
    assert all(p.grad is None for p in lin.parameters())


@pytest.mark.parametrize(
    "change",
    [
        lambda w: setattr(w, "data", w.data * 2),
        lambda w: w.__setattr__("data", np.zeros_like(w.data)),
    ],
)
def test_data_assignment_raises(change):
    w = eo.Parameter(np.array([1.0, 2.0, 3.0]))
    y = (w * w).sum()
    change(w)
    with pytest.raises(eo.EveryOInPlaceError, match=r"backward through mul: its input 0 \(a Parameter of shape \(3,\)"):
        y.backward()


@pytest.mark.parametrize(
    "write",
    [
        lambda w: exec("w.data -= 1", {"w": w}),
        lambda w: w.data.__setitem__(1, 7.0),
        lambda w: np.add(w.data, 1.0, out=w.data),
    ],
)
def test_a_direct_write_into_a_saved_parameter_fails_at_the_writing_line(write):
    w = eo.Parameter(np.array([1.0, 2.0, 3.0]))
    y = (w * w).sum()
    with pytest.raises(ValueError, match="read-only"):
        write(w)
    np.testing.assert_array_equal(w.data, [1.0, 2.0, 3.0])
    y.backward()  # the graph frees the array: the update after backward works
    w.data -= 0.5 * w.grad
    np.testing.assert_allclose(w.data, [0.0, 0.0, 0.0])


def test_a_graph_dropped_without_backward_frees_the_array():
    w = eo.Parameter(np.array([1.0, 2.0]))
    y = eo.tanh(w * 3.0)
    assert not w.data.flags.writeable
    del y  # an inference pass without no_grad, thrown away
    w.data[0] = 5.0
    assert w.data[0] == 5.0


def test_inplace_method_on_a_held_parameter_names_the_eo_reason():
    w = eo.Parameter(np.array([1.0, 2.0]))
    y = (w * w).sum()
    with eo.no_grad(), pytest.raises(eo.EveryOInPlaceError, match=r"Tensor.add_: .* saved by a recorded op"):
        w.add_(1.0)
    y.backward()
    with eo.no_grad():
        w.add_(1.0)
    np.testing.assert_allclose(w.data, [2.0, 3.0])


@pytest.mark.parametrize(
    "method,args", [("add_", (1.0,)), ("mul_", (2.0,)), ("copy_", (np.zeros(3),)), ("fill_", (5.0,)), ("zero_", ())]
)
def test_inplace_methods_bump_the_version(method, args):
    x = eo.tensor(np.array([1.0, 2.0, 3.0]))  # needs no grad, but mul saved it for w's gradient
    w = eo.Parameter(np.array([0.5, 0.5, 0.5]))
    y = (x * w).sum()
    getattr(x, method)(*args)
    with pytest.raises(
        eo.EveryOInPlaceError, match=r"its input 0 \(a Tensor that does not require grad of shape \(3,\)"
    ):
        y.backward()


def test_inplace_methods_compute_like_numpy():
    a = np.arange(6.0, dtype=np.float32).reshape(2, 3)
    t = eo.tensor(a.copy())
    assert t.add_(eo.tensor(np.ones(3, dtype=np.float32)), alpha=2) is t
    np.testing.assert_array_equal(t.data, a + 2)
    t.mul_(np.array([1.0, 0.5, 2.0]))
    np.testing.assert_array_equal(t.data, (a + 2) * np.array([1.0, 0.5, 2.0], dtype=np.float32))
    t.copy_(np.array([7, 8, 9]))
    np.testing.assert_array_equal(t.data, np.broadcast_to(np.array([7.0, 8.0, 9.0]), (2, 3)))
    t.fill_(-1.5)
    assert np.all(t.data == -1.5) and t.data.dtype == np.float32
    t.zero_()
    assert not t.data.any()


def test_inplace_method_on_a_tensor_that_requires_grad_needs_no_grad():
    w = eo.Parameter(np.ones(2))
    with pytest.raises(eo.EveryOInPlaceError, match=r"Tensor.add_: this tensor .* requires grad.*eo.no_grad\(\)"):
        w.add_(1.0)
    with eo.no_grad():
        w.add_(1.0)
    np.testing.assert_array_equal(w.data, [2.0, 2.0])


def test_a_legitimate_training_loop_runs_and_learns():
    rng = np.random.default_rng(1)
    x = eo.tensor(rng.standard_normal((64, 5)).astype(np.float32))
    y = eo.tensor((x.data @ rng.standard_normal((5, 1))).astype(np.float32))
    model = eo.Sequential(eo.Linear(5, 16, seed=0), eo.BatchNorm1D(16), eo.ReLU(), eo.Linear(16, 1, seed=1))
    opt = eo.Adam(model.parameters(), lr=0.01)
    scheduler = eo.optim.lr_scheduler.StepLR(opt, step_size=20)
    losses = []
    for _ in range(60):
        opt.zero_grad()
        loss = eo.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        scheduler.step()
        losses.append(loss.item())
    assert losses[-1] < 0.2 * losses[0]


def test_retain_graph_second_backward_after_a_change_raises():
    w = eo.Parameter(np.array([1.0, -2.0]))
    x = eo.tensor(np.array([3.0, 4.0]))
    loss = (eo.tanh(x * w)).sum()
    loss.backward(retain_graph=True)
    first = w.grad.copy()
    loss.backward(retain_graph=True)  # nothing changed: fine, and the gradient doubles
    np.testing.assert_allclose(w.grad, 2 * first)
    opt = eo.SGD([w], lr=0.1)
    with pytest.raises(eo.EveryOInPlaceError, match="retain_graph=True"):
        opt.step()  # the retained graph still holds w
    w.data = w.data - 0.1  # a new array: seen by the version check
    with pytest.raises(eo.EveryOInPlaceError, match="backward through mul"):
        loss.backward()


def test_a_changed_output_is_caught():
    x = eo.Parameter(np.array([0.0, 1.0]))
    y = eo.exp(x)
    y.data = y.data + 1  # exp's backward multiplies by its saved output
    with pytest.raises(eo.EveryOInPlaceError, match=r"backward through exp: its output \(an intermediate Tensor"):
        y.sum().backward()


def test_ops_that_read_no_input_value_let_a_change_through():
    a, b = eo.Parameter(np.array([1.0, 2.0])), eo.Parameter(np.array([3.0, 4.0]))
    s = (a + b).sum() - eo.mean(-b)
    with eo.no_grad():
        b.mul_(10.0)
    s.backward()
    np.testing.assert_allclose(a.grad, [1.0, 1.0])
    np.testing.assert_allclose(b.grad, [1.5, 1.5])


def test_a_view_of_a_parameter_saved_downstream_is_caught_at_the_view():
    # Tied weights: the matmul saved a transposed view of w; stepping w changes it through the view.
    w = eo.Parameter(np.arange(6.0).reshape(2, 3))
    h = eo.tensor(np.ones((4, 3)))
    out = (h @ w.transpose()).sum()
    with pytest.raises(ValueError, match="read-only"):
        w.data -= 1.0  # refused at this line: the graph holds w
    w.data = w.data - 1.0  # a new array: the version check catches it in backward
    with pytest.raises(eo.EveryOInPlaceError, match="backward through transpose: its input 0 \\(a Parameter"):
        out.backward()


def test_eo_grad_checks_too():
    w = eo.Parameter(np.array([2.0]))
    y = (w * w).sum()
    w.data = np.array([5.0])
    with pytest.raises(eo.EveryOInPlaceError, match="mul"):
        eo.grad(y, w)


def test_a_hook_that_changes_a_saved_value_during_backward_is_caught():
    w = eo.Parameter(np.array([1.0, 2.0]))
    z = eo.exp(w * w)

    def meddle(grad):
        with eo.no_grad():
            w.add_(1.0)  # mul (which saved w) has not run its backward yet

    z.register_hook(meddle)
    with pytest.raises(eo.EveryOInPlaceError, match=r"Tensor.add_: .* saved by a recorded op"):
        z.sum().backward()


def test_stepping_a_parameter_once_its_gradient_is_complete_is_fine():
    # The optimizer-in-backward pattern: every op that saved w has run by the time its hook fires.
    w = eo.Parameter(np.array([1.0, 2.0]))
    u = eo.Parameter(np.array([0.5, 0.5]))
    opt = eo.SGD([w], lr=0.1)
    w.register_post_accumulate_grad_hook(lambda p: opt.step())
    loss = (eo.exp(w * u) * u).sum()
    loss.backward()
    np.testing.assert_allclose(w.data, [1.0, 2.0] - 0.1 * 0.25 * np.exp([0.5, 1.0]))
    np.testing.assert_allclose(u.grad, np.exp([0.5, 1.0]) * ([1.0, 2.0] * np.array([0.5, 0.5]) + 1))


def test_detect_inplace_writes_catches_direct_writes_into_the_array():
    w = eo.Parameter(np.array([1.0, 2.0, 3.0]))
    x = eo.tensor(np.array([0.5, 1.0, 1.5]))  # needs no grad: its array is not made read-only
    with eo.autograd.detect_inplace_writes():
        y = eo.tanh(x * w).sum()
        x.data[1] = 7.0  # no version bump: only the saved copy shows it
        with pytest.raises(
            eo.EveryOInPlaceError,
            match=r"backward through mul: its input 0 \(a Tensor that does not require grad of shape "
            r"\(3,\), float64\) was written into directly",
        ):
            y.backward()
    assert eo.autograd.snapshots is None


def test_detect_inplace_writes_catches_a_write_through_a_view_and_an_output():
    x = eo.tensor(np.arange(6.0).reshape(2, 3))
    w = eo.Parameter(np.ones(6))
    with eo.autograd.detect_inplace_writes():
        flat = x.reshape(-1)
        y = (eo.exp(flat * w) * 1.0).sum()
        np.multiply(x.data, 2.0, out=x.data)  # writes flat's memory too
        with pytest.raises(eo.EveryOInPlaceError, match=r"backward through mul: its input 0"):
            y.backward()


def test_detect_inplace_writes_lets_a_clean_loop_and_value_free_ops_through():
    lin, x = _layer(3)
    opt = eo.SGD(lin.parameters(), lr=0.1, momentum=0.9)
    b = eo.Parameter(np.ones(2, dtype=np.float32))
    with eo.autograd.detect_inplace_writes():
        for _ in range(3):
            opt.zero_grad()
            b.grad = None
            s = lin(x) + b
            b.data[0] = 2.0  # add's gradient does not depend on b
            s.sum().backward()
            opt.step()
    assert np.all(b.grad == 4.0)  # one per row


def test_concatenate_and_stack_let_a_change_through():
    a, b = eo.Parameter(np.array([1.0, 2.0])), eo.Parameter(np.array([3.0]))
    s = eo.concatenate([a, b]).sum() + eo.stack([a, a]).sum()
    with eo.no_grad():
        b.fill_(0.0)
        a.zero_()
    s.backward()
    np.testing.assert_allclose(a.grad, [3.0, 3.0])
    np.testing.assert_allclose(b.grad, [1.0])
