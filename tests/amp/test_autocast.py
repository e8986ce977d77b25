"""autocast: which ops change precision, scoping (nesting, decorator, island,
threads, contexts), and that float16 numerics are real in both directions."""

import contextvars
import threading

import numpy as np
import pytest

import everyo as eo
from everyo import dispatch
from everyo.amp import is_autocast_enabled

RNG = np.random.default_rng(0)


def t32(*shape, positive=False, requires_grad=False):
    data = RNG.standard_normal(shape).astype(np.float32)
    if positive:
        data = np.abs(data) + 0.5
    return eo.tensor(data, requires_grad=requires_grad)


def t16(*shape, positive=False):
    return t32(*shape, positive=positive).astype("float16")


# op name -> callable building the op from fresh operands of a given dtype
def _operands(dtype):
    cast = (lambda t: t) if dtype == "float32" else (lambda t: t.astype("float16"))
    return {
        "a": cast(t32(4, 5)),
        "b": cast(t32(5, 3)),
        "w": cast(t32(5, 3)),
        "bias": cast(t32(3)),
        "p": cast(t32(4, 5, positive=True)),
        "img": cast(t32(2, 6, 6, 3)),
        "k": cast(t32(3, 3, 3, 4)),
        "kb": cast(t32(4)),
        "logits": cast(t32(4, 3)),
        "target": cast(t32(4, 3)),
    }


LOW_PRECISION_OPS = {
    "matmul": lambda o: eo.matmul(o["a"], o["b"]),
    "@": lambda o: o["a"] @ o["b"],
    "linear": lambda o: eo.linear(o["a"], o["w"], o["bias"]),
    "linear_nobias": lambda o: eo.linear(o["a"], o["w"]),
    "conv2d": lambda o: eo.conv2d(o["img"], o["k"], o["kb"], padding="same"),
    "Linear": lambda o: eo.Linear(5, 3, seed=0)(o["a"]),
    "Conv2D": lambda o: eo.Conv2D(3, 4, 3, seed=0)(o["img"]),
}

FLOAT32_OPS = {
    "sum": lambda o: eo.sum(o["a"], axis=0),
    "mean": lambda o: o["a"].mean(),
    "var": lambda o: eo.var(o["a"], axis=1),
    "exp": lambda o: eo.exp(o["a"]),
    "log": lambda o: eo.log(o["p"]),
    "pow": lambda o: o["p"] ** 3,
    "pow_square": lambda o: o["p"] ** 2,
    "pow_tensor": lambda o: eo.pow(o["p"], o["p"]),
    "softmax": lambda o: eo.softmax(o["logits"]),
    "log_softmax": lambda o: eo.log_softmax(o["logits"]),
    "mse_loss": lambda o: eo.mse_loss(o["logits"], o["target"]),
    "cross_entropy": lambda o: eo.cross_entropy(o["logits"], np.array([0, 2, 1, 0])),
    "bce_with_logits": lambda o: eo.binary_cross_entropy_with_logits(o["logits"], o["target"]),
}

# Normalisation layers compute their statistics and the normalisation in
# float32 but follow their input's type (Keras's mixed_float16): float16
# activations stay float16 downstream; float32 ones are not cast down.
NORMALIZATION_LAYERS = {
    "LayerNorm": lambda o: eo.LayerNorm(5)(o["a"]),
    "BatchNorm1D": lambda o: eo.BatchNorm1D(5)(o["a"]),
    "BatchNorm1D_eval": lambda o: eo.BatchNorm1D(5).eval()(o["a"]),
    "BatchNorm2D": lambda o: eo.BatchNorm2D(3)(o["img"]),
    "GroupNorm": lambda o: eo.GroupNorm(1, 3)(o["img"]),
}

FOLLOW_INPUT_OPS = {
    "add": lambda o: o["a"] + o["a"],
    "mul_scalar": lambda o: o["a"] * 3.0,
    "relu": lambda o: eo.relu(o["a"]),
    "tanh": lambda o: eo.tanh(o["a"]),
    "sigmoid": lambda o: eo.sigmoid(o["a"]),
    "sqrt": lambda o: eo.sqrt(o["p"]),
    "abs": lambda o: o["a"].abs(),
    "max": lambda o: o["a"].max(axis=1),
    "reshape": lambda o: o["a"].reshape(5, 4),
    "transpose": lambda o: o["a"].T,
    "getitem": lambda o: o["a"][1:3],
    "concatenate": lambda o: eo.concatenate([o["a"], o["a"]]),
    "max_pool2d": lambda o: eo.max_pool2d(o["img"], 2),
    "avg_pool2d": lambda o: eo.avg_pool2d(o["img"], 2),
    "Flatten": lambda o: eo.Flatten()(o["img"]),
}


@pytest.mark.parametrize("name", sorted(LOW_PRECISION_OPS))
@pytest.mark.parametrize("inputs", ["float32", "float16"])
def test_low_precision_ops_run_in_float16_under_autocast(name, inputs):
    with eo.autocast():
        out = LOW_PRECISION_OPS[name](_operands(inputs))
    assert out.dtype == "float16"


@pytest.mark.parametrize("name", sorted(FLOAT32_OPS))
def test_float32_ops_cast_float16_inputs_up_under_autocast(name):
    with eo.autocast():
        out = FLOAT32_OPS[name](_operands("float16"))
    assert out.dtype == "float32"
    # outside autocast the same float16 inputs stay float16, except that
    # losses always run in float32 (core's rule: the spec computes the loss
    # after the autocast block, on float16 predictions)
    out = FLOAT32_OPS[name](_operands("float16"))
    promoted = ("mse_loss", "cross_entropy", "bce_with_logits")
    expected = "float32" if name in promoted else "float16"
    assert out.dtype == expected


@pytest.mark.parametrize("name", sorted(FOLLOW_INPUT_OPS))
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_other_ops_follow_their_input_under_autocast(name, dtype):
    with eo.autocast():
        out = FOLLOW_INPUT_OPS[name](_operands(dtype))
    assert out.dtype == dtype


@pytest.mark.parametrize("name", sorted(NORMALIZATION_LAYERS))
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("enabled", [True, False])
def test_normalization_layers_follow_their_input(name, dtype, enabled):
    with eo.autocast(enabled):
        out = NORMALIZATION_LAYERS[name](_operands(dtype))
    assert out.dtype == dtype


@pytest.mark.parametrize("name", sorted(LOW_PRECISION_OPS))
def test_outside_autocast_nothing_changes_precision(name):
    assert LOW_PRECISION_OPS[name](_operands("float32")).dtype == "float32"


def test_spec_example():
    model = eo.Sequential(eo.Linear(8, 4, seed=0), eo.ReLU(), eo.Linear(4, 1, seed=1))
    with eo.autocast():
        output = model(eo.ones(3, 8))
    assert output.dtype == "float16"
    assert model[0].weight.dtype == "float32"
    assert model(eo.ones(3, 8)).dtype == "float32"  # off again after the block


def test_integer_operands_are_not_cast():
    a = eo.tensor(np.arange(6).reshape(2, 3))
    b = eo.tensor(np.arange(3).reshape(3, 1))
    with eo.autocast():
        assert (a @ b).dtype == "int64"


def test_nesting_and_island_restore_the_outer_state():
    x, w = t32(2, 3), t32(3, 2)
    assert not is_autocast_enabled()
    with eo.autocast():
        assert (x @ w).dtype == "float16"
        with eo.autocast(False):
            assert not is_autocast_enabled()
            assert (x @ w).dtype == "float32"
            with eo.autocast():
                assert (x @ w).dtype == "float16"
            assert (x @ w).dtype == "float32"
        assert (x @ w).dtype == "float16"
    assert not is_autocast_enabled()
    assert dispatch.get_policy() is None


def test_island_takes_float16_features_to_float32():
    head = eo.Linear(4, 2, seed=0)
    features = t32(3, 4, requires_grad=True)
    with eo.autocast():
        hidden = features * 1.0 @ eo.tensor(np.eye(4, dtype=np.float32))
        assert hidden.dtype == "float16"
        with eo.autocast(False):
            logits = head(hidden)
    assert logits.dtype == "float32"
    logits.sum().backward()
    assert head.weight.grad.dtype == np.float32 and features.grad.dtype == np.float32


def test_decorator_and_reentry():
    @eo.autocast()
    def forward(a, b):
        return a @ b

    @eo.autocast(False)
    def island(a, b):
        return a @ b

    x, w = t32(2, 3), t32(3, 2)
    assert forward(x, w).dtype == "float16"
    assert not is_autocast_enabled()
    with eo.autocast():
        assert island(x, w).dtype == "float32"
        assert is_autocast_enabled()
    assert forward.__name__ == "forward"

    ctx = eo.autocast()
    with ctx:
        with ctx:  # the same object entered twice
            assert is_autocast_enabled()
        assert is_autocast_enabled()
    assert not is_autocast_enabled()


def test_state_restored_after_an_exception():
    with pytest.raises(ZeroDivisionError):
        with eo.autocast():
            _ = 1 / 0
    assert not is_autocast_enabled()


def test_enabled_must_be_a_bool():
    with pytest.raises(TypeError, match="bool"):
        eo.autocast("yes")


def test_autocast_inside_no_grad():
    model = eo.Sequential(eo.Linear(8, 4, seed=0), eo.ReLU(), eo.Linear(4, 1, seed=1))
    with eo.no_grad():
        with eo.autocast():
            out = model(eo.ones(3, 8))
    assert out.dtype == "float16"
    assert not out.requires_grad and out.is_leaf
    # the same values as with the graph recorded
    with eo.autocast():
        again = model(eo.ones(3, 8))
    np.testing.assert_array_equal(out.data, again.data)


def test_autocast_does_not_leak_into_other_threads():
    x, w = t32(4, 3), t32(3, 2)
    inside, started, results = threading.Barrier(2), threading.Event(), {}

    def other_thread():
        inside.wait(timeout=10)  # the main thread is inside autocast now
        results["other_while_main_on"] = (x @ w).dtype
        with eo.autocast():
            started.set()
            results["other_own_autocast"] = (x @ w).dtype
            inside.wait(timeout=10)  # hold it while main checks

    worker = threading.Thread(target=other_thread)
    worker.start()
    with eo.autocast():
        inside.wait(timeout=10)
        started.wait(timeout=10)
        results["main"] = (x @ w).dtype
    results["main_after"] = (x @ w).dtype  # other thread still holds its autocast
    inside.wait(timeout=10)
    worker.join(timeout=10)
    assert results == {
        "other_while_main_on": "float32",
        "other_own_autocast": "float16",
        "main": "float16",
        "main_after": "float32",
    }


def test_autocast_is_local_to_a_contextvars_context():
    x, w = t32(2, 3), t32(3, 2)
    with eo.autocast():
        assert contextvars.Context().run(lambda: (x @ w).dtype) == "float32"
        assert contextvars.copy_context().run(lambda: (x @ w).dtype) == "float16"


# --- gradients -----------------------------------------------------------
def test_gradient_dtypes_master_weights_float32_activations_float16():
    model = eo.Sequential(eo.Linear(6, 5, seed=0), eo.ReLU(), eo.Linear(5, 2, seed=1))
    x = t32(4, 6, requires_grad=True)
    with eo.autocast():
        hidden = model[0](x).retain_grad()
        activated = model[1](hidden).retain_grad()
        out = model[2](activated).retain_grad()
    loss = eo.mse_loss(out, eo.zeros(4, 2))
    loss.backward()
    assert hidden.dtype == activated.dtype == out.dtype == "float16"
    assert hidden.grad.dtype == activated.grad.dtype == out.grad.dtype == np.float16
    assert x.grad.dtype == np.float32
    for p in model.parameters():
        assert p.grad.dtype == np.float32 and p.grad.shape == p.shape
    # the float16 gradient at the output is the float32 loss gradient rounded
    expected = (2.0 / out.size * out.data.astype(np.float32)).astype(np.float16)
    np.testing.assert_array_equal(out.grad, expected)


def test_gradients_close_to_float32_gradients():
    model = eo.Sequential(
        eo.Conv2D(2, 3, 3, padding="same", seed=0), eo.ReLU(), eo.Flatten(), eo.Linear(3 * 5 * 5, 2, seed=1)
    )
    x = t32(3, 5, 5, 2)
    eo.mse_loss(model(x), eo.ones(3, 2)).backward()
    reference = [p.grad.copy() for p in model.parameters()]
    model.zero_grad()
    with eo.autocast():
        out = model(x)
    eo.mse_loss(out, eo.ones(3, 2)).backward()
    for p, ref in zip(model.parameters(), reference):
        assert p.grad.dtype == np.float32
        np.testing.assert_allclose(p.grad, ref, rtol=2e-2, atol=2e-2 * np.abs(ref).max())


def test_backward_really_runs_in_float16_small_gradients_flush():
    w = eo.Parameter(np.full((3, 2), 0.5, dtype=np.float32))
    x = eo.ones(4, 3)
    with eo.autocast():
        y = eo.linear(x, w)
    (y.sum() * 1e-9).backward()  # the gradient reaching y is 1e-9 < float16's tiniest subnormal
    np.testing.assert_array_equal(w.grad, np.zeros((3, 2), np.float32))
    w.grad = None
    (eo.linear(x, w).sum() * 1e-9).backward()  # in float32 it survives
    np.testing.assert_allclose(w.grad, np.full((3, 2), 4e-9), rtol=1e-6)


# --- float16 numerics ------------------------------------------------------
def test_float16_matmul_is_float32_accumulation_rounded_once():
    a = RNG.standard_normal((7, 300)).astype(np.float32)
    b = RNG.standard_normal((300, 5)).astype(np.float32)
    with eo.autocast():
        out = eo.tensor(a) @ eo.tensor(b)
    a16, b16 = a.astype(np.float16), b.astype(np.float16)
    expected = (a16.astype(np.float64) @ b16.astype(np.float64)).astype(np.float16)
    # float32 accumulation differs from float64 by far less than half a float16 ulp,
    # so at most a rare one-ulp difference at a rounding boundary
    ulps = np.abs(out.data.view(np.int16).astype(np.int32) - expected.view(np.int16).astype(np.int32))
    assert ulps.max() <= 1 and (ulps > 0).mean() < 0.02


def test_float16_matmul_does_not_accumulate_in_float16():
    # A float16 running sum of 4096 ones sticks at 2048 (2048 + 1 rounds to 2048).
    ones = np.ones((1, 4096), dtype=np.float32)
    with eo.autocast():
        out = eo.tensor(ones) @ eo.tensor(ones.T)
    assert out.dtype == "float16" and out.item() == 4096.0


def test_linear_bias_is_added_before_rounding():
    # 3 * 683 = 2049 is a float16 tie (spacing 2 above 2048). Rounded once
    # after the bias: 2049 + 1 = 2050 exactly. Rounding the product first
    # would give 2048, then 2048 + 1 -> 2048 again.
    x = eo.tensor(np.array([[3.0]], dtype=np.float32))
    w = eo.tensor(np.array([[683.0]], dtype=np.float32))
    b = eo.tensor(np.array([1.0], dtype=np.float32))
    with eo.autocast():
        out = eo.linear(x, w, b)
        conv = eo.conv2d(x.reshape(1, 1, 1, 1), w.reshape(1, 1, 1, 1), b)
    assert out.dtype == conv.dtype == "float16"
    assert out.item() == conv.item() == 2050.0


def test_conv2d_under_autocast_matches_a_float16_rounded_reference():
    x = RNG.standard_normal((2, 5, 5, 3)).astype(np.float32)
    k = RNG.standard_normal((3, 3, 3, 4)).astype(np.float32)
    with eo.autocast():
        out = eo.conv2d(eo.tensor(x), eo.tensor(k), padding="valid")
    x16, k16 = x.astype(np.float16).astype(np.float64), k.astype(np.float16).astype(np.float64)
    ref = np.zeros((2, 3, 3, 4))
    for i in range(3):
        for j in range(3):
            ref[:, i, j, :] = np.tensordot(x16[:, i : i + 3, j : j + 3, :], k16, axes=([1, 2, 3], [0, 1, 2]))
    np.testing.assert_allclose(
        out.data.astype(np.float64), ref.astype(np.float16).astype(np.float64), rtol=2e-3, atol=1e-3
    )
