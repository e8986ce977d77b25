"""GradScaler 0.2: the min_scale floor and the skip warnings, several
optimizers on one scaler, and resuming from a checkpoint bit for bit."""

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


def nan_step(scaler, optimizer, model):
    for p in model.parameters():
        p.grad = np.full(p.data.shape, np.nan, np.float32)  # NaN whatever the scale
    applied = scaler.step(optimizer)
    scaler.update()
    return applied


def test_persistent_nan_stops_at_min_scale_and_warns_never_divides_by_zero():
    model = make_model()
    optimizer = eo.SGD(model.parameters(), lr=0.1)
    scaler = eo.GradScaler()  # 2**16, halving: the 0.1 code reached 0.0 at step 1,090
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(1200):
            assert nan_step(scaler, optimizer, model) is False
    assert scaler.get_scale() == 1.0 and scaler.skipped_in_a_row == 1200
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    floor = [m for m in messages if "min_scale" in m]
    assert len(floor) == 1  # once: 2**16 -> 1 takes 16 halvings, the 17th would go below
    assert floor[0].startswith("GradScaler: 17 step(s) in a row skipped") and "non-finite at any scale" in floor[0]
    streak = [m for m in messages if "min_scale" not in m]
    assert [m.split(" steps")[0] for m in streak] == [f"GradScaler: {n}" for n in range(100, 1201, 100)]


def test_min_scale_and_warn_after_skips_keywords():
    model = make_model()
    optimizer = eo.SGD(model.parameters(), lr=0.1)
    scaler = eo.GradScaler(init_scale=8.0, min_scale=0.25, warn_after_skips=3)
    scales = []
    with pytest.warns(RuntimeWarning) as record:
        for _ in range(7):
            nan_step(scaler, optimizer, model)
            scales.append(scaler.get_scale())
    assert scales == [4.0, 2.0, 1.0, 0.5, 0.25, 0.25, 0.25]
    texts = [str(w.message) for w in record]
    assert any("3 steps in a row" in t for t in texts) and any("6 steps in a row" in t for t in texts)
    assert sum("min_scale=0.25" in t for t in texts) == 1


def test_a_clean_step_ends_the_run_of_skips():
    model = make_model()
    optimizer = eo.SGD(model.parameters(), lr=0.01)
    scaler = eo.GradScaler(init_scale=4.0, warn_after_skips=2)
    nan_step(scaler, optimizer, model)
    x, y = batch()
    optimizer.zero_grad()
    scaler.backward(eo.mse_loss(model(x), y))
    assert scaler.step(optimizer)
    scaler.update()
    assert scaler.skipped_in_a_row == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one skip after a clean step: below the threshold of 2
        nan_step(scaler, optimizer, model)


@pytest.mark.parametrize(
    "kwargs", [{"min_scale": 0.0}, {"min_scale": float("inf")}, {"warn_after_skips": 0}, {"init_scale": 0.5}]
)
def test_new_keywords_are_validated(kwargs):
    with pytest.raises((ValueError, TypeError)):
        eo.GradScaler(**kwargs)


def test_two_optimizers_each_unscaled_exactly_once():
    model = make_model()
    opt_a = eo.SGD(model[0].parameters(), lr=0.1)
    opt_b = eo.SGD(model[2].parameters(), lr=0.1)
    scaler = eo.GradScaler(init_scale=2.0**10)
    x, y = batch()
    scaler.backward(eo.mse_loss(model(x), y))
    scaled = [p.grad.copy() for p in model.parameters()]
    scaler.unscale_(opt_a)  # e.g. to clip only the first block; step() must not unscale it again
    assert scaler.step(opt_a) and scaler.step(opt_b)
    for p, g in zip(model.parameters(), scaled):
        np.testing.assert_array_equal(p.grad, g / np.float32(2.0**10))  # a power of two: exact
    with pytest.raises(RuntimeError, match="already"):
        scaler.step(opt_b)
    scaler.update()
    assert scaler.get_scale() == 2.0**10 and scaler.growth_tracker == 1


def test_found_inf_is_shared_by_update_not_by_the_steps():
    model = make_model()
    opt_a, opt_b = eo.SGD(model[0].parameters(), lr=0.1), eo.SGD(model[2].parameters(), lr=0.1)
    scaler = eo.GradScaler(init_scale=64.0, growth_interval=1)
    x, y = batch()
    scaler.backward(eo.mse_loss(model(x), y))
    model[2].bias.grad[0] = np.nan
    before_a = model[0].weight.data.copy()
    assert scaler.step(opt_a) is True and scaler.step(opt_b) is False
    assert not np.array_equal(before_a, model[0].weight.data)
    scaler.update()  # one optimizer overflowed: the shared scale backs off once, no growth
    assert scaler.get_scale() == 32.0 and scaler.skipped_in_a_row == 1


def train(model, optimizer, scaler, steps, start):
    """Autocast steps; step 5 overflows (large inputs), so the backoff is exercised."""
    applied = []
    for i in range(start, start + steps):
        x, y = batch(seed=i, scale=1e4 if i == 5 else 1.0)
        optimizer.zero_grad()
        with eo.autocast():
            out = model(x)
        scaler.backward(eo.mse_loss(out, y))
        applied.append(scaler.step(optimizer))
        scaler.update()
    return applied


def test_checkpoint_resumes_bit_identically(tmp_path):
    model = make_model()
    optimizer = eo.Adam(model.parameters(), lr=1e-2)
    scaler = eo.GradScaler(init_scale=2.0**12, growth_interval=3)
    train(model, optimizer, scaler, 4, start=0)
    eo.save(
        {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "scaler": scaler.state_dict()},
        tmp_path / "ckpt.npz",
    )

    checkpoint = eo.load(tmp_path / "ckpt.npz")
    resumed_model = make_model(seed=7)  # different initial weights: everything must come from the file
    resumed_optimizer = eo.Adam(resumed_model.parameters(), lr=1e-2)
    resumed_scaler = eo.GradScaler()
    resumed_model.load_state_dict(checkpoint["model"])
    resumed_optimizer.load_state_dict(checkpoint["optimizer"])
    resumed_scaler.load_state_dict(checkpoint["scaler"])

    applied = train(model, optimizer, scaler, 6, start=4)
    assert train(resumed_model, resumed_optimizer, resumed_scaler, 6, start=4) == applied
    assert applied[1] is False and all(applied[2:])  # the overflow at step 5 was skipped, then training went on
    assert scaler.state_dict() == resumed_scaler.state_dict()
    for p, q in zip(model.parameters(), resumed_model.parameters()):
        assert p.data.tobytes() == q.data.tobytes()


def test_a_0_1_checkpoint_without_the_new_keys_still_loads():
    old = {"scale": 512.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2000, "growth_tracker": 7}
    scaler = eo.GradScaler()
    scaler.load_state_dict(old)
    assert scaler.get_scale() == 512.0 and scaler.state_dict()["min_scale"] == 1.0


def test_load_state_dict_refuses_a_scale_below_its_floor():
    good = eo.GradScaler().state_dict()
    with pytest.raises(eo.EveryOStateDictError, match="min_scale"):
        eo.GradScaler().load_state_dict({**good, "scale": 0.5})
