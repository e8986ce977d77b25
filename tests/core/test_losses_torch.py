"""Every loss function and option against PyTorch (forward and gradients) and
against central finite differences (issues 25 and 28).

Cases are generated: loss x options x reduction. The FD checks run
everywhere; the torch comparisons run where torch is installed (the Python
3.11 core cell installs it and fails if it cannot import it).
"""

import itertools
import warnings

import numpy as np
import pytest

import everyo as eo
from everyo.testing import check_gradients

N, C = 6, 4
rng = np.random.default_rng(25)
LOGITS = rng.standard_normal((N, C)) * 2
LOGITS3 = rng.standard_normal((2, 3, C))  # (N, T, C): classes last
TARGETS = np.array([0, 3, 1, 1, 2, 0])
TARGETS_IGNORED = np.array([0, -100, 1, 3, -100, 2])
TARGETS3 = np.array([[0, 1, 3], [2, -100, 1]])
PROBS = np.exp(rng.standard_normal((N, C)))
PROBS /= PROBS.sum(axis=1, keepdims=True)
CLASS_WEIGHT = np.array([0.5, 2.0, 1.0, 3.0])
PRED, TARGET = rng.standard_normal((N, C)), rng.standard_normal((N, C))
TARGET[0, :2] = PRED[0, :2] + [0.3, -0.2]  # some differences inside the smooth zone
BITS = (rng.random((N, C)) < 0.4).astype(float)
SOFT_BITS = rng.random((N, C))
P_IN = 1 / (1 + np.exp(-rng.standard_normal((N, C))))
POS_WEIGHT = np.array([1.0, 3.0, 0.5, 2.0])
ELEM_WEIGHT = rng.random((N, C)) + 0.5
REDUCTIONS = ["mean", "sum", "none"]


def _ce_cases():
    for reduction, weight, smoothing in itertools.product(REDUCTIONS, [None, CLASS_WEIGHT], [0.0, 0.2]):
        for label, targets in [("idx", TARGETS), ("ignored", TARGETS_IGNORED)]:
            kw = dict(reduction=reduction, label_smoothing=smoothing)
            yield (
                f"ce-{label}-{reduction}-w{weight is not None}-ls{smoothing}",
                "cross_entropy",
                [LOGITS, targets],
                weight,
                kw,
            )
        yield (
            f"ce-probs-{reduction}-w{weight is not None}-ls{smoothing}",
            "cross_entropy",
            [LOGITS, PROBS],
            weight,
            dict(reduction=reduction, label_smoothing=smoothing),
        )
        yield (
            f"ce-nd-{reduction}-w{weight is not None}-ls{smoothing}",
            "cross_entropy",
            [LOGITS3, TARGETS3],
            weight,
            dict(reduction=reduction, label_smoothing=smoothing),
        )
    for reduction, weight in itertools.product(REDUCTIONS, [None, CLASS_WEIGHT]):
        logp = LOGITS - np.log(np.exp(LOGITS).sum(axis=1, keepdims=True))
        yield (
            f"nll-{reduction}-w{weight is not None}",
            "nll_loss",
            [logp, TARGETS_IGNORED],
            weight,
            dict(reduction=reduction),
        )
    yield ("ce-ignore-index-7", "cross_entropy", [LOGITS, np.array([7, 0, 7, 1, 2, 3])], None, dict(ignore_index=7))
    yield ("ce-all-ignored-mean-is-nan", "cross_entropy", [LOGITS[:2], np.array([-100, -100])], None, {})


def _pointwise_cases():
    for reduction in REDUCTIONS:
        yield (f"mse-{reduction}", "mse_loss", [PRED, TARGET], None, dict(reduction=reduction))
        yield (f"l1-{reduction}", "l1_loss", [PRED, TARGET], None, dict(reduction=reduction))
        for beta in (1.0, 0.5):
            yield (
                f"smooth_l1-{reduction}-b{beta}",
                "smooth_l1_loss",
                [PRED, TARGET],
                None,
                dict(reduction=reduction, beta=beta),
            )
        yield (f"huber-{reduction}-d1.5", "huber_loss", [PRED, TARGET], None, dict(reduction=reduction, delta=1.5))
        for weight, pos in itertools.product([None, ELEM_WEIGHT, CLASS_WEIGHT], [None, POS_WEIGHT]):
            yield (
                f"bcel-{reduction}-w{None if weight is None else weight.shape}-pw{pos is not None}",
                "binary_cross_entropy_with_logits",
                [LOGITS, SOFT_BITS],
                weight,
                dict(reduction=reduction, pos_weight=pos),
            )
        for weight in (None, ELEM_WEIGHT):
            yield (
                f"bce-{reduction}-w{weight is not None}",
                "binary_cross_entropy",
                [P_IN, BITS],
                weight,
                dict(reduction=reduction),
            )
    logq = np.log(PROBS[::-1].copy())
    for reduction in REDUCTIONS + ["batchmean"]:
        yield (f"kl-{reduction}", "kl_div", [logq, PROBS], None, dict(reduction=reduction))
        yield (
            f"kl-{reduction}-logt",
            "kl_div",
            [logq, np.log(PROBS)],
            None,
            dict(reduction=reduction, log_target=True),
        )
    zero_target = PROBS.copy()
    zero_target[0, 1] = 0.0
    yield ("kl-zero-target", "kl_div", [logq, zero_target], None, dict(reduction="sum"))


CASES = list(_ce_cases()) + list(_pointwise_cases())
_WEIGHTED = {"cross_entropy", "nll_loss", "binary_cross_entropy", "binary_cross_entropy_with_logits"}


def _call_eo(fn_name, inputs, weight, kw):
    fn = getattr(eo, fn_name)
    kw = dict(kw)
    if fn_name in _WEIGHTED and weight is not None:
        kw["weight"] = weight
    return fn(*inputs, **kw)


# A NaN loss has no finite differences; test_matches_torch checks its value.
FD_CASES = [c for c in CASES if "nan" not in c[0]]


@pytest.mark.parametrize("case", FD_CASES, ids=[c[0] for c in FD_CASES])
def test_gradients_by_finite_differences(case):
    _, fn_name, inputs, weight, kw = case
    inputs = [np.asarray(a) for a in inputs]
    if case[0] == "kl-zero-target":
        # t * log(t) has no two-sided derivative at t = 0: only log_probs is checked here.
        target = eo.tensor(inputs[1])
        check_gradients(lambda x: _call_eo(fn_name, [x, target], weight, kw), inputs[:1], name=case[0], atol=1e-5)
        return
    check_gradients(lambda *t: _call_eo(fn_name, t, weight, kw), inputs, name=case[0], atol=1e-5)


def _to_torch(torch, fn_name, arrays, weight, kw):
    kw = dict(kw)
    ts = []
    for a in arrays:
        if a.dtype.kind == "f":
            ts.append(torch.tensor(a, dtype=torch.float64, requires_grad=True))
        else:
            ts.append(torch.tensor(a, dtype=torch.int64))
    args = list(ts)
    if fn_name in ("cross_entropy", "nll_loss") and arrays[0].ndim > 2:  # torch: classes on axis 1
        args[0] = args[0].movedim(-1, 1)
        if arrays[1].dtype.kind == "f":
            args[1] = args[1].movedim(-1, 1)
    if weight is not None:
        kw["weight"] = torch.tensor(weight)
    if kw.get("pos_weight") is not None:
        kw["pos_weight"] = torch.tensor(kw["pos_weight"])
    fn = getattr(torch.nn.functional, fn_name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # kl_div's reduction="mean" advice
        out = fn(*args, **kw)
    return ts, out


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_matches_torch(case):
    torch = pytest.importorskip("torch")
    _, fn_name, inputs, weight, kw = case
    arrays = [np.asarray(a) for a in inputs]
    ours = [eo.tensor(a, requires_grad=a.dtype.kind == "f") if a.dtype.kind == "f" else eo.tensor(a) for a in arrays]
    out = _call_eo(fn_name, ours, weight, kw)
    theirs, ref = _to_torch(torch, fn_name, arrays, weight, kw)
    ref_np = ref.detach().numpy()
    np.testing.assert_allclose(out.data, ref_np, rtol=1e-10, atol=1e-12, equal_nan=True, err_msg=case[0])
    if np.isnan(ref_np).any():
        return
    g = rng.standard_normal(ref_np.shape)
    out.backward(eo.tensor(g))
    ref.backward(torch.tensor(g))
    for mine, t in zip(ours, theirs):
        if t.requires_grad:
            # (t is the class-last tensor given before any movedim, so its gradient is class-last too)
            np.testing.assert_allclose(
                mine.grad.data, t.grad.numpy(), rtol=1e-9, atol=1e-12, equal_nan=True, err_msg=case[0]
            )


@pytest.mark.parametrize(
    "call,error,match",
    [
        (
            lambda: eo.cross_entropy(LOGITS, np.array([0, 4, 1, 1, 2, 0])),
            ValueError,
            r"cross_entropy: targets must be in \[0, 4\)",
        ),
        (
            lambda: eo.cross_entropy(LOGITS, TARGETS, reduction="avg"),
            ValueError,
            r"reduction must be one of 'none', 'mean', 'sum'",
        ),
        (
            lambda: eo.cross_entropy(LOGITS, TARGETS, np.ones(3)),
            eo.EveryOShapeError,
            r"cross_entropy: weight has shape \(3,\)",
        ),
        (
            lambda: eo.cross_entropy(LOGITS, TARGETS, label_smoothing=1.5),
            ValueError,
            r"label_smoothing must be in \[0, 1\]",
        ),
        (lambda: eo.cross_entropy(LOGITS, PROBS, ignore_index=1), ValueError, r"ignore_index is not supported"),
        (lambda: eo.nll_loss(LOGITS, TARGETS.astype(float)[:3]), TypeError, r"nll_loss: targets must be integer"),
        (lambda: eo.binary_cross_entropy(PRED, BITS), ValueError, r"probabilities must be in \[0, 1\]"),
        (
            lambda: eo.binary_cross_entropy_with_logits(LOGITS, BITS, pos_weight=np.ones(3)),
            eo.EveryOShapeError,
            r"pos_weight has shape",
        ),
        (lambda: eo.kl_div(LOGITS, PROBS, reduction="batch"), ValueError, r"'batchmean'"),
        (lambda: eo.huber_loss(PRED, TARGET, delta=0), ValueError, r"huber_loss: delta must be a positive number"),
    ],
)
def test_bad_arguments_are_refused_clearly(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_modules_pass_their_options_and_keep_weights_as_buffers():
    loss = eo.CrossEntropyLoss(weight=CLASS_WEIGHT, ignore_index=-100, label_smoothing=0.1, reduction="sum")
    expected = eo.cross_entropy(LOGITS, TARGETS_IGNORED, CLASS_WEIGHT, reduction="sum", label_smoothing=0.1)
    np.testing.assert_array_equal(loss(eo.tensor(LOGITS), TARGETS_IGNORED).data, expected.data)
    assert sorted(loss.state_dict()) == ["weight"]
    logp = eo.log_softmax(eo.tensor(LOGITS))
    np.testing.assert_allclose(
        eo.NLLLoss(weight=CLASS_WEIGHT)(logp, TARGETS).data, eo.CrossEntropyLoss(CLASS_WEIGHT)(LOGITS, TARGETS).data
    )
    bce = eo.BCEWithLogitsLoss(pos_weight=POS_WEIGHT, reduction="none")
    np.testing.assert_array_equal(
        bce(eo.tensor(LOGITS), BITS).data,
        eo.binary_cross_entropy_with_logits(LOGITS, BITS, reduction="none", pos_weight=POS_WEIGHT).data,
    )
    assert sorted(bce.state_dict()) == ["pos_weight"]
    for cls, kw in [
        (eo.L1Loss, {}),
        (eo.SmoothL1Loss, {"beta": 0.5}),
        (eo.HuberLoss, {"delta": 2.0}),
        (eo.MSELoss, {}),
    ]:
        fn = {
            eo.L1Loss: eo.l1_loss,
            eo.SmoothL1Loss: eo.smooth_l1_loss,
            eo.HuberLoss: eo.huber_loss,
            eo.MSELoss: eo.mse_loss,
        }[cls]
        np.testing.assert_array_equal(
            cls(reduction="none", **kw)(PRED, TARGET).data, fn(PRED, TARGET, "none", *kw.values()).data
        )
    np.testing.assert_array_equal(
        eo.BCELoss(ELEM_WEIGHT)(P_IN, BITS).data, eo.binary_cross_entropy(P_IN, BITS, ELEM_WEIGHT).data
    )
    np.testing.assert_array_equal(
        eo.KLDivLoss("batchmean")(np.log(PROBS), PROBS[::-1]).data,
        eo.kl_div(np.log(PROBS), PROBS[::-1], "batchmean").data,
    )
    with pytest.raises(ValueError, match="KLDivLoss: reduction must be one of"):
        eo.KLDivLoss("avg")


def test_everyo_02_positional_reduction_still_works():
    np.testing.assert_array_equal(
        eo.cross_entropy(LOGITS, TARGETS, "sum").data, eo.cross_entropy(LOGITS, TARGETS, reduction="sum").data
    )
    assert eo.CrossEntropyLoss("sum").reduction == "sum"
    assert eo.BCEWithLogitsLoss("sum").reduction == "sum"


def test_label_smoothing_and_weights_by_hand():
    """The documented formula, written out in NumPy for one weighted, smoothed, ignored case."""
    eps, w = 0.2, CLASS_WEIGHT
    z, t = LOGITS, TARGETS_IGNORED
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    keep = t != -100
    tk = t[keep]
    nll = -(w[tk] * logp[keep, tk])
    soft = -(logp[keep] * w).sum(axis=1)
    expected = ((1 - eps) * nll + eps / C * soft).sum() / w[tk].sum()
    got = eo.cross_entropy(z, t, w, label_smoothing=eps).item()
    np.testing.assert_allclose(got, expected, rtol=1e-12)
