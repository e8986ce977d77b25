"""everyo-kernels' halves: the large passes in two halves on the pair.

Each split kernel in the table, forced to split (a small ``MIN_VALUES``, the pair
owning the second core), against the same kernel run whole (whose bits the other
kernel tests compare with core's NumPy path): bit-identical outputs, on odd sizes
where the halves are unequal, with special values; the halves really ran on the
pair; nothing is split where the pair does not own the second core or the pass is
small. Then whole training steps (a CNN, a causal transformer block) with the
splits against the same steps without them, bit for bit."""

import numpy as np
import pytest
from conftest import count_calls

import everyo as eo
from everyo import _blas, _passes, kernel_table
from everyo.kernels import halves, pair

SPECIALS = [0.0, -0.0, np.nan, np.inf, -np.inf, 1e-45, -3e38]


@pytest.fixture
def forced(monkeypatch):
    """Split everything of 16 values or more; count the pair's jobs."""
    monkeypatch.setattr(halves, "MIN_VALUES", 16)
    monkeypatch.setattr(pair, "owns_second_core", lambda: True)
    jobs = []
    run = pair.run

    def counted(mine, theirs):
        jobs.append(1)
        return run(mine, theirs)

    monkeypatch.setattr(pair, "run", counted)
    return jobs


def _same_bits(a, b):
    """Bit-identical, NaN positions included (a NaN's payload may differ: see test_dense_kernels)."""
    nan_a, nan_b = np.isnan(a), np.isnan(b)
    return np.array_equal(nan_a, nan_b) and np.array_equal(a[~nan_a].view(np.uint8), b[~nan_b].view(np.uint8))


def _values(rng, shape, dtype=np.float32, specials=True):
    x = rng.standard_normal(shape).astype(dtype)
    if specials:
        flat = x.reshape(-1)
        flat[rng.integers(0, flat.size, len(SPECIALS))] = np.array(SPECIALS, dtype)
    return x


def _cases(rng):
    """(table name, inputs, outputs as fresh arrays, extra arguments after them)."""
    rows, n = 37, 29  # odd: the halves differ by a row
    x = _values(rng, (rows, n))
    g = _values(rng, (rows, n))
    relu_out = np.maximum(_values(rng, rows * n), 0)
    soft = np.abs(_values(rng, (rows, n), specials=False))
    img = _values(rng, (5, 7, 6, 9))
    pooled = np.empty((5, 3, 3, 9), np.float32)
    kernel_table.get("max_pool_forward").whole(img, pooled, 2, 2, 2, 2)
    im2col_args = (3, 3, 1, 1, 1, 1, 1, 1, 7, 6)  # 3x3 'same'
    col2im_args = (3, 3, 1, 1, 1, 1, 1, 1, 7, 6, 1, 1)
    mask = np.tril(np.ones((4, n), bool))  # repeated over the rows: 36 rows = 9 repeats
    w, b = _values(rng, n, specials=False), _values(rng, n, specials=False)
    with np.errstate(all="ignore"):  # x holds inf and NaN: so do its statistics, as the kernels may meet
        rstd = 1 / (x.std(1) + 1)
    conv = _values(rng, rows * n)
    conv[-3:] = [1e5, -7e4, 3e-8]  # past float16's range (the largest in the second half), and a subnormal
    with np.errstate(over="ignore"):
        f16 = conv.astype(np.float16)
    return [
        ("add_bias", [x.copy(), b], [], []),
        ("outer_product", [x[:, 0].copy(), b], [(rows, n)], []),
        ("half_codes", [conv.view(np.uint32)], [(rows * n, np.uint16)], []),
        ("round_to_half", [conv.view(np.uint32)], [(rows * n, np.uint32)], []),
        ("half_to_float", [f16.view(np.uint16)], [(rows * n, np.uint32)], []),
        ("bfloat16_codes", [conv.view(np.uint32)], [(rows * n, np.uint16)], []),
        ("round_to_bfloat16", [conv.view(np.uint32)], [(rows * n, np.uint32)], []),
        (
            "bfloat16_to_float",
            [f16.view(np.uint16)],
            [(rows * n, np.uint32)],
            [],
        ),  # in place: the first input is the output
        ("relu_forward", [x.reshape(-1)], [(rows * n,)], []),
        ("relu_backward", [g.reshape(-1), relu_out], [(rows * n,)], []),
        ("im2col", [img], [(5 * 7 * 6, 81)], list(im2col_args)),
        ("col2im", [_values(rng, (5 * 7 * 6, 81))], [(5, 7, 6, 9)], list(col2im_args)),
        ("max_pool_forward", [img], [(5, 3, 3, 9)], [2, 2, 2, 2]),
        ("max_pool_backward", [img, pooled, _values(rng, (5, 3, 3, 9))], [(5, 7, 6, 9)], [2, 2, 2, 2]),
        ("softmax_shift", [x[:36], None], [(36, n)], []),
        ("softmax_shift", [x[:36], mask], [(36, n)], []),
        ("softmax_shift", [x[:6], mask], [(6, n)], []),  # fewer rows than two mask periods: whole
        ("softmax_scale", [soft.copy()], [], []),
        ("softmax_backward", [g, soft], [(rows, n)], []),
        ("layer_norm_forward", [x, w, b, True, np.float32(1e-5)], [(rows, n), (rows,), (rows,)], []),
        # (x, g, mean, rstd, w, gx, gw, gb): gw and gb accumulate into zeros
        ("layer_norm_backward", [x, g, x.mean(1), rstd, w], [(rows, n)], []),
        ("gelu_forward", [x.reshape(-1)], [(rows * n,), (rows * n,)], []),
        ("gelu_backward", [g.reshape(-1), x.reshape(-1), soft.reshape(-1)], [(rows * n,)], []),
    ]


def _call(fn, inputs, out_shapes, extra, fill):
    """The inputs after the call (copies), the outputs, and what the kernel returned."""
    ins = [a.copy() if isinstance(a, np.ndarray) else a for a in inputs]
    outs = []
    for s in out_shapes:  # (shape..., dtype) for an integer output (the 16-bit conversions' codes and bits)
        shape, dtype = (s[:-1], s[-1]) if isinstance(s[-1], type) else (s, np.float32)
        out = np.empty(shape, dtype)
        out.view(np.uint8)[...] = np.full(shape, fill, np.float32).view(np.uint8)[: out.nbytes]
        outs.append(out)
    if fn.__name__ == "col2im":  # (gcols, gx, ...): the output comes second
        fn(ins[0], outs[0], *extra)
    elif fn.__name__ == "max_pool_backward":  # (x, out, g, gx, ...)
        fn(*ins, *outs, *extra)
    elif fn.__name__ == "softmax_shift":  # (x, blocked, out)
        fn(*ins, *outs)
    elif fn.__name__ == "layer_norm_forward":  # (x, w, b, affine, eps, y, mean, rstd)
        fn(*ins, *outs)
    elif fn.__name__ == "layer_norm_backward":  # (x, g, mean, rstd, w, gx, gw, gb)
        sums = [np.zeros(ins[0].shape[1], np.float32) for _ in range(2)]
        fn(*ins, *outs, *sums)
        outs += sums
    else:
        returned = fn(*ins, *outs, *extra)
        return [a for a in ins if isinstance(a, np.ndarray)] + outs + [np.asarray(returned if returned else 0)]
    return [a for a in ins if isinstance(a, np.ndarray)] + outs


def test_every_split_kernel_has_the_bits_of_the_whole_kernel(forced):
    rng = np.random.default_rng(0)
    seen = set()
    for name, inputs, out_shapes, extra in _cases(rng):
        split = kernel_table.get(name)
        assert split is not None and hasattr(split, "whole"), name
        for fill in (np.nan, 7.0):  # every value written: whatever was there before is gone
            before = len(forced)
            got = _call(split, inputs, out_shapes, extra, fill)
            want = _call(split.whole, inputs, out_shapes, extra, fill)
            for a, b in zip(got, want, strict=True):
                assert a.shape == b.shape and _same_bits(a, b), (name, fill)
            if name != "softmax_shift" or inputs[0].shape[0] == 36:
                assert len(forced) == before + 1, name  # it really ran as two halves
            else:
                assert len(forced) == before, name
        seen.add(name)
    assert seen == {n for n, fn in kernel_table._table.items() if hasattr(fn, "whole")}  # none left untested


def test_nothing_is_split_where_the_pair_does_not_own_the_second_core(forced, monkeypatch):
    x = np.random.default_rng(1).standard_normal(4096).astype(np.float32)
    relu = kernel_table.get("relu_forward")
    monkeypatch.setattr(pair, "owns_second_core", lambda: False)
    relu(x, np.empty_like(x))
    assert forced == []
    monkeypatch.setattr(pair, "owns_second_core", lambda: True)
    monkeypatch.setattr(halves, "MIN_VALUES", 4097)  # smaller than that: whole
    relu(x, np.empty_like(x))
    assert forced == []
    monkeypatch.setattr(halves, "MIN_VALUES", 4096)
    relu(x, np.empty_like(x))
    assert forced == [1]


@pytest.mark.parametrize(
    ("threads", "busy", "owns"), [(2, False, True), (1, False, False), (4, False, False), (2, True, False)]
)
def test_the_pair_owns_the_second_core_only_on_two_blas_threads_when_not_busy(monkeypatch, threads, busy, owns):
    monkeypatch.setattr(pair, "blas_threads", lambda: threads)
    monkeypatch.setattr(_blas, "machine_busy", lambda: busy)
    monkeypatch.setattr(_blas, "openblas_spinning", lambda: False)
    assert pair.owns_second_core() is owns
    monkeypatch.setattr(_blas, "openblas_spinning", lambda: True)  # an einsum just woke OpenBLAS's worker
    assert not pair.owns_second_core()


def _cnn_step(seed):
    rng = np.random.default_rng(seed)
    eo.manual_seed(seed)
    model = eo.Sequential(
        eo.Conv2D(1, 8, 3, padding="same"),
        eo.ReLU(),
        eo.MaxPool2D(2),
        eo.Conv2D(8, 16, 3, padding="same"),
        eo.ReLU(),
        eo.Flatten(),
        eo.Linear(7 * 7 * 16, 10),
    )
    x = eo.tensor(rng.standard_normal((6, 14, 14, 1)).astype(np.float32))
    loss = eo.cross_entropy(model(x), rng.integers(0, 10, 6))
    loss.backward()
    return [loss.data] + [p.grad for p in model.parameters()]


def _block_step(seed):
    rng = np.random.default_rng(seed)
    eo.manual_seed(seed)
    block = eo.TransformerEncoderLayer(32, 4, dim_feedforward=64, dropout=0.0, activation="gelu", norm_first=True)
    x = eo.tensor(rng.standard_normal((3, 10, 32)).astype(np.float32))
    loss = eo.sum(block(x, is_causal=True) ** 2)
    loss.backward()
    return [loss.data] + [p.grad for p in block.parameters()]


def _autocast_step(dtype):
    def step(seed):
        rng = np.random.default_rng(seed)
        eo.manual_seed(seed)
        model = eo.Sequential(eo.Linear(16, 64), eo.ReLU(), eo.Linear(64, 64), eo.ReLU(), eo.Linear(64, 1))
        x = eo.tensor(rng.standard_normal((300, 16)).astype(np.float32))
        with eo.autocast(dtype=dtype):
            out = model(x)
        loss = eo.mse_loss(out.astype("float32"), eo.tensor(rng.standard_normal((300, 1)).astype(np.float32)))
        loss.backward()
        return [loss.data] + [p.grad for p in model.parameters()]

    step.__name__ = f"autocast_{dtype}_step"
    return step


@pytest.mark.parametrize("step", [_cnn_step, _block_step, _autocast_step("float16"), _autocast_step("bfloat16")])
def test_training_steps_with_the_halves_match_the_steps_without(forced, monkeypatch, step):
    for module in ("functional", "conv", "activations", "normalization_ops"):  # core hands small arrays to the kernels
        monkeypatch.setattr(f"everyo.{module}._KERNEL_MIN_SIZE", 16)
    monkeypatch.setattr(_passes, "MIN_SIZE", 16)  # and its own NumPy passes
    names = ["im2col", "col2im", "max_pool_forward", "relu_forward", "softmax_shift", "layer_norm_forward"]
    conversions = ["half_codes", "round_to_half", "half_to_float", "bfloat16_codes", "bfloat16_to_float"]
    counted = names + ["numpy_halves"] + conversions
    calls = count_calls(monkeypatch, [n for n in counted if kernel_table.get(n) is not None])
    split = step(3)
    if step is _block_step:  # residual adds, gradient sums, exp, the heads' copies and concatenation
        assert calls["numpy_halves"] >= 10
    if step.__name__.startswith("autocast"):  # the conversions ran as halves
        assert sum(calls[n] for n in conversions) >= 6
    assert forced, "nothing ran as two halves"
    monkeypatch.setattr(pair, "owns_second_core", lambda: False)
    jobs = len(forced)
    whole = step(3)
    assert len(forced) == jobs
    for a, b in zip(split, whole, strict=True):
        assert _same_bits(np.asarray(a), np.asarray(b))
    assert any(calls.values())


def _concatenate(*pieces, axis, out):
    np.concatenate(pieces, axis=axis, out=out)


def _numpy_cases(rng):
    """(NumPy pass in fn(*args, out=) form, its arguments, the output's shape and dtype)."""
    x, y = _values(rng, (37, 29)), _values(rng, (37, 29))
    heads = _values(rng, (5, 3, 11, 4)).transpose(0, 2, 1, 3)  # strided, as attention's heads are
    return [
        (np.add, (x, y), (37, 29), np.float32),
        (np.add, (x, y[0]), (37, 29), np.float32),  # a row broadcast along the cut axis
        (np.multiply, (y[:1], x), (37, 29), np.float32),  # a first axis of 1 broadcasts too
        (np.subtract, (x, np.float32(0.5)), (37, 29), np.float32),
        (np.multiply, (heads, np.float32(0.125)), (5, 11, 3, 4), np.float32),
        (np.exp, (x,), (37, 29), np.float32),
        (_passes.copy, (heads,), (5, 11, 3, 4), np.float32),
        (_passes.copy, (np.clip(x, -6e4, 6e4).astype(np.float16),), (37, 29), np.float32),  # a cast
        (_passes.copy, (x,), (37, 29), np.float64),
        (lambda *p, out: _concatenate(*p, axis=2, out=out), (heads, heads[:, :, :2]), (5, 11, 5, 4), np.float32),
    ]


def test_core_numpy_passes_in_halves_have_the_bits_of_the_whole_pass(forced):
    halves_pass = kernel_table.get("numpy_halves")
    for i, (fn, args, shape, dtype) in enumerate(_numpy_cases(np.random.default_rng(2))):
        for fill in (np.nan, 7.0):  # every value written
            got, want = np.full(shape, fill, dtype), np.full(shape, fill, dtype)
            before = len(forced)
            with np.errstate(all="ignore"):
                assert halves_pass(fn, args, got) is True, i
                fn(*args, out=want)
            assert len(forced) == before + 1, i  # it really ran as two halves
            assert _same_bits(got, want), i


def test_core_numpy_pass_in_place_and_through_core(forced, monkeypatch):
    monkeypatch.setattr(_passes, "MIN_SIZE", 16)
    x = _values(np.random.default_rng(3), (9, 40), specials=False)
    want = np.exp(x)
    assert _passes.run(np.exp, (x,), x) is x and np.array_equal(x, want)  # softmax's exp(out, out=out)
    assert forced == [1]
    with kernel_table.disabled():  # without the kernels: whole, here
        y = _values(np.random.default_rng(3), (9, 40), specials=False)
        assert np.array_equal(_passes.run(np.exp, (y,), y), want)
    assert forced == [1]


def test_core_numpy_passes_that_cannot_be_cut_run_whole(forced):
    halves_pass = kernel_table.get("numpy_halves")
    x = np.ones((6, 5), np.float32)
    out = np.zeros((6, 5), np.float32)
    assert halves_pass(np.add, (x, [1.0] * 5), out) is False  # a list: not cut here
    assert halves_pass(np.add, (x[:4], x), out) is False  # a first axis that is not out's: NumPy's error, whole
    assert halves_pass(np.add, (x[0], x[0]), out[0]) is False  # one row in the cut axis: nothing to cut
    assert forced == [] and not out.any()


def test_the_workers_half_keeps_the_callers_errstate(forced):
    halves_pass = kernel_table.get("numpy_halves")
    big = np.ones((8, 4), np.float32)
    big[6:] = 3e38  # an overflow in the worker's half only
    with np.errstate(over="raise"), pytest.raises(FloatingPointError):
        halves_pass(np.multiply, (big, big), np.empty_like(big))
    with np.errstate(over="ignore"):
        out = np.empty_like(big)
        assert halves_pass(np.multiply, (big, big), out)
    assert np.isinf(out[6:]).all() and (out[:6] == 1).all()
