"""Average pooling's divisor: ``count_include_pad`` (issue 28).

Two conventions, both available: PyTorch counts padded cells (the default for
numeric padding), Keras/TensorFlow does not (the default for ``'same'``).
Checked against a direct loop written from each definition, against torch
where it is installed, and by finite differences.
"""

import numpy as np
import pytest

import everyo as eo
from everyo.testing import check_gradients

rng = np.random.default_rng(28)


def avg_loop(x, k, stride, pads, include):
    """Mean over each window of the zero-padded input, divided by k*k (include)
    or by the number of the window's cells that lie inside the input."""
    (t, b), (l, r) = pads
    n, h, w, c = x.shape
    xp = np.zeros((n, h + t + b, w + l + r, c))
    xp[:, t : t + h, l : l + w] = x
    inside = np.zeros(xp.shape[1:3])
    inside[t : t + h, l : l + w] = 1
    oh, ow = (h + t + b - k) // stride + 1, (w + l + r - k) // stride + 1
    out = np.zeros((n, oh, ow, c))
    for i in range(oh):
        for j in range(ow):
            rows, cols = slice(i * stride, i * stride + k), slice(j * stride, j * stride + k)
            divisor = k * k if include else inside[rows, cols].sum()
            out[:, i, j] = xp[:, rows, cols].sum(axis=(1, 2)) / divisor
    return out


CASES = [  # (h, w, k, stride, padding, pads the padding means)
    (7, 7, 3, 2, 1, ((1, 1), (1, 1))),
    (6, 5, 3, 1, 1, ((1, 1), (1, 1))),
    (5, 8, 2, 2, (1, 0), ((1, 1), (0, 0))),
    (7, 8, 3, 2, ((0, 2), (1, 0)), ((0, 2), (1, 0))),
]


@pytest.mark.parametrize("h,w,k,stride,padding,pads", CASES)
@pytest.mark.parametrize("include", [None, True, False])
def test_numeric_padding_counts_padded_cells_by_default(h, w, k, stride, padding, pads, include):
    x = rng.standard_normal((2, h, w, 3))
    got = eo.avg_pool2d(eo.tensor(x), k, stride, padding, count_include_pad=include).data
    expected = avg_loop(x, k, stride, pads, include is not False)  # None -> PyTorch's True
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-14)
    layer = eo.AvgPool2D(k, stride, padding, count_include_pad=include)
    np.testing.assert_allclose(layer(eo.tensor(x)).data, expected, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("h,w,k,stride", [(7, 5, 3, 2), (6, 7, 3, 1), (5, 5, 2, 2), (4, 4, 3, 3)])
@pytest.mark.parametrize("include", [None, True, False])
def test_same_padding_follows_keras_by_default(h, w, k, stride, include):
    from reference import tf_same_pads

    x = rng.standard_normal((2, h, w, 2))
    pads = (tf_same_pads(h, k, stride), tf_same_pads(w, k, stride))
    got = eo.avg_pool2d(eo.tensor(x), k, stride, "same", count_include_pad=include).data
    np.testing.assert_allclose(got, avg_loop(x, k, stride, pads, include is True), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("include", [None, True, False])
@pytest.mark.parametrize("padding", [1, "same", ((0, 1), (1, 0))])
def test_gradients_by_finite_differences(include, padding):
    check_gradients(
        lambda x: eo.avg_pool2d(x, 3, 2, padding, count_include_pad=include),
        [rng.standard_normal((1, 6, 5, 2))],
        name=f"avg_pool2d({padding}, count_include_pad={include})",
    )


@pytest.mark.parametrize("include", [None, True, False])
@pytest.mark.parametrize("k,stride,pad", [(3, 2, 1), (3, 1, 1), (2, 2, 1), (5, 3, 2)])
def test_matches_torch(include, k, stride, pad):
    torch = pytest.importorskip("torch")
    x = rng.standard_normal((2, 9, 8, 3)).astype(np.float32)
    ours = eo.tensor(x, requires_grad=True)
    out = eo.avg_pool2d(ours, k, stride, pad, count_include_pad=include)
    theirs = torch.tensor(x.transpose(0, 3, 1, 2), requires_grad=True)
    kwargs = {} if include is None else {"count_include_pad": include}
    ref = torch.nn.functional.avg_pool2d(theirs, k, stride, pad, **kwargs)
    np.testing.assert_allclose(out.data, ref.detach().numpy().transpose(0, 2, 3, 1), rtol=1e-5, atol=1e-6)
    g = rng.standard_normal(out.shape).astype(np.float32)
    out.backward(eo.tensor(g))
    ref.backward(torch.tensor(g.transpose(0, 3, 1, 2)))
    np.testing.assert_allclose(ours.grad.data, theirs.grad.numpy().transpose(0, 2, 3, 1), rtol=1e-5, atol=1e-6)


def test_bad_count_include_pad_is_refused():
    with pytest.raises(TypeError, match="AvgPool2D: count_include_pad must be True, False or None"):
        eo.AvgPool2D(2, count_include_pad="yes")
