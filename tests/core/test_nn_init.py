"""eo.nn.init against torch.nn.init's formulas: fans from EveryO's layouts
(output axis last) give PyTorch's distributions for each layer's weight;
the empirical spread of large draws is compared with the formula (and with
torch's own draws where torch is installed)."""

import math

import numpy as np
import pytest

import everyo as eo
from everyo.nn import init

# (EveryO shape, the PyTorch layout of the same weight): Linear, Conv1D, Conv2D, LSTM weight_ih.
LAYOUTS = [
    ((300, 200), (200, 300)),
    ((5, 40, 60), (60, 40, 5)),
    ((3, 3, 32, 64), (64, 32, 3, 3)),
    ((50, 4 * 80), (4 * 80, 50)),
]


def torch_fans(torch_shape):
    """PyTorch's rule (torch.nn.init._calculate_fan_in_and_fan_out), written out."""
    field = int(np.prod(torch_shape[2:])) if len(torch_shape) > 2 else 1
    return torch_shape[1] * field, torch_shape[0] * field


def param(shape):
    return eo.Parameter(np.zeros(shape, dtype=np.float32))


@pytest.mark.parametrize("ours,theirs", LAYOUTS)
def test_fans_follow_pytorchs_layout_rule(ours, theirs):
    assert init._fans(param(ours), "t") == torch_fans(theirs)


@pytest.mark.parametrize("ours,theirs", LAYOUTS)
@pytest.mark.parametrize(
    "name,kwargs",
    [
        ("xavier_uniform_", {"gain": 2.0}),
        ("xavier_normal_", {}),
        ("kaiming_uniform_", {"a": math.sqrt(5)}),
        ("kaiming_normal_", {"mode": "fan_out", "nonlinearity": "relu"}),
        ("kaiming_uniform_", {"nonlinearity": "tanh"}),
    ],
)
def test_spread_matches_torch_formula(ours, theirs, name, kwargs):
    fan_in, fan_out = torch_fans(theirs)
    if name.startswith("xavier"):
        std = kwargs.get("gain", 1.0) * math.sqrt(2.0 / (fan_in + fan_out))
    else:
        fan = fan_in if kwargs.get("mode", "fan_in") == "fan_in" else fan_out
        std = init.calculate_gain(kwargs.get("nonlinearity", "leaky_relu"), kwargs.get("a", 0.0)) / math.sqrt(fan)
    w = param(ours)
    assert getattr(init, name)(w, **kwargs, seed=0) is w
    n = w.data.size
    assert abs(w.data.mean()) < 5 * std / math.sqrt(n)
    np.testing.assert_allclose(w.data.std(), std, rtol=0.03)
    if name.endswith("uniform_"):
        assert np.abs(w.data).max() <= math.sqrt(3) * std * (1 + 1e-6)
    torch = pytest.importorskip("torch")
    t = torch.empty(theirs)
    getattr(torch.nn.init, name)(t, **kwargs)
    np.testing.assert_allclose(w.data.std(), float(t.std()), rtol=0.05)


def test_calculate_gain_as_torch():
    cases = [("linear", None), ("conv2d", None), ("sigmoid", None), ("tanh", None), ("relu", None)]
    cases += [("leaky_relu", None), ("leaky_relu", 0.2), ("selu", None)]
    expected = [1, 1, 1, 5 / 3, math.sqrt(2), math.sqrt(2 / 1.0001), math.sqrt(2 / 1.04), 0.75]
    for (name, p), e in zip(cases, expected):
        assert init.calculate_gain(name, p) == pytest.approx(e)
    torch = pytest.importorskip("torch")
    for name, p in cases:
        assert init.calculate_gain(name, p) == pytest.approx(torch.nn.init.calculate_gain(name, p))
    with pytest.raises(ValueError, match="unsupported nonlinearity 'swish'"):
        init.calculate_gain("swish")


def test_simple_fills_and_ranges():
    w = param((200, 100))
    init.uniform_(w, -0.5, 2.0, seed=1)
    assert w.data.min() >= -0.5 and w.data.max() < 2.0
    np.testing.assert_allclose(w.data.mean(), 0.75, atol=0.02)
    init.normal_(w, mean=1.0, std=0.02, seed=1)
    np.testing.assert_allclose([w.data.mean(), w.data.std()], [1.0, 0.02], rtol=0.02)
    assert w.dtype == np.float32
    init.constant_(w, 0.3)
    assert np.all(w.data == np.float32(0.3))
    init.ones_(w)
    assert np.all(w.data == 1)
    init.zeros_(w)
    assert np.all(w.data == 0)


def test_trunc_normal_is_a_truncated_normal():
    w = param((400, 250))
    init.trunc_normal_(w, mean=0.5, std=1.0, a=0.0, b=2.0, seed=3)
    assert w.data.min() >= 0.0 and w.data.max() <= 2.0
    # The truncated normal's mean and std, by numerical integration.
    x = np.linspace(0.0, 2.0, 200001)

    def integrate(f, x):  # the trapezoid rule
        return float(((f[1:] + f[:-1]) / 2 * np.diff(x)).sum())

    pdf = np.exp(-0.5 * (x - 0.5) ** 2)
    pdf /= integrate(pdf, x)
    mean = integrate(x * pdf, x)
    std = math.sqrt(integrate((x - mean) ** 2 * pdf, x))
    np.testing.assert_allclose([w.data.mean(), w.data.std()], [mean, std], rtol=0.01)
    with pytest.raises(ValueError, match="choose bounds nearer the mean"):
        init.trunc_normal_(w, a=8.0, b=9.0)
    torch = pytest.importorskip("torch")
    t = torch.empty(400, 250)
    torch.nn.init.trunc_normal_(t, mean=0.5, std=1.0, a=0.0, b=2.0)
    np.testing.assert_allclose(w.data.std(), float(t.std()), rtol=0.02)


@pytest.mark.parametrize("shape", [(64, 32), (32, 64), (3, 3, 8, 16), (40, 40)])
def test_orthogonal(shape):
    w = param(shape)
    init.orthogonal_(w, gain=2.0, seed=0)
    m = w.data.reshape(-1, shape[-1]).astype(np.float64) / 2.0
    small = m.T @ m if m.shape[0] >= m.shape[1] else m @ m.T
    np.testing.assert_allclose(small, np.eye(small.shape[0]), atol=1e-5)


def test_in_place_on_a_parameter_reproducible_and_refusals():
    layer = eo.Linear(8, 4)
    w = layer.weight
    version = w._version
    assert init.xavier_uniform_(w, seed=5) is layer.weight and w._version > version and w.requires_grad
    first = w.data.copy()
    init.xavier_uniform_(w, seed=5)
    np.testing.assert_array_equal(w.data, first)
    eo.manual_seed(11)
    init.normal_(w)
    again = w.data.copy()
    eo.manual_seed(11)
    init.normal_(w)
    np.testing.assert_array_equal(w.data, again)
    layer(eo.ones(2, 8)).sum().backward()  # still a working parameter
    assert w.grad.shape == (8, 4)
    with pytest.raises(ValueError, match="at least 2 dimensions, got shape \\(4,\\)"):
        init.xavier_normal_(layer.bias)
    with pytest.raises(ValueError, match="mode must be 'fan_in' or 'fan_out'"):
        init.kaiming_normal_(w, mode="fan")
    with pytest.raises(TypeError, match="expected a Tensor or Parameter, got ndarray"):
        init.zeros_(np.zeros(3))
