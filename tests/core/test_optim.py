"""Optimizers against their update rules written out in NumPy."""

import numpy as np
import pytest

import everyo as eo

rng = np.random.default_rng(2)


def _run(opt_factory, steps=3):
    w0 = rng.standard_normal(4)
    grads = [rng.standard_normal(4) for _ in range(steps)]
    p = eo.Parameter(w0.copy())
    opt = opt_factory([p])
    for g in grads:
        p.grad = g.copy()
        opt.step()
    return w0, grads, p.data


@pytest.mark.parametrize(
    "momentum,nesterov,wd", [(0.0, False, 0.0), (0.9, False, 0.0), (0.9, True, 0.01), (0.5, False, 0.1)]
)
def test_sgd_matches_reference(momentum, nesterov, wd):
    lr = 0.1
    w0, grads, got = _run(lambda ps: eo.SGD(ps, lr=lr, momentum=momentum, nesterov=nesterov, weight_decay=wd))
    w, buf = w0.copy(), None
    for g in grads:
        g = g + wd * w
        if momentum:
            buf = g.copy() if buf is None else momentum * buf + g
            g = g + momentum * buf if nesterov else buf
        w = w - lr * g
    np.testing.assert_allclose(got, w, rtol=1e-12)


@pytest.mark.parametrize("cls,wd", [(eo.Adam, 0.0), (eo.Adam, 0.1), (eo.AdamW, 0.1)])
def test_adam_matches_reference(cls, wd):
    lr, b1, b2, eps = 0.01, 0.9, 0.999, 1e-8
    w0, grads, got = _run(lambda ps: cls(ps, lr=lr, weight_decay=wd))
    w, m, v = w0.copy(), np.zeros(4), np.zeros(4)
    for t, g in enumerate(grads, 1):
        if cls is eo.AdamW:
            w = w * (1 - lr * wd)
        else:
            g = g + wd * w
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        w = w - lr * (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + eps)
    np.testing.assert_allclose(got, w, rtol=1e-10)


def test_optimizer_state_round_trip_resumes_identically():
    def make():
        p = eo.Parameter(np.arange(4.0))
        return p, eo.SGD([p], lr=0.1, momentum=0.9)

    p1, o1 = make()
    for g in (np.ones(4), np.arange(4.0)):
        p1.grad = g
        o1.step()
    p2, o2 = make()
    p2.data = p1.data.copy()
    o2.load_state_dict(o1.state_dict())
    for p, o in ((p1, o1), (p2, o2)):
        p.grad = np.full(4, 0.5)
        o.step()
    assert np.array_equal(p1.data, p2.data)


def test_zero_grad_and_parameters_without_grad():
    a, b = eo.Parameter(np.ones(2)), eo.Parameter(np.ones(2))
    opt = eo.Adam([a, b], lr=0.1)
    a.grad = np.ones(2)
    opt.step()
    assert np.array_equal(b.data, np.ones(2)) and not np.array_equal(a.data, np.ones(2))
    opt.zero_grad()
    assert a.grad is None


def test_clip_grad_norm():
    a, b = eo.Parameter(np.zeros(2)), eo.Parameter(np.zeros(1))
    a.grad, b.grad = np.array([3.0, 0.0]), np.array([4.0])
    total = eo.clip_grad_norm([a, b], 1.0)
    assert total == pytest.approx(5.0)
    assert np.sqrt((a.grad**2).sum() + (b.grad**2).sum()) == pytest.approx(1.0, rel=1e-5)
    a.grad = np.array([np.inf, 0.0])
    assert not np.isfinite(eo.clip_grad_norm([a], 1.0)) and a.grad[0] == np.inf


@pytest.mark.parametrize("wd", [0.0, 0.1])
@pytest.mark.parametrize("cls", [eo.Adam, eo.AdamW])
def test_amsgrad_matches_reference(cls, wd):
    lr, b1, b2, eps = 0.01, 0.9, 0.999, 1e-8
    w0, grads, got = _run(lambda ps: cls(ps, lr=lr, weight_decay=wd, amsgrad=True), steps=6)
    w, m, v, vmax = w0.copy(), np.zeros(4), np.zeros(4), np.zeros(4)
    for t, g in enumerate(grads, 1):
        if cls is eo.AdamW:
            w = w * (1 - lr * wd)
        else:
            g = g + wd * w
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        vmax = np.maximum(vmax, v)
        w = w - lr * (m / (1 - b1**t)) / (np.sqrt(vmax / (1 - b2**t)) + eps)
    np.testing.assert_allclose(got, w, rtol=1e-10)


def test_amsgrad_differs_from_adam_once_v_shrinks():
    # A large first gradient then small ones: v decays, its running maximum does not.
    def final(amsgrad):
        p = eo.Parameter(np.zeros(3))
        opt = eo.Adam([p], lr=0.1, amsgrad=amsgrad)
        for scale in (10.0, 0.1, 0.1, 0.1):
            p.grad = np.full(3, scale)
            opt.step()
        return p.data

    assert not np.allclose(final(True), final(False))


@pytest.mark.parametrize(
    "alpha,momentum,centered,wd",
    [(0.99, 0.0, False, 0.0), (0.9, 0.9, False, 0.0), (0.9, 0.0, True, 0.1), (0.8, 0.5, True, 0.01)],
)
def test_rmsprop_matches_reference(alpha, momentum, centered, wd):
    lr, eps = 0.01, 1e-8
    w0, grads, got = _run(
        lambda ps: eo.RMSprop(ps, lr=lr, alpha=alpha, momentum=momentum, centered=centered, weight_decay=wd), steps=5
    )
    w, sq, avg_g, buf = w0.copy(), np.zeros(4), np.zeros(4), np.zeros(4)
    for g in grads:
        g = g + wd * w
        sq = alpha * sq + (1 - alpha) * g * g
        if centered:
            avg_g = alpha * avg_g + (1 - alpha) * g
            denom = np.sqrt(sq - avg_g**2) + eps
        else:
            denom = np.sqrt(sq) + eps
        if momentum:
            buf = momentum * buf + g / denom
            w = w - lr * buf
        else:
            w = w - lr * g / denom
    np.testing.assert_allclose(got, w, rtol=1e-10)


def test_sgd_dampening_matches_reference():
    lr, momentum, dampening = 0.1, 0.9, 0.3
    w0, grads, got = _run(lambda ps: eo.SGD(ps, lr=lr, momentum=momentum, dampening=dampening), steps=4)
    w, buf = w0.copy(), None
    for g in grads:
        buf = g.copy() if buf is None else momentum * buf + (1 - dampening) * g  # first step: no dampening
        w = w - lr * buf
    np.testing.assert_allclose(got, w, rtol=1e-12)


def test_float32_parameters_stay_float32():
    for make in (
        lambda ps: eo.SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.1),
        lambda ps: eo.Adam(ps, amsgrad=True),
        lambda ps: eo.RMSprop(ps, momentum=0.9, centered=True),
    ):
        p = eo.Parameter(np.ones(3, dtype=np.float32))
        opt = make([p])
        p.grad = np.full(3, 0.5)  # a float64 gradient must not promote the parameter
        opt.step()
        opt.step()
        assert p.data.dtype == np.float32
        assert all(v.dtype == np.float32 for v in opt.state[0].values() if isinstance(v, np.ndarray))
