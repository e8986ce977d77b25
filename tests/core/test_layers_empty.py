"""A batch of 0 rows (an empty data-parallel shard) goes through every layer:
empty output of the right shape, in train and eval mode, no warning, and
backward gives zero parameter gradients of the right shapes."""

import warnings

import numpy as np
import pytest

import everyo as eo

LAYERS = [  # (name, factory, per-sample input shape, per-sample output shape)
    ("Linear", lambda: eo.Linear(4, 3, seed=0), (4,), (3,)),
    ("Conv1D", lambda: eo.Conv1D(2, 3, 3, padding="causal", seed=0), (6, 2), (6, 3)),
    ("Conv2D", lambda: eo.Conv2D(2, 3, 3, seed=0), (5, 5, 2), (3, 3, 3)),
    (
        "Conv2D_groups_dilation",
        lambda: eo.Conv2D(4, 4, 3, padding="same", dilation=2, groups=4, seed=0),
        (5, 5, 4),
        (5, 5, 4),
    ),
    ("Conv2DTranspose", lambda: eo.Conv2DTranspose(2, 3, 3, stride=2, padding="same", seed=0), (3, 3, 2), (6, 6, 3)),
    ("MaxPool2D", lambda: eo.MaxPool2D(2), (4, 4, 2), (2, 2, 2)),
    ("AvgPool2D", lambda: eo.AvgPool2D(3, stride=2, padding="same"), (5, 5, 2), (3, 3, 2)),
    ("GlobalAveragePooling2D", lambda: eo.GlobalAveragePooling2D(), (3, 3, 2), (2,)),
    ("GlobalMaxPooling2D", lambda: eo.GlobalMaxPooling2D(), (3, 3, 2), (2,)),
    ("UpSampling2D", lambda: eo.UpSampling2D(2), (2, 3, 2), (4, 6, 2)),
    ("UpSampling2D_bilinear", lambda: eo.UpSampling2D(2, interpolation="bilinear"), (2, 3, 2), (4, 6, 2)),
    ("Flatten", lambda: eo.Flatten(), (2, 3, 4), (24,)),
    ("BatchNorm1D", lambda: eo.BatchNorm1D(3), (3,), (3,)),
    ("BatchNorm1D_rank3", lambda: eo.BatchNorm1D(3), (5, 3), (5, 3)),
    ("BatchNorm2D", lambda: eo.BatchNorm2D(2), (3, 3, 2), (3, 3, 2)),
    ("LayerNorm", lambda: eo.LayerNorm(4), (4,), (4,)),
    ("GroupNorm", lambda: eo.GroupNorm(2, 4), (3, 3, 4), (3, 3, 4)),
    ("ReLU", lambda: eo.ReLU(), (3,), (3,)),
    ("Sigmoid", lambda: eo.Sigmoid(), (3,), (3,)),
    ("Tanh", lambda: eo.Tanh(), (3,), (3,)),
    ("Softmax", lambda: eo.Softmax(), (3,), (3,)),
    ("LogSoftmax", lambda: eo.LogSoftmax(), (3,), (3,)),
    ("GELU", lambda: eo.GELU(), (3,), (3,)),
    ("GELU_tanh", lambda: eo.GELU(approximate="tanh"), (3,), (3,)),
    ("SiLU", lambda: eo.SiLU(), (3,), (3,)),
    ("LeakyReLU", lambda: eo.LeakyReLU(), (3,), (3,)),
    ("ELU", lambda: eo.ELU(), (3,), (3,)),
    ("Softplus", lambda: eo.Softplus(), (3,), (3,)),
    ("Identity", lambda: eo.Identity(), (3,), (3,)),
    ("Dropout", lambda: eo.Dropout(0.5, seed=0), (3,), (3,)),
    ("RNN", lambda: eo.RNN(3, 4, seed=0), (5, 3), (5, 4)),
    ("LSTM", lambda: eo.LSTM(3, 4, bidirectional=True, seed=0), (5, 3), (5, 8)),
    ("GRU", lambda: eo.GRU(3, 4, num_layers=2, seed=0), (5, 3), (5, 4)),
    ("MultiHeadAttention", lambda: eo.MultiHeadAttention(8, 2, seed=0), (5, 8), (5, 8)),
    (
        "TransformerEncoderLayer",
        lambda: eo.TransformerEncoderLayer(8, 2, dim_feedforward=16, activation="gelu", seed=0),
        (5, 8),
        (5, 8),
    ),
    (
        "Sequential_cnn",
        lambda: eo.Sequential(
            eo.Conv2D(1, 2, 3, padding="same", seed=0),
            eo.ReLU(),
            eo.MaxPool2D(2),
            eo.Flatten(),
            eo.Linear(8, 3, seed=1),
        ),
        (4, 4, 1),
        (3,),
    ),
]


def _first(out):
    return out[0] if isinstance(out, tuple) else out


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("name,make,in_shape,out_shape", LAYERS, ids=[c[0] for c in LAYERS])
def test_empty_batch(name, make, in_shape, out_shape, training):
    layer = make().train(training)
    before = {k: v.copy() for k, v in layer.state_dict().items()}
    x = eo.tensor(np.zeros((0,) + in_shape, dtype=np.float32), requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "Mean of empty slice" and friends are failures here
        out = _first(layer(x))
        assert out.shape == (0,) + out_shape
        assert out.dtype == "float32"
        out.sum().backward()
    assert x.grad is not None and x.grad.shape == x.shape
    for pname, p in layer.named_parameters():
        assert p.grad is None or (p.grad.shape == p.shape and not np.any(p.grad)), pname
    after = layer.state_dict()
    for k in before:  # running statistics untouched, nothing NaN
        np.testing.assert_array_equal(after[k], before[k], err_msg=k)


def test_batchnorm_after_an_empty_batch_still_normalises():
    bn = eo.BatchNorm2D(2)
    bn(eo.tensor(np.zeros((0, 3, 3, 2), dtype=np.float32)))
    x = np.random.default_rng(0).standard_normal((4, 3, 3, 2)).astype(np.float32)
    y = bn(eo.tensor(x)).data
    assert np.all(np.isfinite(y)) and np.all(np.isfinite(bn.running_mean.data))
    np.testing.assert_allclose(bn.running_mean.data, 0.1 * x.mean(axis=(0, 1, 2)), rtol=1e-5)


# --- losses over 0 elements: PyTorch's values, without a RuntimeWarning ---------------------
EMPTY_LOSSES = [
    ("mse_loss", lambda p: eo.mse_loss(p, eo.tensor(np.zeros((0, 3), np.float32))), (0, 3)),
    (
        "binary_cross_entropy_with_logits",
        lambda p: eo.binary_cross_entropy_with_logits(p, eo.tensor(np.zeros((0, 3), np.float32))),
        (0, 3),
    ),
    ("cross_entropy", lambda p: eo.cross_entropy(p, np.zeros(0, dtype=np.int64)), (0, 5)),
]


@pytest.mark.parametrize("name,loss,shape", EMPTY_LOSSES, ids=[c[0] for c in EMPTY_LOSSES])
def test_mean_loss_over_nothing_is_nan_quietly_and_sum_is_zero(name, loss, shape):
    pred = eo.tensor(np.zeros(shape, np.float32), requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        value = loss(pred)
        assert np.isnan(value.item())  # PyTorch: the mean of no elements is nan
        value.backward()
    assert pred.grad.shape == shape
    fn = {
        "mse_loss": eo.mse_loss,
        "binary_cross_entropy_with_logits": eo.binary_cross_entropy_with_logits,
        "cross_entropy": eo.cross_entropy,
    }[name]
    target = np.zeros(0, dtype=np.int64) if name == "cross_entropy" else eo.tensor(np.zeros(shape, np.float32))
    assert fn(eo.tensor(np.zeros(shape, np.float32)), target, reduction="sum").item() == 0.0


def test_empty_batch_through_embedding_and_decoder():
    emb = eo.Embedding(10, 8, seed=0)
    dec = eo.TransformerDecoderLayer(8, 2, dim_feedforward=16, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tokens = emb(np.zeros((0, 5), dtype=np.int64))
        out = dec(tokens, eo.zeros(0, 4, 8))
        assert out.shape == (0, 5, 8)
        out.sum().backward()
    assert emb.weight.grad.shape == (10, 8) and not np.any(emb.weight.grad)
