"""The one gradient checker (Chainer's idea: many ops, one harness).

Every op and layer test calls :func:`check_gradients` (or
:func:`check_module_gradients`): it compares autograd's gradients with
central finite differences computed in float64. The output is contracted
with a fixed random weight, so every element of the Jacobian contributes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from everyo.autograd import no_grad
from everyo.tensor import Tensor

if TYPE_CHECKING:
    import types
    from collections.abc import Callable, Iterable, Sequence

    from numpy.typing import ArrayLike

    from everyo._typing import Array
    from everyo.nn.module import Module


def _contract(out, weight):
    return float(np.sum(out.data.astype(np.float64) * weight))


def check_gradients(
    fn: Callable[..., Tensor | Sequence[Tensor]],
    inputs: Sequence[ArrayLike],
    params: Iterable[Tensor] = (),
    *,
    eps: float = 1e-6,
    atol: float = 1e-6,
    rtol: float = 1e-5,
    seed: int = 0,
    name: str | None = None,
) -> list[Array]:
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
    total: Tensor | None = None
    for o, w in zip(outputs, weights):
        term = (o * Tensor(w)).sum()
        total = term if total is None else total + term
    if total is None:
        raise ValueError(f"check_gradients({label}): fn returned no outputs")
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
        # A fresh copy: a graph still holding the old array (read-only while it does) is left alone.
        t.data = np.array(t.data, order="C", copy=True)
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


def check_module_gradients(
    module: Module, *inputs: ArrayLike, loss: Callable[[Any], Tensor] | None = None, **kwargs: Any
) -> list[Array]:
    """Check gradients of a layer w.r.t. its floating inputs and all its parameters (float64)."""
    module.to("float64")
    params = module.parameters()

    def fn(*xs):
        out = module(*xs)
        return loss(out) if loss is not None else out

    return check_gradients(fn, inputs, params, name=type(module).__name__, **kwargs)


def run_docstring_examples(package: str, *, skip: Sequence[str] = ()) -> tuple[int, list[str]]:
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
            report: list[str] = []
            result = runner.run(test, out=report.append)
            attempted += result.attempted
            if result.failed:
                failures.append(f"{test.name}:\n" + "".join(report))
    return attempted, failures


# Dunder methods that are part of a class's public interface (operators,
# containers, context managers, calls); other dunders are plumbing.
_PUBLIC_DUNDERS = frozenset(
    "__init__ __call__ __enter__ __exit__ __iter__ __next__ __len__ __getitem__ __setitem__ __contains__ "
    "__add__ __radd__ __iadd__ __sub__ __rsub__ __isub__ __mul__ __rmul__ __imul__ __truediv__ __rtruediv__ "
    "__itruediv__ __matmul__ __rmatmul__ __pow__ __rpow__ __neg__ __pos__ __abs__ __eq__ __ne__ __lt__ __le__ "
    "__gt__ __ge__ __bool__ __float__ __int__ __array__".split()
)


def _signature_gaps(qualname: str, fn: Callable[..., Any], *, is_method: bool) -> list[str]:
    import inspect

    if not inspect.isfunction(fn):
        return []  # a builtin or C callable (operator.attrgetter, ...): nothing to annotate here
    sig = inspect.signature(fn)
    gaps = []
    params = list(sig.parameters.values())
    if is_method and params and params[0].name in ("self", "cls"):
        params = params[1:]
    for p in params:
        if p.annotation is inspect.Parameter.empty:
            gaps.append(f"{qualname}: parameter {p.name!r} has no annotation")
    if sig.return_annotation is inspect.Signature.empty:
        gaps.append(f"{qualname}: no return annotation")
    return gaps


def _public_names(module: types.ModuleType, names: Iterable[str] | None) -> list[str]:
    """``names``, else the module's ``__all__``, else the public names it defines itself."""
    if names is None:
        names = getattr(module, "__all__", None)
    if names is None:
        names = [
            n
            for n, v in vars(module).items()
            if not n.startswith("_") and getattr(v, "__module__", None) == module.__name__
        ]
    return list(names)


def undocumented_public_api(module: types.ModuleType, names: Iterable[str] | None = None) -> list[str]:
    """The public names of ``module`` whose function or class has no docstring.

    Args:
        module: an imported module, for example ``everyo`` or ``everyo.amp``.
        names: the names to check; default ``module.__all__`` (as in
            :func:`unannotated_public_api`). Submodules and constants are
            skipped (they cannot carry one of their own), and so are add-on
            names whose add-on is not installed (its own cell checks them).

    Returns:
        The names without a docstring; empty when all have one.
    """
    import inspect

    missing = []
    for name in _public_names(module, names):
        try:
            obj = getattr(module, name)
        except ImportError:
            continue
        if inspect.ismodule(obj) or not callable(obj):
            continue
        doc = obj.__doc__ if inspect.isclass(obj) else inspect.getdoc(obj)
        if not (doc and doc.strip()):
            missing.append(name)
    return missing


def unannotated_public_api(module: types.ModuleType, names: Iterable[str] | None = None) -> list[str]:
    """List the gaps in the type annotations of a module's public API.

    The public API is every name in ``names`` (default: the module's
    ``__all__``, or its public attributes) that EveryO defines: functions, and for classes every public method, operator,
    property and ``__init__``. Each parameter (but ``self``/``cls``) and each
    return must be annotated. The test cells call this so that a public
    signature without annotations fails the tests; ``mypy`` (``hatch run
    types:check``) then checks that the annotations agree with the code.

    Args:
        module: an imported module, for example ``everyo`` or ``everyo.amp``.
        names: the names to check; default ``module.__all__``, or without
            one the public names the module itself defines.

    Returns:
        A list of strings, one per gap (``"Tensor.reshape: no return
        annotation"``); empty when the whole public API is annotated.
    """
    import inspect

    gaps: list[str] = []
    seen: set[int] = set()
    for name in _public_names(module, names):
        try:
            obj = getattr(module, name)
        except ImportError:
            continue  # an add-on's name, not installed in this cell: its own cell checks it
        if inspect.ismodule(obj) or id(obj) in seen:
            continue
        seen.add(id(obj))
        home = getattr(obj, "__module__", None) or ""
        if not (home == "everyo" or home.startswith("everyo.")):
            continue  # defined elsewhere (NumPy, the standard library, ...)
        if inspect.isclass(obj):
            for attr, value in vars(obj).items():
                if attr.startswith("_") and attr not in _PUBLIC_DUNDERS:
                    continue
                qual = f"{name}.{attr}"
                if isinstance(value, property):
                    if value.fget is not None:
                        gaps += _signature_gaps(qual, value.fget, is_method=True)
                    if value.fset is not None:
                        gaps += [g for g in _signature_gaps(qual, value.fset, is_method=True) if "return" not in g]
                elif isinstance(value, (staticmethod, classmethod)):
                    gaps += _signature_gaps(qual, value.__func__, is_method=isinstance(value, classmethod))
                elif inspect.isfunction(value):
                    gaps += _signature_gaps(qual, value, is_method=True)
        elif inspect.isfunction(obj):
            gaps += _signature_gaps(name, obj, is_method=False)
    return gaps
