"""Learning-rate schedules against their closed forms, written out here independently."""

import math

import numpy as np
import pytest

import everyo as eo
from everyo.optim import lr_scheduler as sched

STEPS = 120
BASES = (0.1, 0.03)  # two param groups with their own lrs


def _opt(cls=eo.SGD, **kw):
    a, b = eo.Parameter(np.ones(2)), eo.Parameter(np.ones(3))
    return cls([{"params": [a], "lr": BASES[0]}, {"params": [b], "lr": BASES[1]}], **kw)


def _lrs(opt, scheduler, steps=STEPS):
    """The lrs in effect for each epoch: epoch 0 after construction, then one per step()."""
    seen = [[g["lr"] for g in opt.param_groups]]
    assert scheduler.get_last_lr() == seen[0]
    for _ in range(steps):
        opt.step()
        scheduler.step()
        seen.append([g["lr"] for g in opt.param_groups])
        assert scheduler.get_last_lr() == seen[-1]
    return np.array(seen)


def _cosine(base, eta_min, e, t_max):
    return eta_min + (base - eta_min) * (1 + math.cos(math.pi * e / t_max)) / 2


CLOSED_FORMS = {
    "step": (lambda o: sched.StepLR(o, step_size=7, gamma=0.5), lambda b, e: b * 0.5 ** (e // 7)),
    "multistep": (
        lambda o: sched.MultiStepLR(o, milestones=[10, 30, 30, 75], gamma=0.3),
        lambda b, e: b * 0.3 ** sum(m <= e for m in (10, 30, 30, 75)),
    ),
    "exponential": (lambda o: sched.ExponentialLR(o, gamma=0.97), lambda b, e: b * 0.97**e),
    "cosine": (lambda o: sched.CosineAnnealingLR(o, T_max=50, eta_min=1e-3), lambda b, e: _cosine(b, 1e-3, e, 50)),
    "linear": (
        lambda o: sched.LinearLR(o, start_factor=0.05, end_factor=0.9, total_iters=40),
        lambda b, e: b * (0.05 + (0.9 - 0.05) * min(e, 40) / 40),
    ),
}


@pytest.mark.parametrize("name", sorted(CLOSED_FORMS))
def test_schedule_matches_closed_form(name):
    make, formula = CLOSED_FORMS[name]
    opt = _opt()
    got = _lrs(opt, make(opt))
    want = np.array([[formula(b, e) for b in BASES] for e in range(STEPS + 1)])
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)
    assert all(g["initial_lr"] == b for g, b in zip(opt.param_groups, BASES))


def test_sequential_warmup_then_cosine():
    opt = _opt()
    warmup = sched.LinearLR(opt, start_factor=0.1, total_iters=5)
    cosine = sched.CosineAnnealingLR(opt, T_max=60, eta_min=0.0)
    decay = sched.ExponentialLR(opt, gamma=0.9)
    scheduler = sched.SequentialLR(opt, [warmup, cosine, decay], milestones=[5, 65])
    got = _lrs(opt, scheduler)

    def want(b, e):
        if e < 5:
            return b * (0.1 + 0.9 * e / 5)
        if e < 65:
            return _cosine(b, 0.0, e - 5, 60)
        return b * 0.9 ** (e - 65)

    np.testing.assert_allclose(got, [[want(b, e) for b in BASES] for e in range(STEPS + 1)], rtol=1e-12, atol=1e-15)
    assert scheduler.last_epoch == STEPS


def _one_cycle(max_lr, total, pct, div, final_div, three_phase, strategy, step, lo_m=0.85, hi_m=0.95):
    def anneal(a, b, t):
        return b + (a - b) * (math.cos(math.pi * t) + 1) / 2 if strategy == "cos" else a + (b - a) * t

    initial, low = max_lr / div, max_lr / div / final_div
    if three_phase:
        ends = [pct * total - 1, 2 * pct * total - 2, total - 1]
        lrs = [(initial, max_lr), (max_lr, initial), (initial, low)]
        moms = [(hi_m, lo_m), (lo_m, hi_m), (hi_m, hi_m)]
    else:
        ends = [pct * total - 1, total - 1]
        lrs = [(initial, max_lr), (max_lr, low)]
        moms = [(hi_m, lo_m), (lo_m, hi_m)]
    start = 0
    for k, end in enumerate(ends):
        if step <= end or k == len(ends) - 1:
            t = (step - start) / (end - start)
            return anneal(*lrs[k], t), anneal(*moms[k], t)
        start = end


@pytest.mark.parametrize("three_phase,strategy", [(False, "cos"), (False, "linear"), (True, "cos"), (True, "linear")])
def test_one_cycle_matches_closed_form(three_phase, strategy):
    total = 100
    opt = _opt(momentum=0.9)
    scheduler = sched.OneCycleLR(
        opt,
        max_lr=[1.0, 0.4],
        total_steps=total,
        pct_start=0.25,
        div_factor=20.0,
        final_div_factor=100.0,
        three_phase=three_phase,
        anneal_strategy=strategy,
    )
    momenta = [[g["momentum"] for g in opt.param_groups]]
    lrs = [[g["lr"] for g in opt.param_groups]]
    for _ in range(total - 1):
        opt.step()
        scheduler.step()
        lrs.append([g["lr"] for g in opt.param_groups])
        momenta.append([g["momentum"] for g in opt.param_groups])
    want = [
        [_one_cycle(m, total, 0.25, 20.0, 100.0, three_phase, strategy, s) for m in (1.0, 0.4)] for s in range(total)
    ]
    np.testing.assert_allclose(lrs, [[w[0] for w in row] for row in want], rtol=1e-12)
    np.testing.assert_allclose(momenta, [[w[1] for w in row] for row in want], rtol=1e-12)
    # The landmarks, without the formula: start, peak, end.
    assert lrs[0] == pytest.approx([1.0 / 20, 0.4 / 20])
    assert lrs[24] == pytest.approx([1.0, 0.4])
    assert lrs[-1] == pytest.approx([1.0 / 20 / 100, 0.4 / 20 / 100])


def test_one_cycle_cycles_adams_first_beta_and_refuses_extra_steps():
    opt = _opt(eo.Adam, betas=(0.9, 0.99))
    scheduler = sched.OneCycleLR(opt, max_lr=0.01, epochs=2, steps_per_epoch=5)
    assert opt.param_groups[0]["betas"] == (0.95, 0.99)
    for _ in range(10):
        scheduler.step()
    with pytest.raises(ValueError, match="stepped 11 times, but total_steps is 10"):
        scheduler.step()
    with pytest.raises(ValueError, match="neither 'momentum' nor 'betas'"):
        sched.OneCycleLR(_FakeOptimizer(), max_lr=0.1, total_steps=10)


class _FakeOptimizer:
    param_groups = [{"lr": 0.1, "params": []}]


def test_reduce_on_plateau_follows_patience_cooldown_and_floor():
    opt = _opt()
    scheduler = sched.ReduceLROnPlateau(opt, factor=0.5, patience=2, cooldown=1, min_lr=[0.02, 0.0])
    metrics = [1.0, 0.9, 0.95, 0.95, 0.95, 0.95, 0.95, 0.95, 0.89, 0.95, 0.95, 0.95, 0.95, 0.95, 0.95, 0.95]
    got = []
    for m in metrics:
        scheduler.step(eo.tensor(m) if m == 0.95 else m)
        got.append(scheduler.get_last_lr())
    # Epochs 2-4 are bad (0.95 after 0.9): the third (> patience 2) halves the lr at epoch 4,
    # epoch 5 is the cooldown (not counted), 6-7 are bad, 0.89 at 8 is an improvement, 9-11 are
    # bad: halved at 11; cooldown at 12, bad 13-15: halved at 15, where group 0 stops at min_lr.
    a, b = BASES
    want_a = [a] * 4 + [a / 2] * 7 + [a / 4] * 4 + [0.02]
    want_b = [b] * 4 + [b / 2] * 7 + [b / 4] * 4 + [b / 8]
    np.testing.assert_allclose([g[0] for g in got], want_a)
    np.testing.assert_allclose([g[1] for g in got], want_b)


def test_reduce_on_plateau_max_mode_and_absolute_threshold():
    opt = _opt()
    scheduler = sched.ReduceLROnPlateau(opt, mode="max", factor=0.1, patience=0, threshold=0.1, threshold_mode="abs")
    for m in (0.5, 0.55, 0.7):  # 0.55 is not 0.1 better than 0.5: the lr drops once
        scheduler.step(m)
    np.testing.assert_allclose(scheduler.get_last_lr(), [BASES[0] * 0.1, BASES[1] * 0.1])


RESUMABLE = {
    **{name: make for name, (make, _) in CLOSED_FORMS.items()},
    "onecycle": lambda o: sched.OneCycleLR(o, max_lr=0.5, total_steps=200, three_phase=True),
    "sequential": lambda o: sched.SequentialLR(
        o, [sched.LinearLR(o, 0.2, total_iters=10), sched.StepLR(o, step_size=5, gamma=0.7)], milestones=[10]
    ),
}


@pytest.mark.parametrize("name", sorted(RESUMABLE))
def test_resume_mid_way_gives_identical_lrs(name, tmp_path):
    make = RESUMABLE[name]
    opt = _opt(momentum=0.9)
    scheduler = make(opt)
    _lrs(opt, scheduler, steps=37)
    eo.save({"opt": opt.state_dict(), "sched": scheduler.state_dict()}, tmp_path / "ckpt.npz")
    rest = _lrs(opt, scheduler, steps=50)

    back = eo.load(tmp_path / "ckpt.npz")
    opt2 = _opt(momentum=0.9)
    scheduler2 = make(opt2)  # a fresh one at epoch 0 ...
    opt2.load_state_dict(back["opt"])
    scheduler2.load_state_dict(back["sched"])  # ... put back at epoch 37
    assert scheduler2.last_epoch == scheduler.last_epoch - 50
    np.testing.assert_array_equal(_lrs(opt2, scheduler2, steps=50), rest)


def test_reduce_on_plateau_resumes(tmp_path):
    metrics = np.random.default_rng(0).uniform(size=60)
    opt = _opt()
    scheduler = sched.ReduceLROnPlateau(opt, patience=1, cooldown=2)
    for m in metrics[:30]:
        scheduler.step(m)
    eo.save({"opt": opt.state_dict(), "sched": scheduler.state_dict()}, tmp_path / "ckpt.npz")
    back = eo.load(tmp_path / "ckpt.npz")
    opt2 = _opt()
    scheduler2 = sched.ReduceLROnPlateau(opt2, patience=1, cooldown=2)
    opt2.load_state_dict(back["opt"])
    scheduler2.load_state_dict(back["sched"])
    for m in metrics[30:]:
        scheduler.step(m)
        scheduler2.step(m)
        assert scheduler.get_last_lr() == scheduler2.get_last_lr()


@pytest.mark.parametrize(
    "make,exc,match",
    [
        (lambda o: sched.StepLR(o, step_size=0), ValueError, r"StepLR: step_size in the arguments must be an int >= 1"),
        (lambda o: sched.StepLR(o, step_size=2.5), TypeError, r"step_size .* must be an int"),
        (lambda o: sched.ExponentialLR(o, gamma="x"), TypeError, r"ExponentialLR: gamma .* real number"),
        (lambda o: sched.MultiStepLR(o, milestones=[5, 3]), ValueError, r"milestones .* increasing order"),
        (lambda o: sched.CosineAnnealingLR(o, T_max=10, eta_min=-1.0), ValueError, r"eta_min"),
        (lambda o: sched.LinearLR(o, total_iters=0), ValueError, r"total_iters"),
        (lambda o: sched.OneCycleLR(o, max_lr=[0.1]), ValueError, r"total_steps, or epochs and steps_per_epoch"),
        (
            lambda o: sched.OneCycleLR(o, max_lr=[0.1], total_steps=10),
            ValueError,
            r"max_lr .* one value per param group \(2\)",
        ),
        (
            lambda o: sched.OneCycleLR(o, max_lr=0.1, total_steps=10, anneal_strategy="cosine"),
            ValueError,
            r"'cos', 'linear'",
        ),
        (lambda o: sched.ReduceLROnPlateau(o, factor=1.0), ValueError, r"factor .* \[0, 1\)"),
        (lambda o: sched.ReduceLROnPlateau(o, mode="lowest"), ValueError, r"mode"),
        (
            lambda o: sched.SequentialLR(o, [sched.StepLR(o, 3)], milestones=[4]),
            ValueError,
            r"1 schedulers need 0 milestones",
        ),
        (
            lambda o: sched.SequentialLR(o, [sched.ReduceLROnPlateau(o), sched.StepLR(o, 3)], [4]),
            TypeError,
            r"schedulers\[0\] is a ReduceLROnPlateau",
        ),
        (lambda o: sched.StepLR(o, 3, last_epoch=4), KeyError, r"no 'initial_lr'"),
        (lambda o: sched.StepLR([1, 2], 3), TypeError, r"needs an optimizer with param_groups"),
    ],
)
def test_bad_arguments_are_refused(make, exc, match):
    with pytest.raises(exc, match=match):
        make(_opt(momentum=0.9))


def test_load_state_dict_validates_and_loses_nothing():
    opt = _opt()
    scheduler = sched.StepLR(opt, step_size=3)
    _lrs(opt, scheduler, steps=4)
    before = scheduler.state_dict()
    for edit, exc, match in [
        (lambda sd: sd.update(step_size="3"), TypeError, r"StepLR: step_size in the loaded state dict must be an int"),
        (lambda sd: sd.update(last_epoch=-5), ValueError, r"last_epoch .* >= 0"),
        (lambda sd: sd.update(base_lrs=[0.1]), ValueError, r"base_lrs .* one value per param group"),
        (lambda sd: sd.pop("gamma"), eo.EveryOStateDictError, r"needs the keys"),
    ]:
        sd = scheduler.state_dict()
        edit(sd)
        with pytest.raises(exc, match=match):
            scheduler.load_state_dict(sd)
        assert scheduler.state_dict() == before
    seq = sched.SequentialLR(opt, [sched.StepLR(opt, 2), sched.StepLR(opt, 3)], milestones=[3])
    sd = seq.state_dict()
    sd["schedulers"][1]["gamma"] = -1.0
    with pytest.raises(ValueError, match="gamma in the loaded state dict"):
        seq.load_state_dict(sd)
    plateau = sched.ReduceLROnPlateau(opt)
    sd = plateau.state_dict()
    sd["best"] = "low"
    with pytest.raises(TypeError, match="best in the loaded state dict must be a real number"):
        plateau.load_state_dict(sd)
