"""Optimizers and schedules side by side with PyTorch's (skipped where torch is not installed)."""

import numpy as np
import pytest

import everyo as eo
from everyo.optim import lr_scheduler as sched

torch = pytest.importorskip("torch")

PAIRS = {
    "sgd": (
        lambda ps: eo.SGD(ps, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01),
        lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01),
    ),
    "adam": (
        lambda ps: eo.Adam(ps, lr=0.01, amsgrad=True, weight_decay=0.1),
        lambda ps: torch.optim.Adam(ps, lr=0.01, amsgrad=True, weight_decay=0.1),
    ),
    "adamw": (
        lambda ps: eo.AdamW(ps, lr=0.01, betas=(0.8, 0.9)),
        lambda ps: torch.optim.AdamW(ps, lr=0.01, betas=(0.8, 0.9)),
    ),
    "rmsprop": (
        lambda ps: eo.RMSprop(ps, lr=0.01, momentum=0.5, centered=True, weight_decay=0.01),
        lambda ps: torch.optim.RMSprop(ps, lr=0.01, momentum=0.5, centered=True, weight_decay=0.01),
    ),
}


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_optimizer_matches_torch_with_groups(name):
    ours, theirs = PAIRS[name]
    rng = np.random.default_rng(0)
    init = [rng.standard_normal(s) for s in ((4, 3), (3,))]
    ps = [eo.Parameter(w.copy()) for w in init]
    ts = [torch.tensor(w.copy(), requires_grad=True) for w in init]
    opt = ours([{"params": ps[:1]}, {"params": ps[1:], "lr": 0.003, "weight_decay": 0.0}])
    topt = theirs([{"params": ts[:1]}, {"params": ts[1:], "lr": 0.003, "weight_decay": 0.0}])
    for _ in range(20):
        for p, t in zip(ps, ts):
            g = rng.standard_normal(p.shape)
            p.grad, t.grad = g, torch.tensor(g)
        opt.step()
        topt.step()
    for p, t in zip(ps, ts):
        np.testing.assert_allclose(p.data, t.detach().numpy(), rtol=1e-10, atol=1e-12)


SCHEDULES = {
    "step": (lambda o: sched.StepLR(o, 7, gamma=0.5), lambda o: torch.optim.lr_scheduler.StepLR(o, 7, gamma=0.5)),
    "multistep": (
        lambda o: sched.MultiStepLR(o, [10, 30, 75], 0.3),
        lambda o: torch.optim.lr_scheduler.MultiStepLR(o, [10, 30, 75], 0.3),
    ),
    "exponential": (lambda o: sched.ExponentialLR(o, 0.97), lambda o: torch.optim.lr_scheduler.ExponentialLR(o, 0.97)),
    "cosine": (
        lambda o: sched.CosineAnnealingLR(o, 50, 1e-3),
        lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, 50, 1e-3),
    ),
    "linear": (
        lambda o: sched.LinearLR(o, 0.05, 0.9, 40),
        lambda o: torch.optim.lr_scheduler.LinearLR(o, 0.05, 0.9, 40),
    ),
    "onecycle": (
        lambda o: sched.OneCycleLR(o, max_lr=[1.0, 0.5], total_steps=100, three_phase=True),
        lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=[1.0, 0.5], total_steps=100, three_phase=True),
    ),
    "sequential": (
        lambda o: sched.SequentialLR(
            o, [sched.LinearLR(o, 0.1, total_iters=5), sched.CosineAnnealingLR(o, 60)], milestones=[5]
        ),
        lambda o: torch.optim.lr_scheduler.SequentialLR(
            o,
            [
                torch.optim.lr_scheduler.LinearLR(o, 0.1, total_iters=5),
                torch.optim.lr_scheduler.CosineAnnealingLR(o, 60),
            ],
            milestones=[5],
        ),
    ),
}


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_schedule_matches_torch(name):
    ours, theirs = SCHEDULES[name]
    groups = lambda ps: [{"params": ps[:1], "lr": 0.1}, {"params": ps[1:], "lr": 0.02}]  # noqa: E731
    opt = eo.SGD(groups([eo.Parameter(np.ones(1)), eo.Parameter(np.ones(1))]), momentum=0.9)
    topt = torch.optim.SGD(groups([torch.ones(1, requires_grad=True), torch.ones(1, requires_grad=True)]), momentum=0.9)
    s, ts = ours(opt), theirs(topt)
    for _ in range(99):
        np.testing.assert_allclose(s.get_last_lr(), ts.get_last_lr(), rtol=1e-9)
        np.testing.assert_allclose(
            [g["momentum"] for g in opt.param_groups], [g["momentum"] for g in topt.param_groups], rtol=1e-9
        )
        topt.step()
        s.step()
        ts.step()


def test_reduce_on_plateau_matches_torch():
    metrics = np.round(np.random.default_rng(1).uniform(size=80), 1)  # ties make plateaus
    opt = eo.SGD([eo.Parameter(np.ones(1))], lr=0.1)
    topt = torch.optim.SGD([torch.ones(1, requires_grad=True)], lr=0.1)
    s = sched.ReduceLROnPlateau(opt, factor=0.5, patience=2, cooldown=1, min_lr=1e-3)
    ts = torch.optim.lr_scheduler.ReduceLROnPlateau(topt, factor=0.5, patience=2, cooldown=1, min_lr=1e-3)
    for m in metrics:
        s.step(float(m))
        ts.step(float(m))
        assert s.get_last_lr() == pytest.approx(ts.get_last_lr(), rel=1e-12)
