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


@pytest.mark.parametrize("momentum,nesterov,wd", [(0.0, False, 0.0), (0.9, False, 0.0), (0.9, True, 0.01), (0.5, False, 0.1)])
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
        w = w - lr * (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps)
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
    assert np.sqrt((a.grad ** 2).sum() + (b.grad ** 2).sum()) == pytest.approx(1.0, rel=1e-5)
    a.grad = np.array([np.inf, 0.0])
    assert not np.isfinite(eo.clip_grad_norm([a], 1.0)) and a.grad[0] == np.inf
