"""PyTorch's everyday tensor API (everyo.composites, einsum, the dim= spelling):
values against NumPy references and, where torch is installed, against torch;
gradients against central differences (everyo.testing) and torch's."""

import numpy as np
import pytest

import everyo as eo
from everyo.testing import check_gradients

RNG = np.random.default_rng(0)


def t(a, grad=False):
    return eo.tensor(np.asarray(a, dtype=np.float64), requires_grad=grad)


def _torch():
    return pytest.importorskip("torch")


# --- split / chunk --------------------------------------------------------------------
SPLITS = [((7, 3), 2, 0), ((7, 3), 3, 0), ((2, 7), [2, 5], 1), ((2, 6), 6, -1), ((2, 5), [0, 5], 1), ((5,), 10, 0)]
CHUNKS = [((7, 3), 3, 0), ((5, 2), 3, 0), ((2, 6), 4, 1), ((2, 3), 5, 1), ((4,), 4, 0)]


def _numpy_split(a, size, axis):
    n = a.shape[axis]
    sizes = list(size) if isinstance(size, list) else [size] * (n // size) + ([n % size] if n % size else [])
    return np.split(a, np.cumsum(sizes)[:-1], axis=axis)


@pytest.mark.parametrize("shape,size,dim", SPLITS)
def test_split_matches_numpy_and_torch(shape, size, dim):
    a = RNG.standard_normal(shape)
    pieces = eo.split(t(a), size, dim=dim)
    expected = _numpy_split(a, size, dim)
    assert [p.shape for p in pieces] == [e.shape for e in expected]
    for p, e in zip(pieces, expected):
        np.testing.assert_array_equal(p.data, e)
    check_gradients(lambda x: x.split(size, dim), [a], name="split")


@pytest.mark.parametrize("shape,size,dim", SPLITS)
def test_split_shapes_as_torch(shape, size, dim):
    torch = _torch()
    a = RNG.standard_normal(shape)
    ours = [p.shape for p in t(a).split(size, dim=dim)]
    assert ours == [tuple(p.shape) for p in torch.tensor(a).split(size, dim=dim)]


@pytest.mark.parametrize("shape,chunks,dim", CHUNKS)
def test_chunk_as_torch(shape, chunks, dim):
    a = RNG.standard_normal(shape)
    pieces = eo.chunk(t(a), chunks, dim)
    n = a.shape[dim]
    size = -(-n // chunks)
    assert [p.shape[dim] for p in pieces] == [min(size, n - i) for i in range(0, n, size)]
    np.testing.assert_array_equal(np.concatenate([p.data for p in pieces], axis=dim), a)
    check_gradients(lambda x: x.chunk(chunks, dim=dim), [a], name="chunk")
    torch = pytest.importorskip("torch")
    assert [p.shape for p in pieces] == [tuple(p.shape) for p in torch.tensor(a).chunk(chunks, dim)]


def test_split_and_chunk_refusals():
    with pytest.raises(eo.EveryOShapeError, match="add up to 5"):
        eo.split(eo.zeros(5), [2, 2])
    with pytest.raises(eo.EveryOShapeError, match="positive int"):
        eo.split(eo.zeros(5), 0)
    with pytest.raises(eo.EveryOShapeError, match="positive int"):
        eo.chunk(eo.zeros(5), 0)
    with pytest.raises(eo.EveryOShapeError, match="out of range"):
        eo.split(eo.zeros(5), 2, dim=1)


# --- permute / swapaxes / transpose / view -------------------------------------------
def test_permute_and_swapaxes():
    a = RNG.standard_normal((2, 3, 4))
    np.testing.assert_array_equal(t(a).permute(2, 0, 1).data, a.transpose(2, 0, 1))
    np.testing.assert_array_equal(eo.permute(t(a), (1, 2, 0)).data, a.transpose(1, 2, 0))
    np.testing.assert_array_equal(t(a).swapaxes(0, -1).data, np.swapaxes(a, 0, -1))
    check_gradients(lambda x: x.permute(1, 2, 0), [a], name="permute")
    check_gradients(lambda x: x.swapaxes(0, 2), [a], name="swapaxes")
    with pytest.raises(eo.EveryOShapeError, match="must list each of the 3 axes"):
        t(a).permute(1, 0)


def test_transpose_two_axes_swaps_as_torch():
    a = RNG.standard_normal((2, 3, 4, 5))
    np.testing.assert_array_equal(t(a).transpose(1, 2).data, np.swapaxes(a, 1, 2))
    np.testing.assert_array_equal(t(a).transpose(-1, -2).data, np.swapaxes(a, -1, -2))
    np.testing.assert_array_equal(t(a).transpose(3, 1, 0, 2).data, a.transpose(3, 1, 0, 2))  # a permutation still
    np.testing.assert_array_equal(t(a).transpose().data, a.T)
    np.testing.assert_array_equal(t(a[0, 0]).transpose(1, 0).data, a[0, 0].T)
    check_gradients(lambda x: x.transpose(0, 2), [a], name="transpose-swap")
    with pytest.raises(eo.EveryOSpellingError, match=r"x.T or x.swapaxes\(0, 1\)"):
        t(a[0, 0]).transpose(0, 1)
    np.testing.assert_array_equal(t(a[0, 0]).transpose((0, 1)).data, a[0, 0])
    torch = pytest.importorskip("torch")
    np.testing.assert_array_equal(t(a).transpose(1, 3).data, torch.tensor(a).transpose(1, 3).numpy())


def test_view_is_reshape():
    a = RNG.standard_normal((2, 6))
    np.testing.assert_array_equal(t(a).view(3, -1).data, a.reshape(3, 4))
    np.testing.assert_array_equal(t(a).view((4, 3)).data, a.reshape(4, 3))
    np.testing.assert_array_equal(t(a).view_as(eo.zeros(12)).data, a.reshape(12))
    check_gradients(lambda x: x.view(4, 3), [a], name="view")
    # NumPy semantics: a view of a non-contiguous tensor is a copy, not an error.
    assert t(a).T.view(12).shape == (12,)


def test_comparison_short_names():
    a, b = t([1.0, 2.0, 3.0]), t([3.0, 2.0, 1.0])
    for name, ufunc in [
        ("eq", np.equal),
        ("ne", np.not_equal),
        ("lt", np.less),
        ("le", np.less_equal),
        ("gt", np.greater),
        ("ge", np.greater_equal),
    ]:
        np.testing.assert_array_equal(getattr(a, name)(b).data, ufunc(a.data, b.data))
        np.testing.assert_array_equal(getattr(eo, name)(a, 2.0).data, ufunc(a.data, 2.0))


# --- the dim= / keepdim= spelling -------------------------------------------------------
@pytest.mark.parametrize(
    "op", ["sum", "mean", "prod", "logsumexp", "argmax", "argmin", "cumsum", "softmax", "log_softmax", "squeeze"]
)
def test_dim_is_axis(op):
    a = RNG.standard_normal((2, 1, 4)) if op == "squeeze" else RNG.standard_normal((2, 3, 4))
    x = t(a)
    np.testing.assert_array_equal(getattr(x, op)(dim=1).data, getattr(x, op)(axis=1).data)
    if op in ("sum", "mean", "prod", "logsumexp", "argmax"):
        np.testing.assert_array_equal(
            getattr(x, op)(dim=1, keepdim=True).data, getattr(x, op)(axis=1, keepdims=True).data
        )


def test_dim_in_functions_and_joins():
    a = RNG.standard_normal((2, 3))
    np.testing.assert_array_equal(eo.sum(t(a), dim=0).data, a.sum(0))
    np.testing.assert_array_equal(eo.concatenate([t(a), t(a)], dim=1).data, np.concatenate([a, a], 1))
    np.testing.assert_array_equal(eo.stack([t(a), t(a)], dim=2).data, np.stack([a, a], 2))
    with pytest.raises(TypeError, match="both dim= and axis="):
        t(a).sum(dim=0, axis=1)


def test_softmax_layers_take_dim():
    x = t(RNG.standard_normal((2, 3)))
    np.testing.assert_array_equal(eo.Softmax(dim=0)(x).data, eo.softmax(x, axis=0).data)
    np.testing.assert_array_equal(eo.LogSoftmax(dim=0)(x).data, eo.log_softmax(x, axis=0).data)
    with pytest.raises(TypeError, match="both dim= and axis="):
        eo.Softmax(0, dim=1)


def test_dim_refused_where_torch_means_more():
    x = t(RNG.standard_normal((3, 4)))
    with pytest.raises(eo.EveryOSpellingError, match=r"x.max\(axis=d\) and x.argmax\(axis=d\)"):
        x.max(dim=1)
    with pytest.raises(eo.EveryOSpellingError, match=r"x.min\(axis=d\) and x.argmin\(axis=d\)"):
        x.min(dim=1)
    with pytest.raises(eo.EveryOSpellingError, match="ddof=1"):
        x.var(dim=1)
    with pytest.raises(eo.EveryOSpellingError, match="ddof=1"):
        x.std(dim=0)
    torch = pytest.importorskip("torch")
    np.testing.assert_allclose(x.var(dim=1, ddof=1).data, torch.tensor(x.data).var(dim=1).numpy())


def test_size_is_the_count_and_calling_it_names_shape():
    x = eo.zeros(2, 3)
    assert x.size == 6 and x.numel() == 6 and isinstance(x.size, int)
    with pytest.raises(eo.EveryOSpellingError, match=r"write x.shape;"):
        x.size()
    with pytest.raises(eo.EveryOSpellingError, match=r"write x.shape\[1\]"):
        x.size(1)


# --- einsum: diagonals and ellipsis ----------------------------------------------------
EINSUMS = [
    ("ii->i", [(4, 4)]),
    ("ii", [(3, 3)]),
    ("iji->j", [(3, 2, 3)]),
    ("ii,i->i", [(3, 3), (3,)]),
    ("...ij,jk->...ik", [(2, 5, 3, 4), (4, 6)]),
    ("...ij,...jk->...ik", [(2, 5, 3, 4), (5, 4, 2)]),
    ("b...i,b...i->b...", [(2, 3, 4), (2, 3, 4)]),
    ("...ii->...i", [(2, 3, 3)]),
    ("...ij->j", [(2, 3, 4)]),
    ("...", [(2, 3)]),
    ("bij,bjk->bik", [(1, 2, 3), (4, 3, 2)]),
]


@pytest.mark.parametrize("spec,shapes", EINSUMS)
def test_einsum_diagonal_and_ellipsis(spec, shapes):
    arrays = [RNG.standard_normal(s) for s in shapes]
    out = eo.einsum(spec, *[t(a) for a in arrays])
    if "->j" not in spec or "..." not in spec:  # NumPy refuses to sum '...' away; torch does it
        np.testing.assert_allclose(out.data, np.einsum(spec, *arrays), rtol=1e-12)
    check_gradients(lambda *ts: eo.einsum(spec, *ts), arrays, name=spec)


@pytest.mark.parametrize("spec,shapes", EINSUMS)
def test_einsum_matches_torch(spec, shapes):
    torch = _torch()
    arrays = [RNG.standard_normal(s) for s in shapes]
    ours = [t(a, grad=True) for a in arrays]
    theirs = [torch.tensor(a, requires_grad=True) for a in arrays]
    out, ref = eo.einsum(spec, *ours), torch.einsum(spec, *theirs)
    np.testing.assert_allclose(out.data, ref.detach().numpy(), rtol=1e-12, atol=1e-12)
    w = RNG.standard_normal(out.shape)
    (out * t(w)).sum().backward()
    (ref * torch.tensor(w)).sum().backward()
    for o, r in zip(ours, theirs):
        np.testing.assert_allclose(o.grad, r.grad.numpy(), rtol=1e-12, atol=1e-12)


# --- multinomial ---------------------------------------------------------------------------
def test_multinomial_frequencies_follow_the_weights():
    w = np.array([1.0, 3.0, 0.0, 6.0])
    draws = eo.multinomial(eo.tensor(w), 20000, replacement=True, seed=1)
    assert draws.dtype == np.int64 and draws.shape == (20000,)
    freq = np.bincount(draws.data, minlength=4) / 20000
    np.testing.assert_allclose(freq, w / w.sum(), atol=0.015)  # ~5 standard errors
    assert freq[2] == 0


def test_multinomial_without_replacement_rows_and_seeds():
    w = np.array([[1.0, 1.0, 1.0, 0.0], [0.0, 5.0, 1.0, 2.0]])
    draws = eo.multinomial(w, 3, seed=0)
    assert draws.shape == (2, 3)
    for row, weights in zip(draws.data, w):
        assert len(set(row.tolist())) == 3 and all(weights[i] > 0 for i in row)
    np.testing.assert_array_equal(eo.multinomial(w, 3, seed=0).data, draws.data)
    eo.manual_seed(7)
    first = eo.multinomial(w, 2, replacement=True).data
    eo.manual_seed(7)
    np.testing.assert_array_equal(eo.multinomial(w, 2, replacement=True).data, first)
    # Without replacement, the first draw of each row follows the weights.
    firsts = np.array([eo.multinomial(w[1], 2, seed=s).data[0] for s in range(4000)])
    np.testing.assert_allclose(np.bincount(firsts, minlength=4) / 4000, w[1] / w[1].sum(), atol=0.03)


def test_multinomial_refusals():
    with pytest.raises(ValueError, match="3 distinct samples without replacement from a row with 2"):
        eo.multinomial([1.0, 1.0, 0.0], 3)
    with pytest.raises(ValueError, match="non-negative"):
        eo.multinomial([1.0, -1.0], 1)
    with pytest.raises(eo.EveryOShapeError, match="1-d or 2-d"):
        eo.multinomial(np.ones((2, 2, 2)), 1)
