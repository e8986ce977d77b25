"""everyo-kernels' adam_update (Adam/AdamW's fused step) against core's NumPy
passes: bit-identical over several steps, float32 and float64, every weight-decay
mode, special values in the gradients; the NumPy path where the kernel does not
apply (amsgrad, a non-contiguous parameter, a tiny model).

(An optimizer step has no gradient of its own to check with finite differences.)"""

import numpy as np
import pytest
from conftest import count_calls

import everyo as eo
from everyo import kernel_table

SPECIALS = [0.0, -0.0, np.nan, np.inf, -np.inf, 1e-45, -1e-45, 3e38, -3e38]
SHAPES = [(300, 100), (100,), (64, 65), (1,), (7, 3, 5)]


def _run(make, dtype, steps=4, specials=False, seed=0, shapes=SHAPES):
    rng = np.random.default_rng(seed)
    params = [eo.tensor(rng.standard_normal(s).astype(dtype), requires_grad=True) for s in shapes]
    opt = make(params)
    for _ in range(steps):
        for p in params:
            g = rng.standard_normal(p.data.shape).astype(dtype)
            if specials and g.size > 20:
                g.reshape(-1)[rng.integers(0, g.size, len(SPECIALS))] = SPECIALS
            p.grad = g
        with np.errstate(all="ignore"):
            opt.step()
    state = [opt.state[i][k].copy() for i in range(len(params)) for k in ("exp_avg", "exp_avg_sq")]
    return [p.data.copy() for p in params] + state, [opt.state[i]["step"] for i in range(len(params))]


def _same_bits(a, b):
    """Bit-identical, NaN positions equal (a NaN's sign and payload are not compared,
    as in test_dense_kernels)."""
    nan_a, nan_b = np.isnan(a), np.isnan(b)
    return a.dtype == b.dtype and np.array_equal(nan_a, nan_b) and np.array_equal(a[~nan_a], b[~nan_b])


OPTIMIZERS = [
    pytest.param(lambda ps: eo.AdamW(ps, lr=3e-4), id="AdamW-default"),
    pytest.param(lambda ps: eo.AdamW(ps, lr=0.1, betas=(0.8, 0.95), eps=1e-3, weight_decay=0.5), id="AdamW-wd"),
    pytest.param(lambda ps: eo.Adam(ps, lr=1e-2), id="Adam"),
    pytest.param(lambda ps: eo.Adam(ps, lr=1e-2, weight_decay=0.1), id="Adam-L2"),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("make", OPTIMIZERS)
@pytest.mark.parametrize("specials", [False, True])
def test_adam_update_matches_numpy_path_bit_for_bit(monkeypatch, make, dtype, specials):
    with kernel_table.disabled():
        want, want_steps = _run(make, dtype, specials=specials)
    calls = count_calls(monkeypatch, ("adam_update",))
    got, got_steps = _run(make, dtype, specials=specials)
    assert calls["adam_update"] == 4 * len(SHAPES)
    assert got_steps == want_steps == [4] * len(SHAPES)
    for a, e in zip(got, want):
        assert _same_bits(a, e)


def test_adam_update_then_numpy_path_continue_the_same_state(monkeypatch):
    # Steps on the kernel, then on the NumPy passes (the kernels turned off mid-run): one state.
    def make(ps):
        return eo.AdamW(ps, lr=1e-2, weight_decay=0.1)

    with kernel_table.disabled():
        want, _ = _run(make, np.float32, steps=6)
    rng = np.random.default_rng(0)
    params = [eo.tensor(rng.standard_normal(s).astype(np.float32), requires_grad=True) for s in SHAPES]
    opt = make(params)
    for step in range(6):
        for p in params:
            p.grad = rng.standard_normal(p.data.shape).astype(np.float32)
        if step < 3:
            opt.step()
        else:
            with kernel_table.disabled():
                opt.step()
    got = [p.data for p in params] + [opt.state[i][k] for i in range(len(params)) for k in ("exp_avg", "exp_avg_sq")]
    for a, e in zip(got, want):
        assert _same_bits(a, e)


def test_adam_keeps_numpy_path_where_the_kernel_does_not_apply(monkeypatch):
    calls = count_calls(monkeypatch, ("adam_update",))
    _run(lambda ps: eo.Adam(ps, amsgrad=True), np.float32)
    _run(lambda ps: eo.AdamW(ps), np.float32, shapes=[(4, 3), (3,)])  # a tiny model: kernels not asked for
    assert calls["adam_update"] == 0
    # a non-contiguous parameter takes the NumPy passes, the others the kernel
    rng = np.random.default_rng(0)
    big = eo.tensor(rng.standard_normal((200, 100)).astype(np.float32), requires_grad=True)
    odd = eo.tensor(np.asfortranarray(rng.standard_normal((30, 20)).astype(np.float32)), requires_grad=True)
    opt = eo.AdamW([big, odd], lr=0.1)
    big.grad, odd.grad = np.ones((200, 100), np.float32), np.ones((30, 20), np.float32)
    before = odd.data.copy()
    opt.step()
    assert calls["adam_update"] == 1
    assert not np.array_equal(odd.data, before)


def test_adam_update_bumps_the_parameter_version(monkeypatch):
    # The kernel changes the parameter in place: that must count as a write (autograd's
    # version check, the ONNX exporter's on_write), as the reference's ``p.data -= ...``.
    calls = count_calls(monkeypatch, ("adam_update",))
    rng = np.random.default_rng(0)
    w = eo.tensor(rng.standard_normal((200, 100)).astype(np.float32), requires_grad=True)
    opt = eo.AdamW([w], lr=0.1)
    w.grad = np.ones_like(w.data)
    before = w._version
    opt.step()
    assert calls["adam_update"] == 1
    assert w._version != before
