"""Param groups, hyperparameter validation and optimizer checkpoints."""

import numpy as np
import pytest

import everyo as eo

OPTIMIZERS = {
    "sgd": lambda ps, **kw: eo.SGD(ps, lr=0.1, momentum=0.9, nesterov=True, **kw),
    "adam": lambda ps, **kw: eo.Adam(ps, lr=0.01, amsgrad=True, **kw),
    "adamw": lambda ps, **kw: eo.AdamW(ps, lr=0.01, **kw),
    "rmsprop": lambda ps, **kw: eo.RMSprop(ps, lr=0.01, momentum=0.5, centered=True, **kw),
}


def _params(seed=0):
    rng = np.random.default_rng(seed)
    return [eo.Parameter(rng.standard_normal(s).astype(np.float32)) for s in ((3, 2), (2,), (4,))]


def _grads(step):
    rng = np.random.default_rng(100 + step)
    return [rng.standard_normal(s).astype(np.float32) for s in ((3, 2), (2,), (4,))]


def _train(opt, params, steps, start=0):
    for k in range(start, start + steps):
        for p, g in zip(params, _grads(k)):
            p.grad = g
        opt.step()


def test_groups_take_their_own_hyperparameters_and_the_defaults():
    a, b, c = _params()
    opt = eo.SGD([{"params": [a, b], "lr": 0.5}, {"params": c, "momentum": 0.9}], lr=0.1)
    assert [g["lr"] for g in opt.param_groups] == [0.5, 0.1]
    assert [g["momentum"] for g in opt.param_groups] == [0.0, 0.9]
    assert opt.params == [a, b, c] and opt.param_groups[1]["params"] == [c]
    before = [p.data.copy() for p in (a, b, c)]
    grads = _grads(0)
    for p, g in zip((a, b, c), grads):
        p.grad = g
    opt.step()
    # Each group follows its own rule: plain SGD at 0.5; momentum's first step is the gradient itself.
    np.testing.assert_allclose(a.data, before[0] - 0.5 * grads[0], rtol=1e-6)
    np.testing.assert_allclose(c.data, before[2] - 0.1 * grads[2], rtol=1e-6)


def test_grouped_optimizer_equals_separate_optimizers():
    # Two groups must step exactly as two optimizers, one per group.
    for name in ("adam", "rmsprop"):
        p1, p2 = _params(1), _params(1)
        opt = OPTIMIZERS[name]([{"params": p1[:2]}, {"params": p1[2:], "lr": 0.05, "weight_decay": 0.1}])
        solo = [OPTIMIZERS[name](p2[:2]), OPTIMIZERS[name](p2[2:])]
        solo[1].param_groups[0].update(lr=0.05, weight_decay=0.1)
        for k in range(4):
            for params in (p1, p2):
                for p, g in zip(params, _grads(k)):
                    p.grad = g
            opt.step()
            for o in solo:
                o.step()
        for x, y in zip(p1, p2):
            assert np.array_equal(x.data, y.data), name


def test_add_param_group():
    a, b, c = _params()
    opt = eo.Adam([a], lr=0.01)
    opt.add_param_group({"params": [b, c], "weight_decay": 0.5})
    assert len(opt.param_groups) == 2 and opt.params == [a, b, c]
    assert opt.param_groups[1]["lr"] == 0.01 and opt.param_groups[1]["weight_decay"] == 0.5
    with pytest.raises(ValueError, match=r"already in param group 0"):
        opt.add_param_group({"params": [a]})
    with pytest.raises(TypeError, match=r"'params' entry"):
        opt.add_param_group([c])


def test_a_parameter_in_two_groups_is_refused():
    a, b, _ = _params()
    with pytest.raises(ValueError, match=r"shape \(2,\) in param group 1 \(entry 1\) is already in param group 0"):
        eo.SGD([{"params": [a, b]}, {"params": [eo.Parameter(np.ones(1)), b]}])
    with pytest.raises(ValueError, match="already in the same group"):
        eo.SGD([a, a])


@pytest.mark.parametrize(
    "make,match,exc",
    [
        (
            lambda ps: eo.SGD(ps, lr="fast"),
            r"SGD: lr in the defaults must be a real number, got 'fast' \(str\)",
            TypeError,
        ),
        (
            lambda ps: eo.SGD([{"params": ps, "lr": -1.0}]),
            r"SGD: lr in param group 0 must be a finite number >= 0, got -1.0",
            ValueError,
        ),
        (
            lambda ps: eo.SGD([{"params": ps[:1]}, {"params": ps[1:], "momentum": "high"}]),
            r"momentum in param group 1 must be a real number",
            TypeError,
        ),
        (lambda ps: eo.SGD(ps, lr=True), r"lr in the defaults must be a real number, got True", TypeError),
        (lambda ps: eo.SGD(ps, lr=float("nan")), r"must be a finite number", ValueError),
        (lambda ps: eo.SGD(ps, nesterov=True), r"nesterov=True in the defaults needs momentum > 0", ValueError),
        (
            lambda ps: eo.SGD([{"params": ps, "nesterov": True, "momentum": 0.9, "dampening": 0.1}]),
            r"nesterov=True in param group 0 needs momentum > 0 and dampening == 0",
            ValueError,
        ),
        (lambda ps: eo.SGD(ps, nesterov=1), r"nesterov in the defaults must be True or False", TypeError),
        (
            lambda ps: eo.Adam(ps, betas=(0.9, 1.0)),
            r"betas in the defaults must be a pair of numbers, each a number in \[0, 1\)",
            ValueError,
        ),
        (lambda ps: eo.Adam(ps, betas=0.9), r"betas .* must be a pair", TypeError),
        (lambda ps: eo.AdamW([{"params": ps, "eps": -1e-8}]), r"AdamW: eps in param group 0", ValueError),
        (lambda ps: eo.Adam(ps, amsgrad="yes"), r"amsgrad in the defaults must be True or False", TypeError),
        (
            lambda ps: eo.RMSprop(ps, alpha=1.5),
            r"RMSprop: alpha in the defaults must be a number in \[0, 1\]",
            ValueError,
        ),
        (lambda ps: eo.RMSprop([{"params": ps, "centered": None}]), r"centered in param group 0", TypeError),
        (lambda ps: eo.SGD([{"params": [ps[0], "w"]}]), r"param group 0, entry 1 is a str, not a Tensor", TypeError),
        (lambda ps: eo.SGD(ps[0]), r"got a single Parameter; wrap it in a list", TypeError),
        (lambda ps: eo.SGD([ps[0], {"params": ps[1:]}]), r"mixes Tensors and param-group dicts", TypeError),
        (lambda ps: eo.SGD([{"params": set(ps)}]), r"as a set", TypeError),
        (lambda ps: eo.SGD([ps[0] * 2.0]), r"not a leaf", ValueError),
        (lambda ps: eo.SGD([]), r"empty parameter list", ValueError),
    ],
)
def test_bad_hyperparameters_are_refused_at_construction(make, match, exc):
    with pytest.raises(exc, match=match):
        make(_params())


def test_numpy_numbers_are_accepted_and_canonical():
    opt = eo.Adam(_params(), lr=np.float32(0.5), betas=np.array([0.8, 0.9]), amsgrad=np.bool_(True))
    group = opt.param_groups[0]
    assert type(group["lr"]) is float and group["betas"] == (0.8, 0.9) and group["amsgrad"] is True


def test_lr_attribute_reads_and_sets_every_group():
    a, b, c = _params()
    opt = eo.SGD([{"params": [a]}, {"params": [b, c]}], lr=0.1)
    assert opt.lr == 0.1
    opt.lr = 0.2
    assert [g["lr"] for g in opt.param_groups] == [0.2, 0.2]
    with pytest.raises(TypeError, match="lr in param group 0"):
        opt.lr = "fast"
    opt.param_groups[1]["lr"] = 0.3
    with pytest.raises(AttributeError, match=r"param groups differ"):
        _ = opt.lr
    with pytest.raises(AttributeError, match="no attribute 'betas'"):
        _ = opt.betas


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_state_dict_round_trips_through_save_and_load(name, tmp_path):
    # Train 3 steps, checkpoint, then 3 more; a fresh optimizer loaded from the
    # file must continue bit for bit like the original.
    def make(params):
        return OPTIMIZERS[name]([{"params": params[:2], "weight_decay": 0.1}, {"params": params[2:], "lr": 0.02}])

    params = _params(3)
    opt = make(params)
    _train(opt, params, 3)
    eo.save({"optimizer": opt.state_dict(), "params": [p.data for p in params]}, tmp_path / "ckpt.npz")
    _train(opt, params, 3, start=3)

    back = eo.load(tmp_path / "ckpt.npz")
    params2 = [eo.Parameter(a) for a in back["params"]]
    opt2 = make(params2)
    opt2.param_groups[1]["lr"] = 123.0  # must be overwritten by the checkpoint
    opt2.load_state_dict(back["optimizer"])
    assert [{k: v for k, v in g.items() if k != "params"} for g in opt2.param_groups] == [
        {k: v for k, v in g.items() if k != "params"} for g in opt.param_groups
    ]
    _train(opt2, params2, 3, start=3)
    for p, q in zip(params, params2):
        assert np.array_equal(p.data, q.data)


def test_state_dict_holds_indices_and_copies():
    params = _params()
    opt = eo.SGD([{"params": params[:1]}, {"params": params[1:]}], lr=0.1, momentum=0.9)
    _train(opt, params, 1)
    sd = opt.state_dict()
    assert [g["params"] for g in sd["param_groups"]] == [[0], [1, 2]]
    sd["state"]["0"]["momentum_buffer"][...] = 7
    assert not np.any(opt.state[0]["momentum_buffer"] == 7)


def test_load_state_dict_validates_like_the_constructor():
    params = _params()
    opt = eo.Adam([{"params": params[:2]}, {"params": params[2:]}], lr=0.01)
    _train(opt, params, 1)
    good = opt.state_dict()
    kept = [dict(g) for g in opt.param_groups], {i: dict(s) for i, s in opt.state.items()}

    def bad(edit):
        sd = opt.state_dict()
        edit(sd)
        return sd

    cases = [
        (
            lambda sd: sd["param_groups"][1].update(lr="fast"),
            TypeError,
            r"Adam: lr in param group 1 of the loaded state dict must be a real number, got 'fast'",
        ),
        (lambda sd: sd["param_groups"][0].update(betas=(0.9, 2.0)), ValueError, r"betas in param group 0"),
        (lambda sd: sd["param_groups"][0].update(amsgrad=1), TypeError, r"amsgrad in param group 0 .* True or False"),
        (lambda sd: sd["param_groups"].pop(), eo.EveryOStateDictError, r"has 1 param groups, this optimizer has 2"),
        (
            lambda sd: sd["param_groups"][0].update(params=[0]),
            eo.EveryOStateDictError,
            r"param group 0 of the state dict has 1 parameters, this optimizer's has 2",
        ),
        (lambda sd: sd["param_groups"][1].update(params=[1]), eo.EveryOStateDictError, r"ids must be distinct"),
        (
            lambda sd: sd["state"]["1"].pop("exp_avg_sq"),
            eo.EveryOStateDictError,
            r"state for parameter 1 has no 'exp_avg_sq'",
        ),
        (
            lambda sd: sd["state"]["0"].update(step=-1),
            eo.EveryOStateDictError,
            r"'step' for parameter 0 must be an int",
        ),
        (
            lambda sd: sd["state"]["2"].update(exp_avg=np.zeros(5)),
            eo.EveryOStateDictError,
            r"'exp_avg' for parameter 2 has shape \(5,\), the parameter has \(4,\)",
        ),
        (lambda sd: sd["state"].update({"7": {}}), eo.EveryOStateDictError, r"parameter 7"),
    ]
    for edit, exc, match in cases:
        with pytest.raises(exc, match=match):
            opt.load_state_dict(bad(edit))
        # Bad input loses nothing: the optimizer is as it was.
        assert [dict(g) for g in opt.param_groups] == kept[0]
        assert opt.state.keys() == kept[1].keys()
    opt.load_state_dict(good)


def test_amsgrad_switched_on_at_load_gets_its_state():
    params = _params()
    opt = eo.Adam(params, lr=0.01)
    _train(opt, params, 2)
    sd = opt.state_dict()
    sd["param_groups"][0]["amsgrad"] = True
    with pytest.raises(eo.EveryOStateDictError, match="no 'max_exp_avg_sq'"):
        opt.load_state_dict(sd)


def test_legacy_state_dict_loads():
    # The 0.1 format: one 'hyper' dict and the state.
    p = eo.Parameter(np.zeros(3, dtype=np.float32))
    opt = eo.SGD([p], lr=0.1, momentum=0.9)
    opt.load_state_dict(
        {
            "hyper": {"lr": 0.5, "momentum": 0.8, "dampening": 0.0, "nesterov": False, "weight_decay": 0.0},
            "state": {"0": {"momentum_buffer": np.ones(3, dtype=np.float32)}},
        }
    )
    assert opt.lr == 0.5 and opt.momentum == 0.8
    p.grad = np.ones(3, dtype=np.float32)
    opt.step()
    np.testing.assert_allclose(p.data, -0.5 * (0.8 + 1.0))


def test_zero_grad_set_to_none():
    params = _params()
    opt = eo.SGD(params)
    _train(opt, params, 1)
    opt.zero_grad(set_to_none=False)
    assert all(np.array_equal(p.grad, np.zeros_like(p.data)) for p in params)
    opt.zero_grad()
    assert all(p.grad is None for p in params)


def test_step_closure_returns_the_loss():
    p = eo.Parameter(np.array([3.0]))
    opt = eo.SGD([p], lr=0.25)

    def closure():
        opt.zero_grad()
        loss = (p * p).sum()
        loss.backward()
        return loss

    loss = opt.step(closure)
    assert loss.item() == 9.0 and p.data[0] == pytest.approx(3.0 - 0.25 * 6.0)
