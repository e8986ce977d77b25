"""The primitive ops behind the sequence layers: multi-output relay, split,
embedding gather, masked softmax and the fused recurrences. Every gradient is
checked against central differences through everyo.testing."""

import numpy as np
import pytest

import everyo as eo
from everyo.normalization_ops import normalize
from everyo.recurrent_ops import gru_scan, lstm_scan, rnn_scan
from everyo.sequence_ops import EveryOIndexError, embedding, split
from everyo.testing import check_gradients


def rand(*shape, seed=0, scale=1.0):
    return np.random.default_rng(seed).standard_normal(shape) * scale


# --- split / multi-output ------------------------------------------------------
@pytest.mark.parametrize("sections", [3, [1, 4, 1]])
def test_split_gradient(sections):
    check_gradients(lambda x: tuple(split(x, sections, axis=-1)), [rand(2, 3, 6)], name="split")


def test_split_only_a_secondary_output_used():
    # Only the last piece reaches the loss: the op's backward must still run
    # (through the relay) and give zeros to the other pieces' columns.
    x = eo.tensor(rand(2, 6), requires_grad=True)
    a, b, c = split(x, 3, axis=1)
    (c * 2.0).sum().backward()
    expected = np.zeros((2, 6))
    expected[:, 4:] = 2.0
    np.testing.assert_array_equal(x.grad, expected)


def test_split_relays_add_nothing_to_the_first_pieces_gradient():
    """The relays of a multi-output op make its backward run but add nothing: the first
    piece's gradient arrives as it is (its -0.0 stays -0.0, as in PyTorch), not summed with
    zero arrays (which cost two full-size sums and turn -0.0 into +0.0)."""
    from everyo import autograd

    x = eo.tensor(rand(2, 6), requires_grad=True)
    a, b, c = split(x, 3, axis=1)
    minus_zero = np.full((2, 2), -0.0)
    ((a * minus_zero).sum() + (b * 3.0).sum() + (c * 2.0).sum()).backward()
    assert np.signbit(x.grad[:, :2]).all() and (x.grad[:, :2] == 0).all()
    np.testing.assert_array_equal(x.grad[:, 2:], [[3, 3, 2, 2], [3, 3, 2, 2]])
    sums = []
    real_add = autograd._add
    try:
        autograd._add = lambda p, q: sums.append((p.shape, q.shape)) or real_add(p, q)
        x.grad = None
        a, b, c = split(x, 3, axis=1)
        ((a * 1.0).sum() + (b * 3.0).sum() + (c * 2.0).sum()).backward()
    finally:
        autograd._add = real_add
    assert (2, 2) not in [shape for pair in sums for shape in pair]  # nothing summed into a's gradient
    assert repr(autograd.ZERO) == "everyo.autograd.ZERO"


def test_split_rejects_uneven_sizes():
    with pytest.raises(eo.EveryOShapeError, match="divide"):
        split(eo.zeros(2, 5), 2, axis=1)


# --- embedding -------------------------------------------------------------------
def test_embedding_gradient_with_repeated_ids():
    ids = np.array([[0, 2, 2], [3, 2, 0]])
    weight = eo.tensor(rand(5, 3), requires_grad=True)
    check_gradients(lambda: embedding(ids, weight), [], params=[weight], name="embedding")
    weight.grad = None
    embedding(ids, weight).sum().backward()
    # Row 2 is used three times, rows 0 twice, row 3 once, rows 1 and 4 never.
    np.testing.assert_array_equal(weight.grad[:, 0], [2, 0, 3, 1, 0])


def test_embedding_padding_row_gets_no_gradient():
    weight = eo.tensor(rand(4, 2), requires_grad=True)
    embedding(np.array([1, 1, 3]), weight, padding_idx=1).sum().backward()
    np.testing.assert_array_equal(weight.grad, [[0, 0], [0, 0], [0, 0], [1, 1]])


@pytest.mark.parametrize("bad", [5, -1])
def test_embedding_out_of_range_is_an_error(bad):
    with pytest.raises(EveryOIndexError, match=f"index {bad} is out of range .* 5 rows"):
        embedding(np.array([0, bad]), eo.zeros(5, 2))
    assert issubclass(EveryOIndexError, IndexError) and issubclass(EveryOIndexError, eo.EveryOError)


def test_embedding_rejects_float_ids():
    with pytest.raises(eo.EveryODTypeError, match="integers"):
        embedding(np.array([0.0, 1.0]), eo.zeros(5, 2))


# --- masked softmax ----------------------------------------------------------------
def test_masked_softmax_without_mask_matches_numpy():
    x = rand(3, 5)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    np.testing.assert_allclose(eo.softmax(eo.tensor(x)).data, e / e.sum(axis=-1, keepdims=True), rtol=1e-12)


def test_masked_softmax_gradient_with_blocked_entries_and_empty_rows():
    blocked = rand(2, 3, 4, seed=1) > 0.3
    blocked[0, 1] = True  # a fully blocked row
    blocked[1, 2] = False
    out = check_gradients(lambda x: eo.softmax(x, blocked=blocked), [rand(2, 3, 4)], name="masked_softmax")
    assert np.all(np.isfinite(out[0]))


def test_masked_softmax_fully_blocked_row_is_zero_not_nan():
    x = eo.tensor(rand(2, 4) * 1e3)
    blocked = np.array([[True] * 4, [False, True, False, True]])
    y = eo.softmax(x, blocked=blocked).data
    np.testing.assert_array_equal(y[0], 0)
    ref = np.exp(x.data[1, [0, 2]] - x.data[1, [0, 2]].max())
    np.testing.assert_allclose(y[1, [0, 2]], ref / ref.sum(), rtol=1e-6)
    np.testing.assert_array_equal(y[1, [1, 3]], 0)
    # -inf scores (an additive float mask) are ignored the same way.
    z = eo.softmax(eo.tensor(np.full((1, 3), -np.inf))).data
    np.testing.assert_array_equal(z, 0)


# --- fused recurrences -----------------------------------------------------------
B, T, H = 2, 4, 3


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("nonlinearity", ["tanh", "relu"])
def test_rnn_scan_gradient(reverse, nonlinearity):
    check_gradients(
        lambda xp, h0, w: tuple(rnn_scan(xp, h0, w, nonlinearity, reverse)),
        [rand(B, T, H), rand(B, H, seed=1), rand(H, H, seed=2, scale=0.5)],
        name="rnn_scan",
    )


@pytest.mark.parametrize("reverse", [False, True])
def test_lstm_scan_gradient(reverse):
    check_gradients(
        lambda xp, h0, c0, w: tuple(lstm_scan(xp, h0, c0, w, reverse)),
        [rand(B, T, 4 * H), rand(B, H, seed=1), rand(B, H, seed=2), rand(H, 4 * H, seed=3, scale=0.5)],
        name="lstm_scan",
    )


@pytest.mark.parametrize("reverse", [False, True])
def test_gru_scan_gradient(reverse):
    check_gradients(
        lambda xp, h0, w, b: tuple(gru_scan(xp, h0, w, b, reverse)),
        [rand(B, T, 3 * H), rand(B, H, seed=1), rand(H, 3 * H, seed=2, scale=0.5), rand(3 * H, seed=3)],
        name="gru_scan",
    )


def test_lstm_scan_only_final_cell_state_used():
    # The loss reads c_last alone: the backward must still reach every input.
    xp = eo.tensor(rand(B, T, 4 * H), requires_grad=True)
    h0, c0 = eo.tensor(rand(B, H, seed=1)), eo.tensor(rand(B, H, seed=2))
    w = eo.tensor(rand(H, 4 * H, seed=3), requires_grad=True)
    check_gradients(lambda xp, w: lstm_scan(xp, h0, c0, w)[2], [xp.data, w.data], name="lstm_scan c_last")


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("mask_dtype", [bool, np.int64])
def test_masked_softmax_broadcast_causal_mask_matches_float64_reference(dtype, mask_dtype):
    # A causal (L, S) mask broadcast over (B, H, L, S) scores, as attention passes it;
    # a non-boolean mask is read by truth value. The input is left untouched.
    x = (rand(2, 3, 5, 5, seed=4) * 4).astype(dtype)
    before = x.copy()
    blocked = np.triu(np.ones((5, 5)), k=1).astype(mask_dtype)
    y = eo.softmax(eo.tensor(x), blocked=blocked).data
    assert y.dtype == dtype
    ref = np.where(blocked.astype(bool), -np.inf, x.astype(np.float64))
    ref = np.exp(ref - ref.max(axis=-1, keepdims=True))
    ref /= ref.sum(axis=-1, keepdims=True)
    tol = 2e-3 if dtype == np.float16 else 1e-6
    np.testing.assert_allclose(y, ref, rtol=tol, atol=tol)
    np.testing.assert_array_equal(y[..., blocked.astype(bool)], 0)
    np.testing.assert_array_equal(x, before)


@pytest.mark.parametrize(
    "op",
    [
        lambda x: eo.softmax(x),
        lambda x: eo.softmax(x, blocked=np.eye(4, 6, dtype=bool)),
        lambda x: eo.log_softmax(x),
        lambda x: normalize(x, axis=-1),
        lambda x: normalize(x, eo.tensor(rand(6, seed=7)), eo.tensor(rand(6, seed=8)), axis=-1),
    ],
)
def test_softmax_log_softmax_normalize_backward_leave_upstream_gradient_alone(op):
    # Their backwards work in place in buffers of their own, never in the
    # gradient they are given (the graph may hand the same array to others).
    x = eo.tensor(rand(3, 4, 6, seed=5), requires_grad=True)
    g = rand(3, 4, 6, seed=6)
    before = g.copy()
    op(x).backward(g, retain_graph=True)
    np.testing.assert_array_equal(g, before)
    first = np.array(x.grad.data if isinstance(x.grad, eo.Tensor) else x.grad)
    x.grad = None
    op(x).backward(g)
    np.testing.assert_array_equal(x.grad.data if isinstance(x.grad, eo.Tensor) else x.grad, first)


def test_softmax_log_softmax_normalize_together_gradient():
    # Central differences through the three in-place backwards on one input.
    def f(x):
        return eo.softmax(x) + eo.log_softmax(x) + normalize(x, axis=-1)

    check_gradients(f, [rand(3, 4, 6, seed=5)], name="softmax+log_softmax+normalize")
