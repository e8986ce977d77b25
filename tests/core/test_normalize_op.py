"""The fused normalisation op behind BatchNorm, LayerNorm and GroupNorm:
forward against plain NumPy, gradients by central differences (float64)."""

import numpy as np
import pytest

import everyo as eo
from everyo.normalization_ops import normalize
from everyo.testing import check_gradients

RNG = np.random.default_rng(0)


def _reference(x, axes, eps, w=None, b=None, mean=None, var=None):
    if mean is None:
        mean = x.mean(axis=axes, keepdims=True)
        var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
    y = (x - mean) / np.sqrt(var + eps)
    return y if w is None else y * w + b


CASES = [
    # (input shape, axes, weight/bias shape or None)
    ((6, 4), (0,), (4,)),
    ((3, 5, 4), (0, 1), (4,)),
    ((3, 5, 4), (2,), (4,)),
    ((3, 5, 4), (1, 2), (5, 4)),
    ((2, 3, 2, 3), (1, 3), (2, 3)),  # GroupNorm's grouped layout
    ((4, 5), (1,), None),
]


@pytest.mark.parametrize("shape, axes, pshape", CASES)
def test_forward_matches_numpy(shape, axes, pshape):
    x = RNG.standard_normal(shape) * 2 + 1
    w = b = None
    if pshape is not None:
        w, b = RNG.uniform(0.5, 1.5, pshape), RNG.standard_normal(pshape)
    out = normalize(eo.tensor(x), None if w is None else eo.tensor(w), None if b is None else eo.tensor(b), axes, 1e-3)
    assert out.dtype == np.float64
    np.testing.assert_allclose(out.data, _reference(x, axes, 1e-3, w, b), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("shape, axes, pshape", CASES)
def test_gradients_with_batch_statistics(shape, axes, pshape):
    x = RNG.standard_normal(shape) * 2 + 1
    if pshape is None:
        check_gradients(lambda t: normalize(t, axis=axes, eps=1e-3), [x], atol=1e-5, rtol=1e-4)
        return
    w = eo.tensor(RNG.uniform(0.5, 1.5, pshape), requires_grad=True)
    b = eo.tensor(RNG.standard_normal(pshape), requires_grad=True)
    check_gradients(lambda t: normalize(t, w, b, axes, 1e-3), [x], [w, b], atol=1e-5, rtol=1e-4)


def test_gradients_with_given_statistics():
    x = RNG.standard_normal((5, 3))
    mean, var = RNG.standard_normal(3), RNG.uniform(0.5, 2.0, 3)
    w = eo.tensor(RNG.uniform(0.5, 1.5, 3), requires_grad=True)
    b = eo.tensor(RNG.standard_normal(3), requires_grad=True)
    out = normalize(eo.tensor(x), w, b, 0, 1e-3, mean, var)
    np.testing.assert_allclose(out.data, _reference(x, 0, 1e-3, w.data, b.data, mean, var), rtol=1e-12)
    check_gradients(lambda t: normalize(t, w, b, 0, 1e-3, mean, var), [x], [w, b], atol=1e-6)


def test_float32_result_is_what_the_chain_of_primitives_gives():
    # BatchNorm's float32 output is unchanged by the fusion, bit for bit.
    x = eo.tensor(RNG.standard_normal((8, 3)).astype(np.float32))
    w = eo.tensor(RNG.uniform(0.5, 1.5, 3).astype(np.float32))
    b = eo.tensor(RNG.standard_normal(3).astype(np.float32))
    chain = (x - eo.mean(x, axis=0, keepdims=True)) / eo.sqrt(eo.var(x, axis=0, keepdims=True) + 1e-5) * w + b
    np.testing.assert_array_equal(normalize(x, w, b, 0).data, chain.data)


def test_weight_and_bias_come_together():
    with pytest.raises(ValueError, match="both weight and bias"):
        normalize(eo.ones(2, 3), eo.ones(3), None)
    with pytest.raises(ValueError, match="both mean and var"):
        normalize(eo.ones(2, 3), axis=0, mean=np.zeros(3))
