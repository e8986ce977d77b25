"""The seed MLP's fast paths (issue 24): same bits as the plain NumPy reference."""

import numpy as np

import everyo as eo


def test_relu_backward_matches_the_reference_at_special_values():
    # Big enough to take the recycled-buffer path; special values on both sides.
    rng = np.random.default_rng(0)
    x = rng.standard_normal((256, 256)).astype(np.float32)
    g = rng.standard_normal((256, 256)).astype(np.float32)
    specials = np.array([0.0, -0.0, np.nan, -np.nan, np.inf, -np.inf, 1e-45, -1e-45], dtype=np.float32)
    x[0, : specials.size] = specials
    g[1, : specials.size] = specials  # infinite and NaN gradients at live and dead units
    x[1, : specials.size] = [1.0, -1.0, 2.0, -2.0, 0.0, -0.0, 3.0, -3.0]
    a = eo.tensor(x, requires_grad=True)
    eo.relu(a).backward(eo.tensor(g))
    # The reference: the gradient passes where not (max(x, 0) <= 0), else g * 0.
    out = np.maximum(x, 0)
    expected = g * (~(out <= 0)).astype(np.float32)
    assert a.grad.dtype == np.float32
    assert np.array_equal(a.grad.view(np.uint32), expected.view(np.uint32))
    assert np.isnan(a.grad[0, 2]) or a.grad[0, 2] == g[0, 2]  # a NaN input passes its gradient


def test_outer_product_is_the_blas_product_bit_for_bit_and_recycled():
    # A (m, 1) @ (1, n) product (the backward of a 1-unit output layer).
    rng = np.random.default_rng(1)
    g = rng.standard_normal((4096, 1)).astype(np.float32)
    w = rng.standard_normal((1, 128)).astype(np.float32)
    a, b = eo.tensor(g, requires_grad=True), eo.tensor(w, requires_grad=True)
    out = eo.matmul(a, b)
    assert np.array_equal(out.data.view(np.uint32), np.matmul(g, w).view(np.uint32))
    layer = eo.Linear(128, 1, seed=0)
    h = eo.tensor(rng.standard_normal((4096, 128)).astype(np.float32), requires_grad=True)
    eo.sum(layer(h)).backward()
    expected = np.matmul(np.ones((4096, 1), np.float32), layer.weight.data.T)
    assert np.array_equal(h.grad.view(np.uint32), expected.view(np.uint32))
    # Recycled: once the first result is dropped, the next one lands in its buffer.
    first = eo.matmul(a, b).data
    address = first.__array_interface__["data"][0]
    del first
    again = eo.matmul(a, b).data
    assert again.__array_interface__["data"][0] == address
    assert np.array_equal(again.view(np.uint32), np.matmul(g, w).view(np.uint32))
