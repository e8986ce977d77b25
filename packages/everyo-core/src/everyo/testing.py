"""The one gradient checker (Chainer's idea: many ops, one harness).

Every op and layer test calls :func:`check_gradients` (or
:func:`check_module_gradients`): it compares autograd's gradients with
central finite differences computed in float64. The output is contracted
with a fixed random weight, so every element of the Jacobian contributes.
"""

import numpy as np

from everyo.autograd import no_grad
from everyo.tensor import Tensor


def _contract(out, weight):
    return float(np.sum(out.data.astype(np.float64) * weight))


def check_gradients(fn, inputs, params=(), *, eps=1e-6, atol=1e-6, rtol=1e-5, seed=0, name=None):
    """Assert that autograd's gradients of ``fn`` match central differences.

    Args:
        fn: maps the input Tensors to one output Tensor (or a tuple; all are checked).
        inputs: arrays; floating ones become float64 Tensors with requires_grad,
            others (e.g. integer indices) are passed through as Tensors without grad.
        params: extra float64 Tensors (e.g. a layer's parameters) to check.

    Returns the list of analytic gradients (inputs first, then params).
    """
    label = name or getattr(fn, "__name__", "fn")
    tensors = []
    for a in inputs:
        arr = np.asarray(a)
        if np.issubdtype(arr.dtype, np.floating):
            tensors.append(Tensor(arr.astype(np.float64), requires_grad=True))
        else:
            tensors.append(Tensor(arr))
    targets = [t for t in tensors if t.requires_grad] + list(params)
    for t in targets:
        if t.data.dtype != np.float64:
            raise TypeError(f"check_gradients({label}): gradients are checked in float64; got {t.data.dtype}")
        t.grad = None

    outputs = fn(*tensors)
    outputs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
    rng = np.random.default_rng(seed)
    weights = [rng.standard_normal(o.data.shape) for o in outputs]
    total = None
    for o, w in zip(outputs, weights):
        term = (o * Tensor(w)).sum()
        total = term if total is None else total + term
    total.backward()

    def value():
        with no_grad():
            outs = fn(*tensors)
            outs = outs if isinstance(outs, (tuple, list)) else (outs,)
            return sum(_contract(o, w) for o, w in zip(outs, weights))

    analytic = []
    for k, t in enumerate(targets):
        got = np.zeros_like(t.data) if t.grad is None else np.asarray(t.grad, dtype=np.float64)
        numeric = np.zeros_like(t.data)
        t.data = np.ascontiguousarray(t.data)
        flat = t.data.reshape(-1)  # a view: perturbs t.data in place
        for i in range(flat.size):
            orig = flat[i]
            flat[i] = orig + eps
            up = value()
            flat[i] = orig - eps
            down = value()
            flat[i] = orig
            numeric.reshape(-1)[i] = (up - down) / (2 * eps)
        np.testing.assert_allclose(
            got,
            numeric,
            atol=atol,
            rtol=rtol,
            err_msg=f"{label}: autograd gradient of target {k} (shape {t.data.shape}) disagrees with central differences",
        )
        analytic.append(got)
    return analytic


def check_module_gradients(module, *inputs, loss=None, **kwargs):
    """Check gradients of a layer w.r.t. its floating inputs and all its parameters (float64)."""
    module.to("float64")
    params = module.parameters()

    def fn(*xs):
        out = module(*xs)
        return loss(out) if loss is not None else out

    return check_gradients(fn, inputs, params, name=type(module).__name__, **kwargs)


def run_docstring_examples(package, *, skip=()):
    """Run every ``>>>`` example in the docstrings of ``package``'s modules.

    Each package's test cell calls this for its own modules (``"everyo"`` for
    core, which covers only core's modules, ``"everyo.amp"``, ...), so a
    docstring example that stops working fails the tests. Examples see ``eo``
    (everyo) and ``np`` (NumPy) without importing them; NumPy prints in its
    legacy-free default style.

    Args:
        package: the dotted name of a package (or module).
        skip: dotted module names not to run (for example, modules of another
            distribution that share the ``everyo`` namespace).

    Returns ``(attempted, failures)``: the number of examples run and a list of
    ``"module: failure report"`` strings, empty when every example passed.
    """
    import doctest
    import importlib
    import pkgutil

    import everyo

    root = importlib.import_module(package)
    names = [package]
    if hasattr(root, "__path__"):
        names += [info.name for info in pkgutil.walk_packages(root.__path__, package + ".")]
    finder = doctest.DocTestFinder(exclude_empty=True)
    attempted, failures = 0, []
    for name in sorted(set(names)):
        if any(name == s or name.startswith(s + ".") for s in skip):
            continue
        module = importlib.import_module(name)
        for test in finder.find(module, name, globs={"eo": everyo, "np": np}):
            runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
            report = []
            result = runner.run(test, out=report.append)
            attempted += result.attempted
            if result.failed:
                failures.append(f"{test.name}:\n" + "".join(report))
    return attempted, failures
