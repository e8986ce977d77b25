"""Axis arguments are checked as NumPy checks them (0.1 took them modulo the
rank: ``x.sum(axis=2)`` on a matrix summed axis 0)."""

import numpy as np
import pytest

import everyo as eo
from everyo.axes import check_permutation, normalize_axes, normalize_axis
from everyo.sequence_ops import split

M = np.arange(6, dtype=np.float32).reshape(2, 3)

BAD_AXIS_CALLS = {
    "sum": lambda x, axis: eo.sum(x, axis=axis),
    "mean": lambda x, axis: eo.mean(x, axis=axis),
    "var": lambda x, axis: eo.var(x, axis=axis),
    "max": lambda x, axis: eo.max(x, axis=axis),
    "min": lambda x, axis: eo.min(x, axis=axis),
    "softmax": lambda x, axis: eo.softmax(x, axis=axis),
    "log_softmax": lambda x, axis: eo.log_softmax(x, axis=axis),
    "concatenate": lambda x, axis: eo.concatenate([x, x], axis=axis),
    "flatten": lambda x, axis: eo.flatten(x, start_axis=axis),
    "split": lambda x, axis: split(x, 1, axis=axis),
}


@pytest.mark.parametrize("op", sorted(BAD_AXIS_CALLS))
@pytest.mark.parametrize("axis", [2, -3, 7])
def test_out_of_range_axis_names_op_axis_and_rank(op, axis):
    with pytest.raises(
        eo.EveryOShapeError, match=rf"{op}: axis {axis} is out of range for a tensor of rank 2 \(shape \(2, 3\)\)"
    ):
        BAD_AXIS_CALLS[op](eo.tensor(M), axis)


def test_tuple_axes_out_of_range_and_repeated():
    with pytest.raises(eo.EveryOShapeError, match=r"sum: axis \(0, 2\) is out of range .* rank 2"):
        eo.sum(eo.tensor(M), axis=(0, 2))
    with pytest.raises(eo.EveryOShapeError, match="repeats an axis"):
        eo.mean(eo.tensor(M), axis=(1, -1))


def test_zero_d_with_an_axis():
    scalar = eo.tensor(np.float32(3.0))
    with pytest.raises(eo.EveryOShapeError, match="sum: axis 0 given for a 0-d tensor"):
        eo.sum(scalar, axis=0)
    assert eo.sum(scalar).data == 3.0 and eo.mean(scalar, axis=()).data == 3.0


def test_stack_accepts_one_past_the_last_axis_and_no_more():
    x = eo.tensor(M)
    assert eo.stack([x, x], axis=2).shape == (2, 3, 2) and eo.stack([x, x], axis=-3).shape == (2, 2, 3)
    with pytest.raises(
        eo.EveryOShapeError, match=r"stack: axis 3 is out of range for the rank-3 result \(input shape \(2, 3\)\)"
    ):
        eo.stack([x, x], axis=3)


def test_transpose_needs_a_permutation():
    x = eo.tensor(M)
    with pytest.raises(eo.EveryOShapeError, match=r"transpose: axes \(0, 0\) repeat an axis"):
        eo.transpose(x, (0, 0))
    with pytest.raises(eo.EveryOShapeError, match=r"transpose: axes \(1,\) must list each of the 2 axes"):
        x.transpose(1)
    with pytest.raises(eo.EveryOShapeError, match="transpose: axis 2 is out of range"):
        x.transpose(0, 2)
    np.testing.assert_array_equal(eo.transpose(x, (-1, 0)).data, M.T)


def test_join_shape_mismatch_is_named():
    with pytest.raises(
        eo.EveryOShapeError, match=r"concatenate: tensor 1 has shape \(2, 2\) but tensor 0 has shape \(2, 3\)"
    ):
        eo.concatenate([eo.tensor(M), eo.ones(2, 2)], axis=0)
    with pytest.raises(eo.EveryOShapeError, match="stack: needs at least one tensor"):
        eo.stack([])


def test_reshape_error_names_shapes():
    with pytest.raises(
        eo.EveryOShapeError, match=r"reshape: cannot reshape a tensor of shape \(2, 3\) \(6 elements\) to \(4, 2\)"
    ):
        eo.reshape(eo.tensor(M), (4, 2))


@pytest.mark.parametrize("axis", [None, 0, 1, -1, -2, (0, 1), (-1, 0), ()])
def test_valid_axes_match_numpy(axis):
    x3 = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    t = eo.tensor(x3)
    for name in ("sum", "mean", "var", "max", "min"):
        got = getattr(eo, name)(t, axis=axis, keepdims=True).data
        np.testing.assert_allclose(got, getattr(np, name)(x3, axis=axis, keepdims=True), rtol=1e-6, atol=1e-6)
    if isinstance(axis, int):
        e = np.exp(x3 - x3.max(axis=axis, keepdims=True))
        np.testing.assert_allclose(eo.softmax(t, axis=axis).data, e / e.sum(axis=axis, keepdims=True), rtol=1e-6)
        np.testing.assert_array_equal(eo.concatenate([t, t], axis=axis).data, np.concatenate([x3, x3], axis=axis))


def test_negative_axis_gradients():
    from everyo.testing import check_gradients

    x = np.random.default_rng(1).standard_normal((2, 3, 4))
    check_gradients(lambda t: eo.sum(t, axis=-1), [x])
    check_gradients(lambda t: eo.softmax(t, axis=-2), [x])
    check_gradients(lambda t: eo.max(t, axis=(-1, 0)), [x])
    check_gradients(lambda a, b: eo.concatenate([a, b], axis=-2), [x, x[:, :1]])


def test_helpers():
    assert normalize_axis(-1, (2, 3), "op") == 1
    assert normalize_axes((-1, 0), (2, 3, 4), "op") == (0, 2)
    assert normalize_axes(None, (2, 3), "op") == (0, 1)
    assert check_permutation((1, -2), (2, 3), "op") == (1, 0)
    with pytest.raises(TypeError, match="op: axis must be an integer"):
        normalize_axis(1.5, (2, 3), "op")
    with pytest.raises(TypeError, match="op: axis must be None, an integer or a tuple"):
        normalize_axes("a", (2, 3), "op")
