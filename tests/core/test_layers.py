"""Each layer's forward against a plain-NumPy reference, and its gradients
against finite differences."""

import numpy as np
import pytest
from reference import conv2d_loop, pool_loop

import everyo as eo
from everyo.testing import check_gradients, check_module_gradients

rng = np.random.default_rng(1)


def f64(*shape):
    return rng.standard_normal(shape)


# --- forward against references --------------------------------------------------
def test_linear_forward_is_x_at_w_plus_b():
    layer = eo.Linear(5, 3, seed=0)
    x = f64(4, 5).astype(np.float32)
    np.testing.assert_allclose(layer(eo.tensor(x)).data, x @ layer.weight.data + layer.bias.data, rtol=1e-6)
    assert layer(eo.tensor(f64(2, 7, 5).astype(np.float32))).shape == (2, 7, 3)


@pytest.mark.parametrize("trained", ["all", "bias only", "weight only"])
def test_linear_with_a_narrow_input_matches_reference_and_gradients(trained):
    # Fewer than half as many inputs as outputs, more rows than inputs: the bias
    # rides in the product as a column of ones; the forward, each gradient and
    # each combination of what needs one must come out as for x @ W + b.
    x, w, b = f64(2, 4, 3), f64(3, 8), f64(8)
    out = eo.linear(eo.tensor(x), eo.tensor(w), eo.tensor(b))
    np.testing.assert_allclose(out.data, x @ w + b, rtol=1e-12)
    assert out.shape == (2, 4, 8)
    wt = eo.tensor(w, requires_grad=trained != "bias only")
    bt = eo.tensor(b, requires_grad=trained != "weight only")
    g = f64(2, 4, 8)
    eo.linear(eo.tensor(x), wt, bt).backward(g)
    g2, x2 = g.reshape(-1, 8), x.reshape(-1, 3)
    if trained != "bias only":
        np.testing.assert_allclose(wt.grad, x2.T @ g2, rtol=1e-12)
    if trained != "weight only":
        np.testing.assert_allclose(bt.grad, g2.sum(axis=0), rtol=1e-12)
    check_gradients(lambda x, w, b: eo.linear(x, w, b), [x, w, b], name="linear, narrow input")


def test_seed_makes_initialisation_reproducible():
    a, b, c = eo.Linear(4, 3, seed=7), eo.Linear(4, 3, seed=7), eo.Linear(4, 3, seed=8)
    assert np.array_equal(a.weight.data, b.weight.data)
    assert not np.array_equal(a.weight.data, c.weight.data)


@pytest.mark.parametrize(
    "h,w,k,stride,padding",
    [
        (6, 6, 3, 1, "valid"),
        (7, 5, 3, 2, "same"),
        (7, 7, 2, 2, "same"),
        (9, 6, 5, 2, "same"),
        (5, 5, 3, 1, "same"),
        (8, 8, 3, 2, "valid"),
    ],
)
def test_conv2d_matches_direct_loop(h, w, k, stride, padding):
    layer = eo.Conv2D(3, 4, k, stride=stride, padding=padding, seed=0).to("float64")
    x = f64(2, h, w, 3)
    expected = conv2d_loop(x, layer.weight.data, layer.bias.data, stride, padding)
    got = layer(eo.tensor(x)).data
    assert got.shape == expected.shape
    if padding == "same":
        assert got.shape[1:3] == (-(-h // stride), -(-w // stride))
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kind", ["max", "avg"])
@pytest.mark.parametrize(
    "h,w,k,stride,padding",
    [
        (4, 4, 2, 2, "valid"),
        (7, 5, 3, 2, "same"),
        (5, 5, 2, 2, "same"),
        (6, 7, 3, 1, "same"),
        (9, 9, 3, 2, "valid"),
    ],
)
def test_pooling_matches_direct_loop(kind, h, w, k, stride, padding):
    layer = (eo.MaxPool2D if kind == "max" else eo.AvgPool2D)(k, stride=stride, padding=padding)
    x = f64(2, h, w, 3)
    np.testing.assert_allclose(layer(eo.tensor(x)).data, pool_loop(x, k, stride, padding, kind), rtol=1e-12)


def _bn_reference(x, gamma, beta, eps, mean=None, var=None):
    axes = tuple(range(x.ndim - 1))
    mean = x.mean(axis=axes) if mean is None else mean
    var = x.var(axis=axes) if var is None else var
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


@pytest.mark.parametrize(
    "cls,shape", [(eo.BatchNorm1D, (16, 3)), (eo.BatchNorm1D, (4, 5, 3)), (eo.BatchNorm2D, (4, 3, 5, 3))]
)
def test_batchnorm_train_and_eval(cls, shape):
    bn = cls(3, momentum=0.1).to("float64")
    bn.weight.data[:] = [1.5, 0.5, -1.0]
    bn.bias.data[:] = [0.1, -0.2, 0.3]
    x = f64(*shape) * 2 + 1
    y = bn(eo.tensor(x)).data
    np.testing.assert_allclose(y, _bn_reference(x, bn.weight.data, bn.bias.data, bn.eps), rtol=1e-10, atol=1e-12)
    axes = tuple(range(x.ndim - 1))
    n = x.size // 3
    np.testing.assert_allclose(bn.running_mean.data, 0.1 * x.mean(axis=axes), rtol=1e-12)
    np.testing.assert_allclose(bn.running_var.data, 0.9 + 0.1 * x.var(axis=axes) * n / (n - 1), rtol=1e-12)
    bn.eval()
    x2 = f64(*shape)
    expected = _bn_reference(x2, bn.weight.data, bn.bias.data, bn.eps, bn.running_mean.data, bn.running_var.data)
    np.testing.assert_allclose(bn(eo.tensor(x2)).data, expected, rtol=1e-10, atol=1e-12)


def test_batchnorm_without_running_stats_uses_batch_statistics_in_eval():
    bn = eo.BatchNorm2D(2, track_running_stats=False).to("float64").eval()
    assert bn.running_mean is None and "running_mean" not in bn.state_dict()
    x = f64(3, 2, 2, 2)
    np.testing.assert_allclose(bn(eo.tensor(x)).data, _bn_reference(x, 1.0, 0.0, bn.eps), rtol=1e-10, atol=1e-12)


def test_layernorm_matches_reference():
    ln = eo.LayerNorm((3, 4)).to("float64")
    ln.weight.data[:] = f64(3, 4)
    ln.bias.data[:] = f64(3, 4)
    x = f64(2, 5, 3, 4)
    mean = x.mean(axis=(-2, -1), keepdims=True)
    var = x.var(axis=(-2, -1), keepdims=True)
    expected = (x - mean) / np.sqrt(var + 1e-5) * ln.weight.data + ln.bias.data
    np.testing.assert_allclose(ln(eo.tensor(x)).data, expected, rtol=1e-10, atol=1e-12)


def test_activations_match_numpy():
    x = f64(4, 6) * 4
    np.testing.assert_array_equal(eo.ReLU()(eo.tensor(x)).data, np.maximum(x, 0))
    np.testing.assert_allclose(eo.Sigmoid()(eo.tensor(x)).data, 1 / (1 + np.exp(-x)), rtol=1e-12)
    np.testing.assert_allclose(eo.Tanh()(eo.tensor(x)).data, np.tanh(x), rtol=1e-12)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    soft = e / e.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(eo.Softmax()(eo.tensor(x)).data, soft, rtol=1e-12)
    np.testing.assert_allclose(eo.LogSoftmax()(eo.tensor(x)).data, np.log(soft), rtol=1e-10)
    e0 = np.exp(x - x.max(axis=0, keepdims=True))
    np.testing.assert_allclose(eo.Softmax(axis=0)(eo.tensor(x)).data, e0 / e0.sum(axis=0, keepdims=True), rtol=1e-12)


def test_softmax_and_sigmoid_are_stable_for_huge_inputs():
    x = eo.tensor(np.array([[1000.0, 0.0, -1000.0]]))
    assert np.all(np.isfinite(eo.softmax(x).data)) and np.all(np.isfinite(eo.log_softmax(x).data))
    assert np.all(np.isfinite(eo.sigmoid(x).data))
    loss = eo.cross_entropy(x, np.array([2]))
    assert np.isclose(loss.item(), 2000.0)


def test_flatten_keeps_nhwc_order():
    x = f64(2, 3, 4, 5)
    np.testing.assert_array_equal(eo.Flatten()(eo.tensor(x)).data, x.reshape(2, -1))


def test_dropout_train_and_eval():
    drop = eo.Dropout(0.25, seed=0)
    x = np.ones((200, 200))
    y = drop(eo.tensor(x)).data
    kept = y != 0
    assert abs(kept.mean() - 0.75) < 0.01
    np.testing.assert_allclose(y[kept], 1 / 0.75)
    drop.eval()
    assert np.array_equal(drop(eo.tensor(x)).data, x)


def test_sequential_indexing_len_iteration():
    model = eo.Sequential(eo.Linear(8, 4, seed=0), eo.ReLU(), eo.Linear(4, 1, seed=1))
    assert len(model) == 3 and isinstance(model[0], eo.Linear) and isinstance(model[-1], eo.Linear)
    assert [type(m).__name__ for m in model] == ["Linear", "ReLU", "Linear"]
    out = model(eo.ones(3, 8))
    assert out.dtype == "float32" and out.shape == (3, 1) and model[0].weight.dtype == "float32"
    names = [n for n, _ in model.named_parameters()]
    assert names == ["0.weight", "0.bias", "2.weight", "2.bias"]


# --- gradients against finite differences --------------------------------------
LAYER_CASES = [
    ("Linear", lambda: eo.Linear(4, 3, seed=0), (3, 4)),
    ("Linear_rank3", lambda: eo.Linear(4, 2, seed=0), (2, 3, 4)),
    ("Conv2D_valid", lambda: eo.Conv2D(2, 3, 3, seed=0), (2, 5, 5, 2)),
    ("Conv2D_same_s2", lambda: eo.Conv2D(2, 2, 3, stride=2, padding="same", seed=0), (1, 5, 6, 2)),
    ("MaxPool2D", lambda: eo.MaxPool2D(2), (2, 4, 4, 2)),
    ("AvgPool2D_same", lambda: eo.AvgPool2D(3, stride=2, padding="same"), (1, 5, 5, 2)),
    ("Flatten", lambda: eo.Flatten(), (2, 2, 3, 2)),
    ("BatchNorm1D_train", lambda: eo.BatchNorm1D(3), (6, 3)),
    ("BatchNorm2D_train", lambda: eo.BatchNorm2D(2), (3, 2, 2, 2)),
    ("BatchNorm2D_eval", lambda: eo.BatchNorm2D(2).eval(), (3, 2, 2, 2)),
    ("LayerNorm", lambda: eo.LayerNorm(4), (3, 4)),
    ("ReLU", lambda: eo.ReLU(), (3, 4)),
    ("Sigmoid", lambda: eo.Sigmoid(), (3, 4)),
    ("Tanh", lambda: eo.Tanh(), (3, 4)),
    ("Softmax", lambda: eo.Softmax(), (3, 4)),
    ("LogSoftmax", lambda: eo.LogSoftmax(), (3, 4)),
    ("Dropout_eval", lambda: eo.Dropout(0.5).eval(), (3, 4)),
    (
        "Sequential_cnn",
        lambda: eo.Sequential(
            eo.Conv2D(1, 2, 3, padding="same", seed=0),
            eo.ReLU(),
            eo.MaxPool2D(2),
            eo.Flatten(),
            eo.Linear(8, 3, seed=1),
        ),
        (2, 4, 4, 1),
    ),
]


@pytest.mark.parametrize("name,make,shape", LAYER_CASES, ids=[c[0] for c in LAYER_CASES])
def test_layer_gradients(name, make, shape):
    layer = make()
    if isinstance(layer, eo.BatchNorm2D) and not layer.training:
        layer.running_mean.data[:] = [0.3, -0.2]
        layer.running_var.data[:] = [0.5, 2.0]
    x = f64(*shape)
    if name == "ReLU":
        x = np.where(np.abs(x) < 1e-3, 0.5, x)  # keep away from the kink
    check_module_gradients(layer, x, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("loss", [eo.MSELoss(), eo.BCEWithLogitsLoss()])
def test_loss_modules_match_functional(loss):
    p, t = f64(4, 3), rng.uniform(0, 1, (4, 3))
    fn = eo.mse_loss if isinstance(loss, eo.MSELoss) else eo.binary_cross_entropy_with_logits
    assert loss(eo.tensor(p), eo.tensor(t)).item() == fn(eo.tensor(p), eo.tensor(t)).item()
    if isinstance(loss, eo.MSELoss):
        assert np.isclose(loss(eo.tensor(p), eo.tensor(t)).item(), np.mean((p - t) ** 2))
    else:
        ref = -np.mean(t * np.log(1 / (1 + np.exp(-p))) + (1 - t) * np.log(1 - 1 / (1 + np.exp(-p))))
        assert np.isclose(loss(eo.tensor(p), eo.tensor(t)).item(), ref)


def test_cross_entropy_module_matches_reference():
    z, t = f64(5, 4), np.array([0, 3, 1, 1, 2])
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    assert np.isclose(eo.CrossEntropyLoss()(eo.tensor(z), t).item(), -logp[np.arange(5), t].mean())


@pytest.mark.parametrize(
    "loss",
    [
        lambda z: eo.cross_entropy(z, np.array([0, 1, 2, 1])),
        lambda z: eo.mse_loss(z, eo.tensor(np.ones((4, 3), dtype=np.float16))),
        lambda z: eo.binary_cross_entropy_with_logits(z, eo.tensor(np.ones((4, 3), dtype=np.float16))),
    ],
)
def test_losses_run_in_float32_even_on_float16_inputs(loss):
    z = eo.tensor((f64(4, 3) * 8).astype(np.float16), requires_grad=True)
    out = loss(z)
    assert out.dtype == "float32"
    out.backward()
    assert z.grad.dtype == np.float16 and np.all(np.isfinite(z.grad))


def test_max_pool_gives_a_tied_window_gradient_to_its_first_maximum_only():
    x = eo.tensor(np.array([[1.0, 3.0], [3.0, 0.0]]).reshape(1, 2, 2, 1), requires_grad=True)
    eo.max_pool2d(x, 2).sum().backward()
    np.testing.assert_array_equal(x.grad.reshape(2, 2), [[0.0, 1.0], [0.0, 0.0]])
