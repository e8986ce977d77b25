"""Shared helpers for the ONNX tests: every agreement check runs the exported
file in ONNX Runtime (through the public eo.run_onnx) and compares it with
EveryO's own eval-mode forward pass on the same random batch.

Uniquely named (not conftest.py) so that running several test folders in one
pytest call cannot import another folder's helpers."""

import numpy as np
import onnx

import everyo as eo

BATCHES = (1, 7)
ATOL = 1e-5


def random_batch(input_shape, batch, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((batch,) + tuple(input_shape[1:])).astype(np.float32)


def randomize_norms(model, input_shape, seed=0, steps=3):
    """Give normalisation layers random affine parameters and trained running
    statistics, so the export is checked on something other than the identity.

    Batch norm statistics come from a few train-mode passes over shifted,
    scaled data (mean ~1.5, std ~2): running_mean and running_var then differ
    clearly from their initial 0 and 1.
    """
    rng = np.random.default_rng(seed)
    for m in model.modules():
        if isinstance(m, (eo.BatchNorm1D, eo.BatchNorm2D, eo.LayerNorm)) and m.weight is not None:
            m.weight.data = (1 + 0.5 * rng.standard_normal(m.weight.shape)).astype(np.float32)
            m.bias.data = (0.5 * rng.standard_normal(m.bias.shape)).astype(np.float32)
    if any(isinstance(m, (eo.BatchNorm1D, eo.BatchNorm2D)) for m in model.modules()):
        model.train()
        with eo.no_grad():
            for i in range(steps):
                model(eo.tensor(1.5 + 2 * random_batch(input_shape, 16, seed=100 + i)))
    model.eval()
    return model


def assert_agrees(model, input_shape, path, *, opset=None, batches=BATCHES, seed=0):
    """Export ``model`` and check ONNX Runtime against EveryO at each batch size."""
    model.eval()
    eo.export_onnx(model, path, input_shape=input_shape, opset=opset)
    for batch in batches:
        x = random_batch(input_shape, batch, seed=seed + batch)
        with eo.no_grad():
            expected = np.asarray(model(eo.tensor(x)).data)
        actual = eo.run_onnx(path, x)
        assert actual.shape == expected.shape, (batch, actual.shape, expected.shape)
        np.testing.assert_allclose(actual, expected, rtol=0, atol=ATOL, err_msg=f"batch {batch}")
    return onnx.load(str(path))


def digit_cnn():
    """A digit-sized CNN that uses every layer kind the exporter supports in a CNN."""
    return eo.Sequential(
        eo.Conv2D(1, 8, 3, padding="same", seed=0),
        eo.BatchNorm2D(8),
        eo.ReLU(),
        eo.MaxPool2D(2),
        eo.Conv2D(8, 16, 3, padding="same", seed=1),
        eo.ReLU(),
        eo.AvgPool2D(2),
        eo.Flatten(),
        eo.Dropout(0.25, seed=0),
        eo.Linear(64, 32, seed=2),
        eo.LayerNorm(32),
        eo.Tanh(),
        eo.Linear(32, 10, seed=3),
        eo.LogSoftmax(),
    )


def _tuple(x):
    return x if isinstance(x, (tuple, list)) else (x,)


def assert_traced_agrees(model, make_inputs, path, *, sizes, dynamic_axes=None, opset=None, verify=True, atol=ATOL):
    """Export ``model`` traced on ``make_inputs(*sizes[0])`` and check ONNX
    Runtime against EveryO's eval-mode output at every size in ``sizes``
    (the first is the traced one; the others test the dynamic axes).

    ``make_inputs(*size)`` returns the model's inputs (a tuple for several)."""
    model.eval()
    eo.export_onnx(
        model,
        path,
        example_input=tuple(_tuple(make_inputs(*sizes[0]))),
        dynamic_axes=dynamic_axes,
        opset=opset,
        verify=verify,
    )
    for size in sizes:
        inputs = _tuple(make_inputs(*size))
        with eo.no_grad():
            result = model(*[eo.tensor(a) for a in inputs])
        expected = [np.asarray(t.data) for t in _flat(result)]
        returned = eo.run_onnx(path, *inputs)
        assert _skeleton(returned) == _skeleton(result)  # run_onnx returns forward()'s nesting
        actual = _flat(returned)
        assert len(actual) == len(expected)
        for k, (a, e) in enumerate(zip(actual, expected)):
            assert a.shape == e.shape, (size, k, a.shape, e.shape)
            np.testing.assert_allclose(a, e, rtol=0, atol=atol, err_msg=f"sizes {size}, output {k}")
    return onnx.load(str(path))


def _flat(result):
    """The Tensors or arrays of a (nested) result, in order: dicts by sorted key, None left out."""
    if isinstance(result, (eo.Tensor, np.ndarray)):
        return [result]
    if result is None:
        return []
    if isinstance(result, dict):
        return [t for k in sorted(result) for t in _flat(result[k])]
    return [t for item in result for t in _flat(item)]


def _skeleton(result):
    """The nesting of a result with its leaves (Tensors or arrays) as 'T'."""
    if isinstance(result, (eo.Tensor, np.ndarray)):
        return "T"
    if isinstance(result, dict):
        return {k: _skeleton(v) for k, v in result.items()}
    if isinstance(result, (tuple, list)):
        return type(result)(_skeleton(v) for v in result)
    return result
