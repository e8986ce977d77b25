"""GradScaler: skip on overflow with nothing changed, backoff and growth,
unscale_ then clipping, checkpoints, and its errors."""

import copy
import warnings

import numpy as np
import pytest

import everyo as eo


def make_model(seed=0):
    return eo.Sequential(eo.Linear(6, 8, seed=seed), eo.ReLU(), eo.Linear(8, 2, seed=seed + 1))


def batch(seed=0, scale=1.0):
    rng = np.random.default_rng(seed)
    x = eo.tensor((rng.standard_normal((16, 6)) * scale).astype(np.float32))
    y = eo.tensor(rng.standard_normal((16, 2)).astype(np.float32))
    return x, y


def autocast_loss(model, x, y):
    with eo.autocast():
        out = model(x)
    return eo.mse_loss(out, y)


def snapshot(model, optimizer):
    return [p.data.copy() for p in model.parameters()], copy.deepcopy(optimizer.state)


def assert_state_equal(a, b):
    assert a.keys() == b.keys()
    for i in a:
        assert a[i].keys() == b[i].keys()
        for k in a[i]:
            if isinstance(a[i][k], np.ndarray):
                np.testing.assert_array_equal(a[i][k], b[i][k])
                assert a[i][k].dtype == b[i][k].dtype
            else:
                assert a[i][k] == b[i][k]


OPTIMIZERS = {
    "sgd_momentum": lambda ps: eo.SGD(ps, lr=0.1, momentum=0.9),
    "adam": lambda ps: eo.Adam(ps, lr=1e-2),
    "adamw": lambda ps: eo.AdamW(ps, lr=1e-2),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_overflow_skips_the_step_and_changes_nothing(name):
    model = make_model()
    optimizer = OPTIMIZERS[name](model.parameters())
    scaler = eo.GradScaler(init_scale=2.0**10)
    x, y = batch()
    for _ in range(2):  # build real optimizer state (momentum, moments, step count)
        optimizer.zero_grad()
        scaler.backward(autocast_loss(model, x, y))
        assert scaler.step(optimizer)
        scaler.update()
    params_before, state_before = snapshot(model, optimizer)
    scale_before = scaler.get_scale()

    # Inputs of 1e4 make float16 activations and scaled gradients overflow.
    optimizer.zero_grad()
    big_x, _ = batch(scale=1e4)
    scaler.backward(autocast_loss(model, big_x, y))
    assert not all(np.isfinite(p.grad).all() for p in model.parameters())
    assert scaler.step(optimizer) is False
    scaler.update()

    params_after, state_after = snapshot(model, optimizer)
    for before, after in zip(params_before, params_after):
        np.testing.assert_array_equal(before, after)
    assert_state_equal(state_before, state_after)
    assert scaler.get_scale() == scale_before * 0.5
    assert scaler.growth_tracker == 0


def test_scale_grows_after_growth_interval_clean_steps_only():
    model = make_model()
    optimizer = eo.SGD(model.parameters(), lr=0.01)
    scaler = eo.GradScaler(init_scale=8.0, growth_factor=2.0, growth_interval=3)
    x, y = batch()
    scales = []
    for _ in range(7):
        optimizer.zero_grad()
        scaler.backward(autocast_loss(model, x, y))
        assert scaler.step(optimizer)
        scaler.update()
        scales.append((scaler.get_scale(), scaler.growth_tracker))
    assert scales == [(8.0, 1), (8.0, 2), (16.0, 0), (16.0, 1), (16.0, 2), (32.0, 0), (32.0, 1)]


def test_growth_only_when_the_grown_scale_is_finite():
    model = make_model()
    optimizer = eo.SGD(model.parameters(), lr=0.0)
    huge = float(np.finfo(np.float64).max) / 1.5
    scaler = eo.GradScaler(init_scale=huge, growth_interval=1)
    for p in model.parameters():
        p.grad = np.zeros_like(p.data)  # finite gradients, as after any clean backward
    assert scaler.step(optimizer)
    scaler.update()
    assert scaler.get_scale() == huge and scaler.growth_tracker == 0


def test_unscale_then_clip_then_step():
    model = make_model()
    reference = make_model()
    x, y = batch()
    # float32 reference: plain gradients, clipped, SGD step
    eo.mse_loss(reference(x), y).backward()
    ref_norm = eo.clip_grad_norm(reference.parameters(), max_norm=0.1)
    eo.SGD(reference.parameters(), lr=0.5).step()

    optimizer = eo.SGD(model.parameters(), lr=0.5)
    scaler = eo.GradScaler()
    loss = eo.mse_loss(model(x), y)  # float32 forward: unscaling must give the same gradients
    scaler.backward(loss)
    scaler.unscale_(optimizer)
    norm = eo.clip_grad_norm(model.parameters(), max_norm=0.1)
    assert norm == pytest.approx(ref_norm, rel=1e-5)  # the true norm, not 65536 times it
    assert norm > 0.1
    assert scaler.step(optimizer)  # does not unscale a second time
    scaler.update()
    for p, q in zip(model.parameters(), reference.parameters()):
        np.testing.assert_allclose(p.data, q.data, rtol=1e-5, atol=1e-7)


def test_unscale_twice_before_update_raises_and_update_resets():
    model = make_model()
    optimizer = eo.SGD(model.parameters(), lr=0.01)
    scaler = eo.GradScaler()
    x, y = batch()
    scaler.backward(autocast_loss(model, x, y))
    scaler.unscale_(optimizer)
    with pytest.raises(RuntimeError, match="already"):
        scaler.unscale_(optimizer)
    scaler.step(optimizer)
    with pytest.raises(RuntimeError, match="already"):
        scaler.step(optimizer)
    with pytest.raises(RuntimeError, match="after step"):
        scaler.unscale_(optimizer)
    scaler.update()
    optimizer.zero_grad()
    scaler.backward(autocast_loss(model, x, y))
    scaler.unscale_(optimizer)  # allowed again in the next iteration


def test_update_without_step_raises():
    with pytest.raises(RuntimeError, match="step"):
        eo.GradScaler().update()


def test_update_new_scale():
    scaler = eo.GradScaler()
    scaler.update(new_scale=128.0)
    assert scaler.get_scale() == 128.0
    with pytest.raises(ValueError):
        scaler.update(new_scale=float("inf"))


def test_state_dict_round_trip_resumes_scale_and_growth_counter(tmp_path):
    model = make_model()
    optimizer = eo.SGD(model.parameters(), lr=0.01)
    scaler = eo.GradScaler(init_scale=64.0, growth_interval=4)
    x, y = batch()
    for _ in range(6):  # grows once at 4, tracker 2 after
        optimizer.zero_grad()
        scaler.backward(autocast_loss(model, x, y))
        scaler.step(optimizer)
        scaler.update()
    assert (scaler.get_scale(), scaler.growth_tracker) == (128.0, 2)

    eo.save({"scaler": scaler.state_dict()}, tmp_path / "ckpt.npz")
    resumed = eo.GradScaler()  # default settings, overwritten by the checkpoint
    resumed.load_state_dict(eo.load(tmp_path / "ckpt.npz")["scaler"])
    assert resumed.state_dict() == scaler.state_dict()
    # two more clean steps on each: both grow at the same moment
    for s in (scaler, resumed):
        for _ in range(2):
            optimizer.zero_grad()
            s.backward(autocast_loss(model, x, y))
            s.step(optimizer)
            s.update()
    assert scaler.get_scale() == resumed.get_scale() == 256.0
    assert scaler.growth_tracker == resumed.growth_tracker == 0


@pytest.mark.parametrize(
    "bad, message",
    [
        ({}, "empty"),
        ({"scale": 1.0}, "missing"),
        ("not a dict", "dict"),
    ],
)
def test_load_state_dict_rejects_malformed_input(bad, message):
    scaler = eo.GradScaler()
    with pytest.raises(eo.EveryOStateDictError, match=message):
        scaler.load_state_dict(bad)
    assert scaler.get_scale() == 2.0**16


@pytest.mark.parametrize(
    "key, value",
    [
        ("scale", -1.0),
        ("scale", float("nan")),
        ("growth_factor", 0.5),
        ("backoff_factor", 1.5),
        ("growth_interval", 0),
        ("growth_tracker", 5000),
        ("growth_tracker", 1.5),
        ("scale", "big"),
    ],
)
def test_load_state_dict_validates_values_before_changing_anything(key, value):
    good = eo.GradScaler(init_scale=32.0).state_dict()
    scaler = eo.GradScaler()
    with pytest.raises(eo.EveryOStateDictError):
        scaler.load_state_dict({**good, key: value})
    assert scaler.state_dict() == eo.GradScaler().state_dict()


def test_load_state_dict_rejects_unexpected_keys():
    good = eo.GradScaler().state_dict()
    with pytest.raises(eo.EveryOStateDictError, match="unexpected"):
        eo.GradScaler().load_state_dict({**good, "extra": 1})


@pytest.mark.parametrize(
    "kwargs",
    [
        {"init_scale": 0.0},
        {"growth_factor": 1.0},
        {"backoff_factor": 1.0},
        {"growth_interval": 0},
        {"growth_interval": 2.5},
    ],
)
def test_constructor_validates(kwargs):
    with pytest.raises((ValueError, TypeError)):
        eo.GradScaler(**kwargs)


def test_disabled_scaler_is_plain_training():
    model, reference = make_model(), make_model()
    x, y = batch()
    scaler = eo.GradScaler(enabled=False)
    optimizer, ref_opt = eo.SGD(model.parameters(), lr=0.1), eo.SGD(reference.parameters(), lr=0.1)
    loss = eo.mse_loss(model(x), y)
    assert scaler.scale(loss) is loss
    scaler.backward(loss)
    assert scaler.step(optimizer) is True
    scaler.update()
    eo.mse_loss(reference(x), y).backward()
    ref_opt.step()
    for p, q in zip(model.parameters(), reference.parameters()):
        np.testing.assert_array_equal(p.data, q.data)
    assert scaler.get_scale() == 1.0 and scaler.state_dict() == {}


def test_scale_multiplies_in_float32_even_for_a_float16_loss():
    loss = eo.tensor(np.float16(2.0), requires_grad=True)
    scaled = eo.GradScaler().scale(loss)
    assert scaled.dtype == "float32" and scaled.item() == 2.0 * 65536  # float16 would be inf


def test_backward_silences_overflow_warnings_scale_backward_shows_them():
    model = make_model()
    big_x, y = batch(scale=1e4)
    scaler = eo.GradScaler()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        scaler.backward(autocast_loss(model, big_x, y))
    model.zero_grad()
    with pytest.warns(RuntimeWarning, match="overflow"), np.errstate(invalid="ignore"):
        scaler.scale(autocast_loss(model, big_x, y)).backward()


def test_float16_parameters_are_refused_with_a_clear_error():
    model = make_model().to("float16")
    optimizer = eo.SGD(model.parameters(), lr=0.1)
    x, y = batch()
    scaler = eo.GradScaler()
    scaler.backward(eo.mse_loss(model(x.astype("float16")), y))
    before = [p.grad.copy() for p in model.parameters()]
    with pytest.raises(eo.EveryODTypeError, match="float32"):
        scaler.step(optimizer)
    for p, g in zip(model.parameters(), before):  # nothing was half-unscaled
        np.testing.assert_array_equal(p.grad, g)


def test_two_optimizers_one_overflow_skips_only_that_one_and_backs_off_once():
    model = make_model()
    first, second = model[0], model[2]
    opt_a = eo.SGD(first.parameters(), lr=0.1)
    opt_b = eo.SGD(second.parameters(), lr=0.1)
    scaler = eo.GradScaler(init_scale=4.0)
    x, y = batch()
    scaler.backward(autocast_loss(model, x, y))
    first.weight.grad[0, 0] = np.inf
    before_b = second.weight.data.copy()
    assert scaler.step(opt_a) is False
    assert scaler.step(opt_b) is True
    assert not np.array_equal(second.weight.data, before_b)
    scaler.update()
    assert scaler.get_scale() == 2.0
