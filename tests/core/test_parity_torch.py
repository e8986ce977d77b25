"""EveryO against PyTorch 2.13, op x input variant, generated (issue 28).

Every elementwise op over transposed, large (+-1e4), tiny (1e-4), empty, 0-d,
1-D, size-1 and NaN/inf inputs; binary ops with broadcasting; reductions over
axis/keepdims and the same edge shapes; matmul, conv, pooling and
normalisation. Forward values (float32: 1e-5) and gradients (1e-4) must
agree, NaN where PyTorch has NaN; where PyTorch raises, EveryO must raise an
EveryO error naming the op. Losses are compared in test_losses_torch.py and
optimizers in test_optim_torch.py (same cell).

Deliberate differences are listed in CONVENTIONS, each with its reason; the
test checks that the difference is exactly the documented one, so any other
drift fails.

Runs where torch is installed: the Python 3.11 core cell installs it and fails
if it cannot import it (tests/core/conftest.py).
"""

import numpy as np
import pytest

import everyo as eo

torch = pytest.importorskip("torch")
F = torch.nn.functional

rng = np.random.default_rng(28)


def _nan_inf(shape):
    a = rng.standard_normal(shape).astype(np.float32)
    flat = a.reshape(-1)
    flat[: min(4, flat.size)] = [np.nan, np.inf, -np.inf, 0.0][: min(4, flat.size)]
    return a


VARIANTS = {
    "normal": lambda: rng.standard_normal((3, 4)).astype(np.float32),
    "transposed": lambda: rng.standard_normal((4, 3)).astype(np.float32).T,
    "large": lambda: (rng.standard_normal((3, 4)) * 1e4).astype(np.float32),
    "tiny": lambda: (rng.standard_normal((3, 4)) * 1e-4).astype(np.float32),
    "empty": lambda: np.zeros((0, 4), np.float32),
    "0-d": lambda: np.asarray(rng.standard_normal(), np.float32),
    "1-D": lambda: rng.standard_normal(5).astype(np.float32),
    "size-1": lambda: rng.standard_normal((1, 1)).astype(np.float32),
    "nan-inf": lambda: _nan_inf((3, 4)),
}

UNARY = {
    "abs": (eo.abs, torch.abs),
    "neg": (eo.neg, torch.neg),
    "exp": (eo.exp, torch.exp),
    "log": (eo.log, torch.log),
    "sqrt": (eo.sqrt, torch.sqrt),
    "tanh": (eo.tanh, torch.tanh),
    "sigmoid": (eo.sigmoid, torch.sigmoid),
    "relu": (eo.relu, torch.relu),
    "sin": (eo.sin, torch.sin),
    "cos": (eo.cos, torch.cos),
    "gelu": (eo.gelu, F.gelu),
    "gelu_tanh": (lambda x: eo.gelu(x, approximate="tanh"), lambda x: F.gelu(x, approximate="tanh")),
    "silu": (eo.silu, F.silu),
    "elu": (eo.elu, F.elu),
    "leaky_relu": (eo.leaky_relu, F.leaky_relu),
    "softplus": (eo.softplus, F.softplus),
    "clip": (lambda x: eo.clip(x, -0.5, 0.5), lambda x: torch.clamp(x, -0.5, 0.5)),
    "pow2": (lambda x: x**2, lambda x: x**2),
    "pow3": (lambda x: x**3, lambda x: x**3),
    "rdiv": (lambda x: 1.0 / x, lambda x: 1.0 / x),
}


# Deliberate differences: (op, variant) -> (why, how PyTorch's result is adjusted to EveryO's).
# The adjusted result must then match everywhere, so nothing else may differ.
def _nan_input_nan_gradient(x, fwd, grad):
    grad[np.isnan(x)] = np.nan
    return fwd, grad


def _gelu_of_inf_is_inf(x, fwd, grad):
    fwd[x == np.inf] = np.inf
    return fwd, grad


CONVENTIONS = {
    # PyTorch's abs and elu backward give 0 at a NaN input (sign(NaN) = 0 there);
    # EveryO's gradient stays NaN, so a NaN is never turned into a number that
    # the GradScaler or the user could miss.
    ("abs", "nan-inf"): _nan_input_nan_gradient,
    ("elu", "nan-inf"): _nan_input_nan_gradient,
    # gelu(+inf) is +inf (x * Phi(x) -> inf * 1); PyTorch 2.13 on the CPU returns NaN where
    # its kernels are AVX-512's (an Intel Xeon), +inf where they are AVX2's (an AMD EPYC).
    ("gelu", "nan-inf"): _gelu_of_inf_is_inf,
}
# Conventions PyTorch shares on some CPUs (torch.backends.cpu.get_cpu_capability()): PyTorch's
# forward there may be EveryO's or the documented other value, nothing else.
BY_CPU = {("gelu", "nan-inf")}


def _compare(
    name, ours_fn, theirs_fn, arrays, fwd_rtol=1e-5, grad_rtol=1e-4, atol=1e-6, convention=None, reference=None
):
    ours = [eo.tensor(a, requires_grad=True) for a in arrays]
    theirs = [torch.tensor(a, dtype=reference, requires_grad=True) for a in arrays]
    try:
        ref = theirs_fn(*theirs)
    except (RuntimeError, IndexError, ValueError) as exc:
        with pytest.raises(eo.EveryOError) as info:
            ours_fn(*ours)
        assert name.split("-")[0].split("_")[0] in str(info.value), (name, str(exc), str(info.value))
        return
    out = ours_fn(*ours)
    ref_np = ref.detach().numpy().copy()
    assert out.shape == tuple(ref_np.shape), name
    g = rng.standard_normal(ref_np.shape).astype(np.float32)
    ref.backward(torch.tensor(g, dtype=ref.dtype))
    expected = [t.grad.numpy().copy() if t.grad is not None else np.zeros(t.shape, np.float32) for t in theirs]
    if convention is not None:
        ref_np, expected[0] = convention(arrays[0], ref_np, expected[0])
    _close(out.data, ref_np, fwd_rtol, atol, f"{name}: forward")
    out.backward(eo.tensor(g))
    for k, mine in enumerate(ours):
        got = mine.grad.data if mine.grad is not None else np.zeros(mine.shape, np.float32)
        _close(got, expected[k], grad_rtol, atol * 10, f"{name}: gradient of operand {k}")


def _close(got, expected, rtol, atol, what):
    got, expected = np.asarray(got, np.float64), np.asarray(expected, np.float64)
    assert got.shape == expected.shape, (what, got.shape, expected.shape)
    # NaN exactly where PyTorch has NaN: a NaN turned into a number (or the reverse) fails.
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected), err_msg=f"{what}: NaN positions")
    scale = np.where(np.isfinite(expected), np.abs(expected), 0).max(initial=0.0)
    np.testing.assert_allclose(got, expected, rtol=rtol, atol=atol + rtol * scale * 1e-2, err_msg=what)


UNARY_CASES = [(op, v) for op in UNARY for v in VARIANTS]


@pytest.mark.parametrize("op,variant", UNARY_CASES, ids=[f"{o}-{v}" for o, v in UNARY_CASES])
def test_elementwise(op, variant):
    ours, theirs = UNARY[op]
    _compare(f"{op}-{variant}", ours, theirs, [VARIANTS[variant]()], convention=CONVENTIONS.get((op, variant)))


def test_each_convention_is_a_real_difference():
    """A listed convention that PyTorch no longer differs on must be removed from the list."""
    for (op, variant), adjust in CONVENTIONS.items():
        ours, theirs = UNARY[op]
        x = VARIANTS[variant]()
        t = torch.tensor(x, requires_grad=True)
        ref = theirs(t)
        ref.backward(torch.ones_like(ref))
        fwd, grad = ref.detach().numpy().copy(), t.grad.numpy().copy()
        new_fwd, new_grad = adjust(x, fwd.copy(), grad.copy())
        same = np.array_equal(fwd, new_fwd, equal_nan=True) and np.array_equal(grad, new_grad, equal_nan=True)
        if (op, variant) in BY_CPU:
            at_inf = fwd[x == np.inf]
            assert at_inf.size and (np.isnan(at_inf) | (at_inf == np.inf)).all(), (op, variant, at_inf)
            continue
        assert not same, f"{op}-{variant}: PyTorch now agrees with EveryO; drop the convention"


BINARY = {
    "add": (eo.add, torch.add),
    "sub": (eo.sub, torch.sub),
    "mul": (eo.mul, torch.mul),
    "div": (eo.div, torch.div),
    "maximum": (eo.maximum, torch.maximum),
    "minimum": (eo.minimum, torch.minimum),
    "pow": (eo.pow, torch.pow),
}
BINARY_SHAPES = {
    "same": lambda: (VARIANTS["normal"](), VARIANTS["normal"]()),
    "broadcast-row": lambda: (VARIANTS["normal"](), rng.standard_normal(4).astype(np.float32)),
    "broadcast-col": lambda: (rng.standard_normal((3, 1)).astype(np.float32), VARIANTS["normal"]()),
    "0-d": lambda: (VARIANTS["0-d"](), VARIANTS["normal"]()),
    "empty": lambda: (VARIANTS["empty"](), rng.standard_normal(4).astype(np.float32)),
    "nan-inf": lambda: (_nan_inf((3, 4)), _nan_inf((3, 4))[::-1].copy()),
    "ties": lambda: (np.ones((2, 3), np.float32), np.ones((2, 3), np.float32)),
}
BINARY_CASES = [(op, v) for op in BINARY for v in BINARY_SHAPES]


@pytest.mark.parametrize("op,variant", BINARY_CASES, ids=[f"{o}-{v}" for o, v in BINARY_CASES])
def test_binary(op, variant):
    ours, theirs = BINARY[op]
    a, b = BINARY_SHAPES[variant]()
    if op == "pow":
        a = np.abs(a) + 0.5  # a real power of a negative base is NaN in both; its log-gradient differs in meaning
    _compare(f"{op}-{variant}", ours, theirs, [a, b])


MATMUL_SHAPES = {
    "2d": ((3, 4), (4, 2)),
    "1d-1d": ((4,), (4,)),
    "1d-2d": ((4,), (4, 3)),
    "2d-1d": ((3, 4), (4,)),
    "batched-broadcast": ((2, 3, 4), (4, 5)),
    "empty-inner": ((3, 0), (0, 2)),
    "empty-outer": ((0, 4), (4, 2)),
}


@pytest.mark.parametrize("shapes", list(MATMUL_SHAPES.values()), ids=list(MATMUL_SHAPES))
def test_matmul(shapes):
    arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    _compare("matmul", eo.matmul, torch.matmul, arrays)


def _torch_axis(kw):
    out = {}
    if "axis" in kw:
        out["dim"] = kw["axis"]
    if kw.get("keepdims"):
        out["keepdim"] = True
    return out


REDUCTIONS = {
    "sum": (eo.sum, lambda x, **k: torch.sum(x, **k) if k else torch.sum(x)),
    "mean": (eo.mean, lambda x, **k: torch.mean(x, **k) if k else torch.mean(x)),
    "max": (eo.max, lambda x, **k: torch.amax(x, **k)),
    "min": (eo.min, lambda x, **k: torch.amin(x, **k)),
    "prod": (eo.prod, lambda x, **k: torch.prod(x, **k) if k else torch.prod(x)),
    "logsumexp": (
        eo.logsumexp,
        lambda x, **k: torch.logsumexp(x, **k) if k else torch.logsumexp(x, dim=tuple(range(x.ndim))),
    ),
    "var": (eo.var, lambda x, **k: torch.var(x, correction=0, **k)),
    "var_ddof1": (lambda x, **k: eo.var(x, ddof=1, **k), lambda x, **k: torch.var(x, correction=1, **k)),
    "std": (eo.std, lambda x, **k: torch.std(x, correction=0, **k)),
    "std_ddof1": (lambda x, **k: eo.std(x, ddof=1, **k), lambda x, **k: torch.std(x, correction=1, **k)),
    "norm": (eo.norm, lambda x, **k: torch.linalg.vector_norm(x, **k)),
}
AXES = {"all": {}, "axis0": {"axis": 0}, "axis-1-keep": {"axis": -1, "keepdims": True}}
RED_VARIANTS = ["normal", "transposed", "large", "empty", "size-1", "1-D", "nan-inf"]
RED_CASES = [(op, v, ax) for op in REDUCTIONS for v in RED_VARIANTS for ax in AXES]


@pytest.mark.parametrize("op,variant,axes", RED_CASES, ids=[f"{o}-{v}-{a}" for o, v, a in RED_CASES])
def test_reduction(op, variant, axes):
    ours, theirs = REDUCTIONS[op]
    kw = AXES[axes]
    x = VARIANTS[variant]()
    if variant == "1-D" and "axis" in kw:
        kw = dict(kw, axis=0)
    if op == "prod" and variant == "large":
        x = x / 1e4  # a product of 12 values of 1e4 overflows float32 in both
    _compare(f"{op}-{variant}-{axes}", lambda a: ours(a, **kw), lambda a: theirs(a, **_torch_axis(kw)), [x])


SOFTMAX = {
    "softmax": (eo.softmax, lambda x, axis: torch.softmax(x, dim=axis)),
    "log_softmax": (eo.log_softmax, lambda x, axis: torch.log_softmax(x, dim=axis)),
    "cumsum": (eo.cumsum, lambda x, axis: torch.cumsum(x, dim=axis)),
}
SOFT_CASES = [(op, v) for op in SOFTMAX for v in ["normal", "transposed", "large", "empty", "size-1", "1-D", "nan-inf"]]


@pytest.mark.parametrize("op,variant", SOFT_CASES, ids=[f"{o}-{v}" for o, v in SOFT_CASES])
def test_along_an_axis(op, variant):
    ours, theirs = SOFTMAX[op]
    _compare(f"{op}-{variant}", lambda a: ours(a, axis=-1), lambda a: theirs(a, -1), [VARIANTS[variant]()])


CONV = [
    dict(stride=1, padding=0),
    dict(stride=2, padding=1),
    dict(stride=1, padding=2, dilation=2),
    dict(stride=1, padding=1, groups=2),
]


@pytest.mark.parametrize("kw", CONV, ids=lambda k: "-".join(f"{a}{b}" for a, b in k.items()))
def test_conv2d(kw):
    x = rng.standard_normal((2, 7, 6, 4)).astype(np.float32)
    groups = kw.get("groups", 1)
    w = rng.standard_normal((3, 3, 4 // groups, 6)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    _compare(
        "conv2d",
        lambda x, w, b: eo.conv2d(x, w, b, **kw),
        lambda x, w, b: F.conv2d(x.permute(0, 3, 1, 2), w.permute(3, 2, 0, 1), b, **kw).permute(0, 2, 3, 1),
        [x, w, b],
        grad_rtol=1e-4,
    )


CONV1D = [dict(stride=1, padding=0), dict(stride=2, padding=2, dilation=2), dict(stride=1, padding=1, groups=2)]


@pytest.mark.parametrize("kw", CONV1D, ids=lambda k: "-".join(f"{a}{b}" for a, b in k.items()))
def test_conv1d(kw):
    x = rng.standard_normal((2, 9, 4)).astype(np.float32)
    w = rng.standard_normal((3, 4 // kw.get("groups", 1), 6)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    _compare(
        "conv1d",
        lambda x, w, b: eo.conv1d(x, w, b, **kw),
        lambda x, w, b: F.conv1d(x.permute(0, 2, 1), w.permute(2, 1, 0), b, **kw).permute(0, 2, 1),
        [x, w, b],
    )


@pytest.mark.parametrize(
    "kw",
    [
        dict(stride=1, padding=0),
        dict(stride=2, padding=1),
        dict(stride=2, padding=1, output_padding=1),
        dict(stride=1, padding=2, dilation=2),
    ],
    ids=lambda k: "-".join(f"{a}{b}" for a, b in k.items()),
)
def test_conv_transpose2d(kw):
    x = rng.standard_normal((2, 5, 4, 3)).astype(np.float32)
    w = rng.standard_normal((3, 3, 3, 4)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    _compare(
        "conv_transpose2d",
        lambda x, w, b: eo.conv_transpose2d(x, w, b, **kw),
        # PyTorch's weight is (C_in, C_out, kh, kw)
        lambda x, w, b: F.conv_transpose2d(x.permute(0, 3, 1, 2), w.permute(2, 3, 0, 1), b, **kw).permute(0, 2, 3, 1),
        [x, w, b],
    )


@pytest.mark.parametrize("kind", ["max", "avg"])
def test_pooling_propagates_nan_and_inf(kind):
    x = rng.standard_normal((1, 6, 6, 2)).astype(np.float32)
    x[0, 0, 0, 0], x[0, 3, 4, 1], x[0, 5, 1, 0] = np.nan, np.inf, -np.inf
    ours = eo.max_pool2d if kind == "max" else eo.avg_pool2d
    theirs = F.max_pool2d if kind == "max" else F.avg_pool2d
    _compare(
        f"{kind}_pool2d",
        lambda a: ours(a, 3, 2, 1),
        lambda a: theirs(a.permute(0, 3, 1, 2), 3, 2, 1).permute(0, 2, 3, 1),
        [x],
    )


@pytest.mark.parametrize("kind", ["max", "avg", "avg_exclude_pad"])
@pytest.mark.parametrize("k,s,p", [(2, 2, 0), (3, 2, 1), (3, 1, 1)])
def test_pooling(kind, k, s, p):
    x = rng.standard_normal((2, 7, 6, 3)).astype(np.float32)
    if kind == "max":
        ours = lambda a: eo.max_pool2d(a, k, s, p)  # noqa: E731
        theirs = lambda a: F.max_pool2d(a.permute(0, 3, 1, 2), k, s, p).permute(0, 2, 3, 1)  # noqa: E731
    else:
        include = kind == "avg"
        ours = lambda a: eo.avg_pool2d(a, k, s, p, count_include_pad=None if include else False)  # noqa: E731
        theirs = lambda a: F.avg_pool2d(a.permute(0, 3, 1, 2), k, s, p, count_include_pad=include).permute(0, 2, 3, 1)  # noqa: E731
    _compare(f"{kind}_pool2d", ours, theirs, [x])


def _norm_pair(reference):
    ln = eo.LayerNorm(6)
    ln.weight.data[:] = np.linspace(0.5, 1.5, 6)
    ln.bias.data[:] = np.linspace(-0.2, 0.3, 6)
    tln = torch.nn.LayerNorm(6, dtype=reference)
    with torch.no_grad():
        tln.weight.copy_(torch.tensor(ln.weight.data))
        tln.bias.copy_(torch.tensor(ln.bias.data))
    tbn = torch.nn.BatchNorm1d(6, dtype=reference)
    pairs = {
        "layer_norm": (ln, tln),
        "batch_norm": (eo.BatchNorm1D(6), lambda t: tbn(t.permute(0, 2, 1)).permute(0, 2, 1)),
    }
    return pairs


@pytest.mark.parametrize("which", ["layer_norm", "batch_norm"])
def test_norms(which):
    x = rng.standard_normal((4, 5, 6)).astype(np.float32)
    ours, theirs = _norm_pair(torch.float32)[which]
    _compare(which, ours, theirs, [x], fwd_rtol=1e-4, grad_rtol=1e-3)


@pytest.mark.parametrize("which", ["layer_norm", "batch_norm"])
def test_norms_at_an_offset_of_1e4_are_as_accurate_as_torch(which):
    """On inputs offset by 1e4 float32 loses digits (the inputs' own spacing
    is 1e-3), so float32 results are compared by their error against PyTorch
    in float64 on the same float32 input: EveryO's must be of the same order
    as float32 PyTorch's. Measured over seeds 0-9 (2026-12-04): the ratio of
    the errors was 0.4-3.4 (not below 1 as issue 28's sweep reported for its
    input), hence the bound of 4x; the input's own seed keeps the case fixed."""
    x = (np.random.default_rng(7).standard_normal((4, 5, 6)) + 1e4).astype(np.float32)
    exact = _norm_pair(torch.float64)[which][1](torch.tensor(x, dtype=torch.float64)).detach().numpy()
    ours, theirs32 = _norm_pair(torch.float32)[which]
    ours_err = np.abs(ours(eo.tensor(x)).data - exact).max()
    torch_err = np.abs(theirs32(torch.tensor(x)).detach().numpy() - exact).max()
    assert ours_err <= 4 * torch_err, (which, ours_err, torch_err)


@pytest.mark.parametrize("op", ["softmax", "logsumexp"])
def test_an_all_minus_inf_slice_is_a_documented_convention(op):
    """PyTorch gives NaN (softmax forward, logsumexp gradient) for a slice of
    -inf only; EveryO gives 0, as masked attention needs (documented in the
    ops' docstrings and in "Coming from PyTorch"). Checked both ways, so a
    change on either side shows."""
    x = np.full((2, 3), -np.inf, np.float32)
    x[1] = [0.5, -1.0, 2.0]
    ours = eo.tensor(x, requires_grad=True)
    theirs = torch.tensor(x, requires_grad=True)
    if op == "softmax":
        out, ref = eo.softmax(ours, axis=-1), torch.softmax(theirs, -1)
    else:
        out, ref = eo.logsumexp(ours, axis=-1), torch.logsumexp(theirs, -1)
    out.sum().backward()
    ref.sum().backward()
    fwd, grad = ref.detach().numpy(), theirs.grad.numpy()
    np.testing.assert_allclose(out.data[1], fwd[1], rtol=1e-6)
    np.testing.assert_allclose(ours.grad[1], grad[1], rtol=1e-5, atol=1e-7)
    if op == "softmax":
        assert np.isnan(fwd[0]).all() and np.all(out.data[0] == 0)
    else:
        assert fwd[0] == -np.inf and out.data[0] == -np.inf
        assert np.isnan(grad[0]).all() and np.all(ours.grad[0] == 0)


def test_dropout_p1_and_eval():
    x = _nan_inf((3, 4))
    _compare("dropout", lambda a: eo.dropout(a, 1.0), lambda a: F.dropout(a, 1.0), [x])
    _compare("dropout", lambda a: eo.dropout(a, 1.0, training=False), lambda a: F.dropout(a, 1.0, training=False), [x])


# --- sequence ops at their smallest and empty sizes (issue 28) ----------------------------
RECURRENT_SHAPES = [(1, 3, 2), (2, 1, 2), (2, 3, 1), (1, 1, 1), (0, 3, 2), (2, 0, 2)]  # (batch, time, hidden)
RECURRENT_CASES = [(k, s, bi) for k in ("RNN", "LSTM", "GRU") for s in RECURRENT_SHAPES for bi in (False, True)]


@pytest.mark.parametrize("kind,shape,bi", RECURRENT_CASES, ids=[f"{k}-{s}-bi{b}" for k, s, b in RECURRENT_CASES])
def test_recurrent_edge_shapes(kind, shape, bi):
    batch, time, hidden = shape
    theirs = getattr(torch.nn, kind)(2, hidden, bidirectional=bi, batch_first=True, dtype=torch.float64)
    ours = getattr(eo.nn, kind)(2, hidden, bidirectional=bi, dtype="float64")
    for name, p in theirs.named_parameters():
        getattr(ours, name).data = p.detach().numpy().T.copy()  # EveryO stores (in, gates * hidden)
    x = rng.standard_normal((batch, time, 2))
    if x.size:
        x[0, -1, 0] = np.nan  # the last step of the first sequence: NaN from there on (both directions)
    _compare(f"{kind}-{shape}", lambda t: ours(t)[0], lambda t: theirs(t)[0], [x], fwd_rtol=1e-10, grad_rtol=1e-9)


def _sdpa_padded(nan_in):
    """q, k, v with the last two keys blocked for every query and NaN/inf there."""
    q, k, v = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 5, 4)), rng.standard_normal((2, 5, 4))
    attend = np.ones((3, 5), bool)
    attend[:, -2:] = False
    dirty = [a.copy() for a in (q, k, v)]
    for i in nan_in:
        dirty[i][:, -2:, 0], dirty[i][:, -1, 1] = np.nan, np.inf
    return (q, k, v), dirty, attend


@pytest.mark.parametrize("nan_in", [(1,), (2,), (1, 2)], ids=["key", "value", "both"])
def test_nan_in_a_blocked_key_does_not_leak(nan_in):
    # Convention: a key every query has blocked is hidden (0 * nan would be NaN);
    # PyTorch lets the NaN leak everywhere. EveryO on the dirty inputs equals
    # PyTorch on the clean ones, output and every gradient.
    clean, dirty, attend = _sdpa_padded(nan_in)
    ours = [eo.tensor(a, requires_grad=True) for a in dirty]
    out = eo.scaled_dot_product_attention(*ours, attn_mask=attend)
    ref = [torch.tensor(a, requires_grad=True) for a in clean]
    expected = F.scaled_dot_product_attention(*ref, attn_mask=torch.tensor(attend))
    g = rng.standard_normal(out.shape)
    out.backward(eo.tensor(g))
    expected.backward(torch.tensor(g))
    _close(out.data, expected.detach().numpy(), 1e-10, 1e-12, "sdpa forward")
    for mine, theirs in zip(ours, ref):
        _close(mine.grad.data, theirs.grad.numpy(), 1e-10, 1e-12, "sdpa gradient")
    leaked = F.scaled_dot_product_attention(*[torch.tensor(a) for a in dirty], attn_mask=torch.tensor(attend))
    assert torch.isnan(leaked).any()  # the convention is a real difference


def test_nan_in_a_padded_key_does_not_leak_through_multi_head_attention():
    clean, dirty, _ = _sdpa_padded((1, 2))
    padding = np.zeros((2, 5), bool)
    padding[:, -2:] = True  # True = blocked, as torch.nn.MultiheadAttention
    ours = eo.nn.MultiHeadAttention(4, 2, dtype="float64")
    theirs = torch.nn.MultiheadAttention(4, 2, batch_first=True, dtype=torch.float64)
    with torch.no_grad():
        theirs.in_proj_weight.copy_(torch.tensor(ours.in_proj_weight.data.T))
        theirs.in_proj_bias.copy_(torch.tensor(ours.in_proj_bias.data))
        theirs.out_proj.weight.copy_(torch.tensor(ours.out_proj.weight.data.T))
        theirs.out_proj.bias.copy_(torch.tensor(ours.out_proj.bias.data))
    q, k, v = (eo.tensor(a, requires_grad=True) for a in dirty)
    out = ours(q, k, v, key_padding_mask=padding)
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in clean)
    expected, _ = theirs(tq, tk, tv, key_padding_mask=torch.tensor(padding))
    out.sum().backward()
    expected.sum().backward()
    _close(out.data, expected.detach().numpy(), 1e-10, 1e-12, "MultiHeadAttention forward")
    for mine, ref in ((q, tq), (k, tk), (v, tv)):
        _close(mine.grad.data, ref.grad.numpy(), 1e-10, 1e-12, "MultiHeadAttention input gradient")


@pytest.mark.parametrize("shape", [(1, 1, 1), (2, 1, 3), (2, 3, 1), (0, 2, 2)])
@pytest.mark.parametrize("heads", [1, 4])
def test_attention_edge_shapes(shape, heads):
    batch, L, S = shape
    arrays = [
        rng.standard_normal((batch, L, 4)),
        rng.standard_normal((batch, S, 4)),
        rng.standard_normal((batch, S, 4)),
    ]
    _compare("scaled_dot_product_attention", eo.scaled_dot_product_attention, F.scaled_dot_product_attention, arrays)
    causal = (
        lambda *a: eo.scaled_dot_product_attention(*a, is_causal=True),
        lambda *a: F.scaled_dot_product_attention(*a, is_causal=True),
    )
    _compare("scaled_dot_product_attention", *causal, arrays)


@pytest.mark.parametrize("ids", [[3], [], [[1, 1, 1]], 2, [4, 0, 4, 4]], ids=str)
@pytest.mark.parametrize("padding_idx", [None, 4])
def test_embedding_edge_ids(ids, padding_idx):
    from everyo.sequence_ops import embedding

    ids = np.asarray(ids, dtype=np.int64)
    _compare(
        "embedding",
        lambda w: embedding(ids, w, padding_idx=padding_idx),
        lambda w: F.embedding(torch.tensor(ids), w, padding_idx=padding_idx),
        [rng.standard_normal((5, 3))],
    )


EINSUM_CASES = [
    ("ij,jk->ik", [(2, 1), (1, 3)]),
    ("ij,jk->ik", [(2, 0), (0, 3)]),
    ("i,i->", [(1,), (1,)]),
    ("i,i->", [(0,), (0,)]),
    ("ii->", [(1, 1)]),
    ("ii->i", [(0, 0)]),
    ("ij->", [(0, 3)]),
    ("->", [()]),
    (",->", [(), ()]),
    ("i,->i", [(3,), ()]),
    ("bij,bjk->bik", [(0, 2, 3), (0, 3, 2)]),
    ("i,j->ij", [(0,), (2,)]),
]


@pytest.mark.parametrize("sub,shapes", EINSUM_CASES, ids=[f"{s}-{x}" for s, x in EINSUM_CASES])
@pytest.mark.parametrize("variant", ["finite", "nan_inf"])
def test_einsum_edge_shapes(sub, shapes, variant):
    arrays = [_nan_inf(s) if variant == "nan_inf" and s else rng.standard_normal(s) for s in shapes]
    _compare("einsum", lambda *a: eo.einsum(sub, *a), lambda *a: torch.einsum(sub, *a), arrays)
