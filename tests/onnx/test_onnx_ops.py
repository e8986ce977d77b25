"""Every primitive op of core's op table, alone in a small model, traced and
checked against ONNX Runtime at batch 1 and 7 (the traced batch is 1; 7 goes
through the symbolic batch axis), with verify=True comparing every value."""

import numpy as np
import pytest
from onnx_agreement import assert_traced_agrees

import everyo as eo
from everyo import dispatch
from everyo.normalization_ops import normalize
from everyo.sequence_ops import split


class Fn(eo.Module):
    """A model whose forward is ``fn`` (with optional parameters)."""

    def __init__(self, fn, **params):
        super().__init__()
        self.fn = fn
        for name, value in params.items():
            setattr(self, name, eo.Parameter(value))

    def forward(self, *xs):
        return self.fn(self, *xs)


RNG = np.random.default_rng(0)
W = RNG.standard_normal((6, 5)).astype(np.float32)


def floats(*shape, positive=False, seed=0):
    def make(batch):
        x = np.random.default_rng(seed + batch).standard_normal((batch,) + shape).astype(np.float32)
        return np.abs(x) + 0.1 if positive else x

    return make


# (id, forward, input maker, parameters). Shapes are small and distinct so a wrong axis cannot pass.
OPS = [
    ("add_scalar", lambda m, x: x + 2.0, floats(3, 4), {}),
    # a traced size as a number (a mean over the dynamic batch), and as the shape of zeros/ones: computed in the graph
    ("size_as_a_divisor", lambda m, x: x.sum(axis=0) / x.shape[0], floats(3, 4), {}),
    ("zeros_of_a_traced_size", lambda m, x: x + eo.zeros(x.shape[0], 3, 1), floats(3, 4), {}),
    ("ones_of_a_traced_shape", lambda m, x: x * eo.ones(x.shape), floats(3, 4), {}),
    # eo.arange of a traced size (the batch axis, which the test varies): a Range node, not the traced numbers
    (
        "arange_of_a_traced_size",
        lambda m, x: x[:, :, 0] * eo.arange(x.shape[0], dtype="float32")[:, None],
        floats(3, 4),
        {},
    ),
    ("radd_broadcast", lambda m, x: eo.tensor(np.arange(4, dtype=np.float32)) + x, floats(3, 4), {}),
    ("sub", lambda m, x: x - x[:, :1], floats(3, 4), {}),
    ("rsub_scalar", lambda m, x: 1.0 - x, floats(3, 4), {}),
    ("mul_param", lambda m, x: x * m.w, floats(3, 4), {"w": RNG.standard_normal(4).astype(np.float32)}),
    ("div", lambda m, x: x / (eo.abs(x) + 1.0), floats(3, 4), {}),
    ("rdiv", lambda m, x: 1.0 / x, floats(3, 4, positive=True), {}),
    ("neg", lambda m, x: -x, floats(3, 4), {}),
    ("pow_2", lambda m, x: x**2, floats(3, 4), {}),
    ("pow_3", lambda m, x: eo.pow(x, 3), floats(3, 4), {}),
    ("pow_tensor", lambda m, x: eo.pow(x, x), floats(3, 4, positive=True), {}),
    ("matmul_param", lambda m, x: x @ m.w, floats(3, 6), {"w": W}),
    ("matmul_batched", lambda m, x: eo.matmul(x, eo.transpose(x, (0, 2, 1))), floats(3, 4), {}),
    ("linear", lambda m, x: eo.linear(x, m.w, m.b), floats(2, 6), {"w": W, "b": np.ones(5, np.float32)}),
    ("linear_no_bias", lambda m, x: eo.linear(x, m.w), floats(6), {"w": W}),
    ("sum_all", lambda m, x: eo.sum(x, axis=(1, 2)), floats(3, 4), {}),
    ("sum_keepdims", lambda m, x: x.sum(axis=-1, keepdims=True), floats(3, 4), {}),
    ("mean", lambda m, x: eo.mean(x, axis=1), floats(3, 4), {}),
    ("max", lambda m, x: eo.max(x, axis=2), floats(3, 4), {}),
    ("min_keepdims", lambda m, x: eo.min(x, axis=(1,), keepdims=True), floats(3, 4), {}),
    ("var", lambda m, x: eo.var(x, axis=-1), floats(3, 4), {}),
    ("var_ddof", lambda m, x: eo.var(x, axis=(1, 2), keepdims=True, ddof=1), floats(3, 4), {}),
    ("exp", lambda m, x: eo.exp(x), floats(3, 4), {}),
    ("log", lambda m, x: eo.log(x), floats(3, 4, positive=True), {}),
    ("sqrt", lambda m, x: eo.sqrt(x), floats(3, 4, positive=True), {}),
    ("abs", lambda m, x: eo.abs(x), floats(3, 4), {}),
    ("clip", lambda m, x: eo.clip(x, -0.5, 0.7), floats(3, 4), {}),
    ("clip_min_only", lambda m, x: eo.clip(x, min=0.1), floats(3, 4), {}),
    ("tanh", lambda m, x: eo.tanh(x), floats(3, 4), {}),
    ("sigmoid", lambda m, x: eo.sigmoid(x * 20), floats(3, 4), {}),
    ("relu", lambda m, x: eo.relu(x), floats(3, 4), {}),
    ("softmax_axis1", lambda m, x: eo.softmax(x, axis=1), floats(3, 4), {}),
    ("softmax_blocked", lambda m, x: eo.softmax(x, blocked=np.array([True, False, True, False])), floats(3, 4), {}),
    ("log_softmax", lambda m, x: eo.log_softmax(x), floats(3, 4), {}),
    ("reshape", lambda m, x: eo.reshape(x, (x.shape[0], 2, 6)), floats(3, 4), {}),
    ("reshape_minus_one", lambda m, x: x.reshape(-1, 4), floats(3, 4), {}),
    ("flatten", lambda m, x: eo.flatten(x), floats(3, 2, 2), {}),
    ("transpose", lambda m, x: eo.transpose(x, (2, 0, 1)), floats(3, 4), {}),
    ("transpose_T", lambda m, x: x.T, floats(3, 4), {}),
    (
        "concatenate",
        lambda m, x: eo.concatenate([x, -x, x[:, :1] * 0 + m.c], axis=1),
        floats(3, 4),
        {"c": np.ones(4, np.float32)},
    ),
    ("stack", lambda m, x: eo.stack([x, x * 2], axis=-1), floats(3, 4), {}),
    ("where_const_mask", lambda m, x: eo.where(np.array([True, False, True, True]), x, -x), floats(3, 4), {}),
    ("astype_roundtrip", lambda m, x: eo.astype(eo.astype(x * 3, "int64"), "float32"), floats(3, 4), {}),
    ("dropout_eval", lambda m, x: eo.dropout(x, 0.5, training=False), floats(3, 4), {}),
    ("getitem_int", lambda m, x: x[:, -1], floats(3, 4), {}),
    ("getitem_slices", lambda m, x: x[:, 1:, ::2], floats(3, 4), {}),
    ("getitem_ellipsis_none", lambda m, x: x[..., None, 1], floats(3, 4), {}),
    ("getitem_negative_step", lambda m, x: x[:, ::-1], floats(3, 4), {}),
    ("split", lambda m, x: tuple(split(x, [1, 3], axis=-1)), floats(3, 4), {}),
    ("equal", lambda m, x: eo.where(eo.equal(eo.relu(x), 0.0), x, -x), floats(3, 4), {}),
    ("not_equal", lambda m, x: eo.astype(eo.not_equal(eo.relu(x), 0.0), "float32"), floats(3, 4), {}),
    ("less", lambda m, x: eo.where(x < 0.5, x, 0.0), floats(3, 4), {}),
    ("less_equal", lambda m, x: eo.where(x <= m.w, x, 1.0), floats(3, 4), {"w": np.zeros(4, np.float32)}),
    ("greater", lambda m, x: eo.where(x > 0, x, 0.0), floats(3, 4), {}),
    ("greater_equal", lambda m, x: eo.where(x >= x[:, :1], x, 2.0), floats(3, 4), {}),
    ("maximum", lambda m, x: eo.maximum(x, m.w), floats(3, 4), {"w": np.zeros(4, np.float32)}),
    ("minimum", lambda m, x: eo.minimum(x, 0.25), floats(3, 4), {}),
    ("sin", lambda m, x: eo.sin(x), floats(3, 4), {}),
    ("cos", lambda m, x: eo.cos(x), floats(3, 4), {}),
    ("squeeze", lambda m, x: eo.squeeze(x[:, :1], axis=1), floats(3, 4), {}),
    ("expand_dims", lambda m, x: eo.expand_dims(x, (1, -1)), floats(3, 4), {}),
    ("moveaxis", lambda m, x: eo.moveaxis(x, 0, -1), floats(3, 4), {}),
    ("clone", lambda m, x: eo.clone(x) * 2, floats(3, 4), {}),
    (
        "take_along_axis",
        lambda m, x: eo.take_along_axis(x, eo.argmax(x, axis=2, keepdims=True), axis=2),
        floats(3, 4),
        {},
    ),
    ("take_along_axis_broadcast", lambda m, x: eo.take_along_axis(x, np.array([[[3, 0]]]), axis=2), floats(3, 4), {}),
    ("masked_fill", lambda m, x: eo.masked_fill(x, x < 0, -1.0), floats(3, 4), {}),
    ("one_hot", lambda m, x: eo.one_hot(eo.argmin(x, axis=-1), 4), floats(3, 4), {}),
    ("sort", lambda m, x: eo.sort(x, axis=-1), floats(3, 4), {}),
    ("sort_descending", lambda m, x: eo.sort(x, axis=1, descending=True), floats(3, 4), {}),
    ("topk", lambda m, x: eo.topk(x, 2), floats(3, 4), {}),
    ("topk_smallest", lambda m, x: eo.topk(x, 1, axis=1, largest=False), floats(3, 4), {}),
    ("einsum", lambda m, x: eo.einsum("bij,jk->bik", x, m.w), floats(3, 6), {"w": W}),
    ("einsum_implicit", lambda m, x: eo.einsum("bij,bkj", x, x), floats(3, 4), {}),
    ("argmax", lambda m, x: eo.argmax(x, axis=1), floats(3, 4), {}),
    ("argmax_keepdims", lambda m, x: eo.argmax(x, axis=-1, keepdims=True), floats(3, 4), {}),
    ("argmin", lambda m, x: eo.argmin(x, axis=2), floats(3, 4), {}),
    ("cumsum", lambda m, x: eo.cumsum(x, axis=1), floats(3, 4), {}),
    ("prod", lambda m, x: eo.prod(x, axis=(1, 2)), floats(3, 4), {}),
    ("std", lambda m, x: eo.std(x, axis=-1), floats(3, 4), {}),
    ("std_ddof", lambda m, x: eo.std(x, axis=1, keepdims=True, ddof=1), floats(3, 4), {}),
    ("logsumexp", lambda m, x: eo.logsumexp(x * 50, axis=-1), floats(3, 4), {}),
    (
        "logsumexp_minus_inf",
        lambda m, x: eo.logsumexp(eo.where(np.array([True, True, False, False]), x, -np.inf), axis=1, keepdims=True),
        floats(3, 4),
        {},
    ),
    ("norm", lambda m, x: eo.norm(x, axis=-1), floats(3, 4), {}),
    (
        "norm_1_inf_3",
        lambda m, x: eo.stack([eo.norm(x, 1, axis=1), eo.norm(x, np.inf, axis=1), eo.norm(x, 3, axis=1)]),
        floats(3, 4),
        {},
    ),
    (
        "conv2d",
        lambda m, x: eo.conv2d(x, m.k, m.b, stride=(2, 1), padding="same"),
        floats(5, 6, 2),
        {"k": RNG.standard_normal((3, 2, 2, 3)).astype(np.float32), "b": np.ones(3, np.float32)},
    ),
    ("max_pool2d", lambda m, x: eo.max_pool2d(x, 3, stride=2, padding="same"), floats(5, 6, 2), {}),
    ("avg_pool2d", lambda m, x: eo.avg_pool2d(x, 2, padding="same"), floats(5, 7, 2), {}),
    (
        "conv2d_dilation_groups",
        lambda m, x: eo.conv2d(x, m.k, dilation=(2, 1), groups=2, padding="same"),
        floats(7, 6, 4),
        {"k": RNG.standard_normal((3, 2, 2, 6)).astype(np.float32)},
    ),
    ("gelu", lambda m, x: eo.gelu(x * 3), floats(3, 4), {}),
    ("gelu_tanh", lambda m, x: eo.gelu(x * 3, approximate="tanh"), floats(3, 4), {}),
    ("silu", lambda m, x: eo.silu(x * 3), floats(3, 4), {}),
    ("leaky_relu", lambda m, x: eo.leaky_relu(x, 0.3), floats(3, 4), {}),
    ("elu", lambda m, x: eo.elu(x * 3, alpha=1.5), floats(3, 4), {}),
    ("softplus", lambda m, x: eo.softplus(x * 8, beta=0.5, threshold=3.0), floats(3, 4), {}),
    (
        "conv1d",
        lambda m, x: eo.conv1d(x, m.k, m.b, stride=2, padding=(2, 1), dilation=2, groups=2),
        floats(9, 4),
        {"k": RNG.standard_normal((3, 2, 4)).astype(np.float32), "b": np.ones(4, np.float32)},
    ),
    (
        "conv_transpose2d",
        lambda m, x: eo.conv_transpose2d(
            x, m.k, m.b, stride=(2, 3), padding=((1, 0), (0, 2)), output_padding=(1, 0), dilation=(1, 2)
        ),
        floats(4, 5, 2),
        {"k": RNG.standard_normal((3, 2, 2, 3)).astype(np.float32), "b": np.ones(3, np.float32)},
    ),
    ("upsample2d", lambda m, x: eo.upsample2d(x, (3, 2)), floats(3, 4, 2), {}),
    ("upsample2d_bilinear", lambda m, x: eo.upsample2d(x, 2, "bilinear"), floats(3, 4, 2), {}),
    ("normalize_trailing", lambda m, x: normalize(x, m.w, m.b, (1, 2)), floats(3, 4), {"w": W[:3, :4], "b": W[3:, 1:]}),
    ("normalize_no_affine", lambda m, x: normalize(x, axis=-1, eps=1e-3), floats(3, 4), {}),
    (
        "normalize_given_stats",
        lambda m, x: normalize(x, m.w, m.b, (0, 1), 1e-3, W[0, :4], np.abs(W[1, :4]) + 0.5),
        floats(3, 4),
        {"w": W[2, :4], "b": W[3, :4]},
    ),
]


@pytest.mark.parametrize("fn, make, params", [c[1:] for c in OPS], ids=[c[0] for c in OPS])
def test_op_agrees_with_runtime(fn, make, params, tmp_path):
    model = Fn(fn, **params)
    assert_traced_agrees(model, make, tmp_path / "op.onnx", sizes=[(1,), (7,)])


def test_embedding_is_a_gather_and_keeps_integer_ids(tmp_path):
    emb = eo.Embedding(11, 4, seed=0)
    proto = assert_traced_agrees(
        emb,
        lambda b, t: np.random.default_rng(b * t).integers(0, 11, (b, t)),
        tmp_path / "emb.onnx",
        sizes=[(1, 5), (7, 5), (3, 9)],
        dynamic_axes={"input": {0: "batch", 1: "seq"}},
    )
    assert [n.op_type for n in proto.graph.node] == ["Gather", "Identity"]


LOSSES = [
    ("mse_loss", lambda x, y: eo.mse_loss(x, y)),
    ("mse_loss_sum", lambda x, y: eo.mse_loss(x, y, reduction="sum")),
    ("binary_cross_entropy_with_logits", lambda x, y: eo.binary_cross_entropy_with_logits(x * 10, y)),
    # every option of every loss (issue 28): reduction="none", weights, thresholds
    ("mse_loss_none", lambda x, y: eo.mse_loss(x, y, reduction="none")),
    ("l1_loss", lambda x, y: eo.l1_loss(x, y)),
    ("l1_loss_none", lambda x, y: eo.l1_loss(x, y, reduction="none")),
    ("smooth_l1_loss", lambda x, y: eo.smooth_l1_loss(x, y, beta=0.5)),
    ("smooth_l1_loss_beta0_sum", lambda x, y: eo.smooth_l1_loss(x, y, "sum", beta=0.0)),
    ("huber_loss_none", lambda x, y: eo.huber_loss(x, y, "none", delta=0.7)),
    (
        "binary_cross_entropy_with_logits_weights",
        lambda x, y: eo.binary_cross_entropy_with_logits(
            x * 5, y, np.array([0.5, 2.0, 1.0], np.float32), pos_weight=np.array([3.0, 1.0, 0.2], np.float32)
        ),
    ),
    ("binary_cross_entropy_with_logits_none", lambda x, y: eo.binary_cross_entropy_with_logits(x, y, reduction="none")),
    ("binary_cross_entropy", lambda x, y: eo.binary_cross_entropy(eo.sigmoid(x), y)),
    (
        "binary_cross_entropy_weight_none",
        lambda x, y: eo.binary_cross_entropy(eo.sigmoid(x), y, np.array([0.5, 2.0, 1.0], np.float32), reduction="none"),
    ),
    ("kl_div", lambda x, y: eo.kl_div(eo.log_softmax(x), eo.softmax(y))),
    ("kl_div_batchmean_zero_targets", lambda x, y: eo.kl_div(eo.log_softmax(x), y / 3, reduction="batchmean")),
    ("kl_div_log_target", lambda x, y: eo.kl_div(eo.log_softmax(x), eo.log_softmax(y), "sum", log_target=True)),
    (
        "cross_entropy_probabilities",
        lambda x, y: eo.cross_entropy(x, eo.softmax(y), np.array([0.5, 2.0, 1.0], np.float32), label_smoothing=0.1),
    ),
]


@pytest.mark.parametrize("loss", [c[1] for c in LOSSES], ids=[c[0] for c in LOSSES])
def test_losses_with_targets_as_a_second_input(loss, tmp_path):
    def make(batch):
        rng = np.random.default_rng(batch)
        return rng.standard_normal((batch, 3)).astype(np.float32), (rng.random((batch, 3)) < 0.5).astype(np.float32)

    assert_traced_agrees(Fn(lambda m, x, y: loss(x, y)), make, tmp_path / "loss.onnx", sizes=[(1,), (7,)])


CLASS_WEIGHT = np.array([0.5, 2.0, 1.0, 3.0, 0.7], np.float32)


@pytest.mark.parametrize(
    "options",
    [
        {"reduction": "mean"},
        {"reduction": "sum"},
        {"reduction": "none"},
        {"weight": CLASS_WEIGHT, "ignore_index": 3},
        {"weight": CLASS_WEIGHT, "label_smoothing": 0.2, "reduction": "none"},
        {"ignore_index": 1, "label_smoothing": 0.1},
        {"nll": True, "weight": CLASS_WEIGHT, "ignore_index": 2},
        {"nll": True, "reduction": "none"},
    ],
    ids=lambda o: "-".join(f"{k}" if v is True else f"{k}={'w' if k == 'weight' else v}" for k, v in o.items()),
)
def test_cross_entropy_with_integer_targets(options, tmp_path):
    def make(batch, length):
        rng = np.random.default_rng(batch + length)
        return rng.standard_normal((batch, length, 5)).astype(np.float32), rng.integers(0, 5, (batch, length))

    options = dict(options)
    if options.pop("nll", False):
        model = Fn(lambda m, x, y: eo.nll_loss(eo.log_softmax(x), y, **options))
    else:
        model = Fn(lambda m, x, y: eo.cross_entropy(x, y, **options))
    assert_traced_agrees(
        model,
        make,
        tmp_path / "ce.onnx",
        sizes=[(1, 4), (7, 4), (3, 6)],
        dynamic_axes={"input0": {0: "batch", 1: "seq"}, "input1": {0: "batch", 1: "seq"}},
    )


def test_every_op_of_the_table_has_a_rule():
    from everyo.onnx.rules import RULES

    assert sorted(set(dispatch.OPS) - set(RULES)) == []
    untested = {r for r in RULES if not any(case[0].startswith(r) for case in OPS + LOSSES)}
    # The scans (test_onnx_sequence.py), embedding and nll_loss (with cross_entropy) have their own tests above.
    assert untested == {"rnn_scan", "lstm_scan", "gru_scan", "embedding", "nll_loss"}, untested


def test_argmax_over_the_flattened_tensor_and_cumsum_without_axis(tmp_path):
    model = Fn(lambda m, x: (eo.argmax(x), eo.argmax(x, keepdims=True), eo.cumsum(x)))
    assert_traced_agrees(model, floats(3, 4), tmp_path / "flat.onnx", sizes=[(2,)], dynamic_axes={})
