"""The convolution/pooling backward scatter (``_scatter_windows`` with pads):
window gradients added straight into the unpadded input gradient, checked
against a per-pixel loop, and conv2d's input gradient against finite
differences on geometries where whole kernel taps fall in the padding."""

import itertools

import numpy as np
import pytest

import everyo as eo
from everyo.conv import _scatter_windows
from everyo.testing import check_gradients


def _loop_scatter(grad_win, in_hw, pads, stride, dilation, channels_last):
    """Reference: every window entry added to its input pixel, one at a time."""
    n, oh, ow = grad_win.shape[:3]
    kh, kw = grad_win.shape[3:5] if channels_last else grad_win.shape[4:6]
    c = grad_win.shape[5] if channels_last else grad_win.shape[3]
    gx = np.zeros((n, *in_hw, c))
    for o, p, i, j in itertools.product(range(oh), range(ow), range(kh), range(kw)):
        y = o * stride[0] + i * dilation[0] - pads[0][0]
        x = p * stride[1] + j * dilation[1] - pads[1][0]
        if 0 <= y < in_hw[0] and 0 <= x < in_hw[1]:
            gx[:, y, x, :] += grad_win[:, o, p, i, j, :] if channels_last else grad_win[:, o, p, :, i, j]
    return gx


GEOMETRIES = [
    # (H, W), kernel, stride, dilation, ((top, bottom), (left, right))
    ((5, 5), (3, 3), (1, 1), (1, 1), ((1, 1), (1, 1))),  # 'same': the centre tap covers the input
    ((6, 7), (3, 2), (2, 1), (1, 1), ((0, 1), (1, 0))),
    ((4, 4), (2, 2), (1, 1), (1, 1), ((3, 3), (3, 2))),  # padding wider than the kernel: taps wholly in padding
    ((7, 6), (3, 3), (2, 3), (2, 1), ((2, 2), (0, 4))),
    ((3, 5), (1, 1), (1, 1), (1, 1), ((0, 0), (0, 0))),  # 1x1: the one tap covers the input
    ((9, 9), (5, 5), (3, 3), (1, 2), ((4, 0), (1, 3))),
]


@pytest.mark.parametrize("channels_last", [True, False])
@pytest.mark.parametrize("geometry", GEOMETRIES)
def test_scatter_matches_per_pixel_loop(geometry, channels_last):
    (h, w), kernel, stride, dilation, pads = geometry
    padded = (h + sum(pads[0]), w + sum(pads[1]))
    out_hw = tuple((padded[a] - dilation[a] * (kernel[a] - 1) - 1) // stride[a] + 1 for a in range(2))
    shape = (2, *out_hw, *kernel, 3) if channels_last else (2, *out_hw, 3, *kernel)
    grad_win = np.random.default_rng(0).standard_normal(shape)
    got = _scatter_windows(grad_win, (2, *padded, 3), kernel, stride, out_hw, np.float64, dilation, channels_last, pads)
    assert got.shape == (2, h, w, 3)
    np.testing.assert_allclose(got, _loop_scatter(grad_win, (h, w), pads, stride, dilation, channels_last), atol=1e-12)


@pytest.mark.parametrize("groups", [1, 2])
@pytest.mark.parametrize("geometry", GEOMETRIES)
def test_conv2d_gradients_on_padded_geometries(geometry, groups):
    (h, w), kernel, stride, dilation, pads = geometry
    rng = np.random.default_rng(1)
    x, weight, bias = (
        rng.standard_normal((2, h, w, 4)),
        rng.standard_normal((*kernel, 4 // groups, 2)),
        rng.standard_normal(2),
    )

    def conv(a, b, c):
        return eo.conv2d(a, b, c, stride=stride, padding=pads, dilation=dilation, groups=groups)

    check_gradients(conv, [x, weight, bias], name=f"conv2d{geometry}")


def test_max_and_avg_pool_gradients_with_padding_wider_than_half_the_window():
    x = np.random.default_rng(2).standard_normal((1, 5, 6, 2))
    check_gradients(lambda a: eo.max_pool2d(a, 3, stride=1, padding=1), [x], name="max_pool2d")
    check_gradients(lambda a: eo.avg_pool2d(a, 3, stride=2, padding=1), [x], name="avg_pool2d")
