"""Plain-NumPy reference implementations, written directly from the definitions
(loops over output pixels), independent of EveryO's vectorised code."""

import math

import numpy as np


def tf_same_pads(size, k, s):
    out = math.ceil(size / s)
    total = max((out - 1) * s + k - size, 0)
    return total // 2, total - total // 2


def conv2d_loop(x, w, b, stride, padding):
    n, h, wd, c = x.shape
    kh, kw, _, o = w.shape
    if padding == "same":
        (t, bt), (l, rt) = tf_same_pads(h, kh, stride), tf_same_pads(wd, kw, stride)
    else:
        t = bt = l = rt = 0
    xp = np.zeros((n, h + t + bt, wd + l + rt, c))
    xp[:, t : t + h, l : l + wd] = x
    oh = (h + t + bt - kh) // stride + 1
    ow = (wd + l + rt - kw) // stride + 1
    out = np.zeros((n, oh, ow, o))
    for i in range(oh):
        for j in range(ow):
            patch = xp[:, i * stride : i * stride + kh, j * stride : j * stride + kw, :]
            for q in range(o):
                out[:, i, j, q] = (patch * w[:, :, :, q]).sum(axis=(1, 2, 3))
    return out + (0 if b is None else b)


def pool_loop(x, k, stride, padding, kind):
    n, h, wd, c = x.shape
    if padding == "same":
        (t, bt), (l, rt) = tf_same_pads(h, k, stride), tf_same_pads(wd, k, stride)
    else:
        t = bt = l = rt = 0
    oh = (h + t + bt - k) // stride + 1
    ow = (wd + l + rt - k) // stride + 1
    out = np.zeros((n, oh, ow, c))
    for i in range(oh):
        for j in range(ow):
            # window in unpadded coordinates, clipped: padded cells never count
            r0, c0 = i * stride - t, j * stride - l
            rows = slice(max(r0, 0), min(r0 + k, h))
            cols = slice(max(c0, 0), min(c0 + k, wd))
            patch = x[:, rows, cols, :]
            out[:, i, j, :] = patch.max(axis=(1, 2)) if kind == "max" else patch.mean(axis=(1, 2))
    return out
