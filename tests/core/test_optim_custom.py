"""The public optimizer base class (eo.optim.Optimizer: defaults, param_groups,
state, update) and the optimizers written on it: Adadelta, Adagrad, NAdam,
each matched against torch.optim over 20 steps (where torch is installed)."""

import numpy as np
import pytest

import everyo as eo
from everyo.optim import lr_scheduler as sched


class SignSGD(eo.optim.Optimizer):
    """No declared hyperparameters: the defaults must still reach param_groups."""

    def __init__(self, params, lr=0.1, shrink=0.0):
        super().__init__(params, {"lr": lr, "shrink": shrink})

    def update(self, param, grad, state, group):
        state["step"] = state.get("step", 0) + 1
        state["last"] = np.sign(grad)
        param.data = param.data * (1 - group["shrink"]) - group["lr"] * np.sign(grad)


def test_custom_optimizer_defaults_groups_and_schedules():
    w, b = eo.Parameter(np.array([1.0, -2.0, 0.5])), eo.Parameter(np.array([3.0]))
    opt = SignSGD([{"params": [w]}, {"params": [b], "lr": 0.5}], lr=0.25)
    assert [g["lr"] for g in opt.param_groups] == [0.25, 0.5]
    assert all(g["shrink"] == 0.0 for g in opt.param_groups) and opt.defaults == {"lr": 0.25, "shrink": 0.0}
    schedule = sched.StepLR(opt, step_size=1, gamma=0.5)  # refused before: no "lr" in the groups
    (w * w).sum().backward()
    opt.step()  # b has no gradient: not updated, no state
    np.testing.assert_array_equal(w.data, [0.75, -1.75, 0.25])
    assert b.data.tolist() == [3.0] and 1 not in opt.state
    schedule.step()
    assert [g["lr"] for g in opt.param_groups] == [0.125, 0.25]
    saved = opt.state_dict()
    other = SignSGD([{"params": [w]}, {"params": [b], "lr": 0.5}], lr=0.25)
    other.load_state_dict(saved)
    assert [g["lr"] for g in other.param_groups] == [0.125, 0.25]
    assert other.state[0]["step"] == 1
    np.testing.assert_array_equal(other.state[0]["last"], [1.0, -1.0, 1.0])
    opt.zero_grad()
    assert w.grad is None


def test_update_must_be_overridden_and_defaults_checked():
    class Bare(eo.optim.Optimizer):
        def __init__(self, params):
            super().__init__(params, {"lr": 1.0})

    p = eo.Parameter(np.ones(2))
    p.grad = np.ones(2)
    with pytest.raises(NotImplementedError, match=r"override update\(param, grad, state, group\)"):
        Bare([p]).step()

    class Checked(eo.optim.Optimizer):
        hyperparameters = {"lr": eo.optim.hyper.Real()}

        def __init__(self, params, lr):
            super().__init__(params, {"lr": lr})

    with pytest.raises(ValueError, match="Checked: lr in the defaults must be a finite number >= 0"):
        Checked([p], lr=-1.0)
    with pytest.raises(TypeError, match=r"lr in param group 1 must be a real number"):
        Checked([{"params": [p]}, {"params": [eo.Parameter(np.ones(1))], "lr": "fast"}], lr=1.0)


CONFIGS = {
    "adadelta": lambda lib: lib.Adadelta,
    "adagrad": lambda lib: lib.Adagrad,
    "nadam": lambda lib: lib.NAdam,
}
KWARGS = {
    "adadelta": [{}, {"lr": 0.5, "rho": 0.8, "eps": 1e-5, "weight_decay": 0.1}],
    "adagrad": [{}, {"lr": 0.05, "lr_decay": 0.01, "weight_decay": 0.05, "initial_accumulator_value": 0.2}],
    "nadam": [
        {},
        {"lr": 0.01, "betas": (0.8, 0.95), "weight_decay": 0.1, "momentum_decay": 0.01},
        {"lr": 0.01, "weight_decay": 0.1, "decoupled_weight_decay": True},
    ],
}
CASES = [(name, k, schedule) for name in KWARGS for k in range(len(KWARGS[name])) for schedule in (False, True)]


def _run(name, kwargs, schedule, lib, make, grads):
    params = make()
    opt = CONFIGS[name](lib)([{"params": params[:1]}, {"params": params[1:], "lr": 0.003}], **kwargs)
    scheduler = None
    if schedule:
        scheduler = (sched if lib is eo.optim else lib.lr_scheduler).StepLR(opt, step_size=5, gamma=0.5)
    for step_grads in grads:
        for p, g in zip(params, step_grads):
            p.grad = g
        opt.step()
        if scheduler is not None:
            scheduler.step()
    return params, opt


@pytest.mark.parametrize("name,k,schedule", CASES)
def test_new_optimizers_match_torch(name, k, schedule):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(k)
    init = [rng.standard_normal(s) for s in ((4, 3), (3,))]
    grads = [[rng.standard_normal(w.shape) for w in init] for _ in range(20)]
    ours, _ = _run(name, KWARGS[name][k], schedule, eo.optim, lambda: [eo.Parameter(w.copy()) for w in init], grads)
    theirs, _ = _run(
        name,
        KWARGS[name][k],
        schedule,
        torch.optim,
        lambda: [torch.tensor(w.copy(), requires_grad=True) for w in init],
        [[torch.tensor(g) for g in gs] for gs in grads],
    )
    # NAdam: torch keeps its running product of mu in float32 (we keep a float64).
    rtol = 1e-6 if name == "nadam" else 1e-10
    for p, t in zip(ours, theirs):
        np.testing.assert_allclose(p.data, t.detach().numpy(), rtol=rtol, atol=1e-12)


@pytest.mark.parametrize("name", sorted(KWARGS))
def test_new_optimizers_resume_from_a_state_dict(name):
    rng = np.random.default_rng(3)
    init = [rng.standard_normal(s) for s in ((4, 3), (3,))]
    grads = [[rng.standard_normal(w.shape) for w in init] for _ in range(10)]
    kwargs = KWARGS[name][-1]
    straight, _ = _run(name, kwargs, False, eo.optim, lambda: [eo.Parameter(w.copy()) for w in init], grads)
    first, opt = _run(name, kwargs, False, eo.optim, lambda: [eo.Parameter(w.copy()) for w in init], grads[:4])
    saved = opt.state_dict()
    params = [eo.Parameter(p.data.copy()) for p in first]
    resumed = CONFIGS[name](eo.optim)([{"params": params[:1]}, {"params": params[1:], "lr": 0.003}], **kwargs)
    resumed.load_state_dict(saved)
    for step_grads in grads[4:]:
        for p, g in zip(params, step_grads):
            p.grad = g
        resumed.step()
    for a, b in zip(params, straight):
        np.testing.assert_array_equal(a.data, b.data)
    assert not np.array_equal(params[0].data, init[0])


def test_new_optimizers_minimise_a_quadratic():
    # Without torch: each one drives a convex quadratic towards its minimum.
    target = np.array([1.0, -2.0, 3.0])
    for make in (
        lambda ps: eo.optim.Adadelta(ps, lr=1.0),
        lambda ps: eo.optim.Adagrad(ps, lr=0.5),
        lambda ps: eo.optim.NAdam(ps, lr=0.1),
    ):
        w = eo.Parameter(np.zeros(3))
        opt = make([w])
        start = float(((w - target) ** 2).sum().item())
        for _ in range(300):
            opt.zero_grad()
            ((w - eo.tensor(target)) ** 2).sum().backward()
            opt.step()
        assert float(((w - target) ** 2).sum().item()) < 0.3 * start, type(opt).__name__
