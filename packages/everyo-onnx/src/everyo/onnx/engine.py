"""``eo.onnx.compile``: ONNX Runtime as EveryO's inference engine.

``compile(model, example_input)`` exports the model's graph (the tracing
exporter, in memory: no file) and returns a :class:`CompiledModel`, a
callable with the model's call signature that runs that graph in an ONNX
Runtime session. What it promises, and how it keeps each promise:

- **The model's numbers.** On the first call the graph is verified as
  ``export_onnx(..., verify=True)`` verifies a file (every value, at the
  example, at other sizes and on fresh random inputs), and its result on the
  call's own inputs is compared with EveryO's (1e-5). If either check fails,
  or the model cannot be exported at all, the compiled model warns, saying
  why, and runs the model in EveryO from then on (its result is still right).
- **Eval mode.** The graph is the model's inference behaviour (dropout off,
  batch norm on its running statistics), whatever ``model.training`` is; the
  EveryO fallback also runs in eval mode, under ``no_grad``.
- **The weights it was compiled with.** Every call checks that no parameter
  or buffer was changed in place (EveryO's version counter, which optimizers
  and ``p.data = ...`` / ``p.data -= ...`` move) or replaced by another
  tensor, and raises if one was: call :meth:`CompiledModel.recompile` to
  export the current weights. A call reads two global counters: the
  version clock, and core's module-registry clock, which every assignment
  of a Module attribute and every ``register_*`` call moves; only when one
  moved does it compare each parameter's, buffer's and submodule's identity
  and version (measured 0.05 us against 2 us for the digit CNN's 14 tensors
  compared on every call, on a loaded 2-core machine). Writes straight into
  an array (``p.data[...] = 0``) are not counted.
- **Threads.** With ``threads=None`` a call at batch 1 (every input's
  leading axis 1) runs in a second session with one intra-op thread, built
  from the same graph on the first such call: an op on one example is too
  small to split, and waking a sleeping thread for it costs more than it
  saves (measured on a loaded 2-core machine: the char GPT 218 against 268 us
  per call, the digit CNN 16 against 29 us). Other calls use ORT's choice.
  That second session holds a second copy of the weights.
- **The exporter's guards** (an ``assert`` on a size in ``forward``, recorded
  as ``everyo.guards``) are checked on every call, before ORT runs.
"""

from __future__ import annotations

import threading
import warnings
from typing import TYPE_CHECKING, Any

import numpy as np

from everyo import autograd, dispatch
from everyo.autograd import no_grad
from everyo.errors import EveryOError
from everyo.nn import module as _registry
from everyo.onnx import nesting
from everyo.onnx.runtime import _NUMPY_OF, as_feed
from everyo.tensor import Tensor

if TYPE_CHECKING:
    from collections.abc import Sequence

    from everyo._typing import TensorLike
    from everyo.nn import Module
    from everyo.onnx.export import DynamicAxes


class EveryOWeightsChangedError(EveryOError, RuntimeError):
    """A compiled model's weights changed after it was compiled (see :meth:`CompiledModel.recompile`)."""


def session_options(ort: Any, threads: int | None = None) -> Any:
    """The ONNX Runtime session options ``compile`` uses: every graph
    optimisation on, ``threads`` intra-op threads (ORT's choice when None),
    and no spin-waiting between calls: an EveryO program runs NumPy (and its
    BLAS threads) between predictions, and ORT's spinning threads would take
    the cores from it."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if threads is not None:
        options.intra_op_num_threads = int(threads)
    return options


def _as_tensors(obj):
    """``obj`` with every NumPy array in it (at any depth) made a Tensor."""
    if isinstance(obj, np.ndarray):
        return Tensor(obj)
    if isinstance(obj, (tuple, list)):
        return type(obj)(_as_tensors(item) for item in obj)
    if isinstance(obj, dict):
        return {k: _as_tensors(v) for k, v in obj.items()}
    return obj


def _eager(model, args):
    """``model(*args)`` in eval mode, without autograd or autocast, arrays
    given as Tensors; modes restored."""
    args = _as_tensors(tuple(args))
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    token = dispatch.set_policy(None)
    try:
        with no_grad():
            return model(*args)
    finally:
        dispatch.reset_policy(token)
        for m, mode in modes:
            object.__setattr__(m, "training", mode)


def _weights(model):
    """``[(owner dict, key, tensor, version)]`` for every parameter and buffer,
    and ``(owner dict, key, module, None)`` for every submodule (replacing one
    replaces its weights)."""
    out = []
    for m in model.modules():
        for table in (m._parameters, m._buffers):
            out.extend((table, key, t, t._version) for key, t in table.items() if t is not None)
        out.extend((m._modules, key, child, None) for key, child in m._modules.items())
    return out


class CompiledModel:
    """What :func:`compile` returns: call it as the model.

    Attributes:
        model: the EveryO model.
        session: the ONNX Runtime ``InferenceSession`` (None when it fell back).
        fallback_reason: why it runs in EveryO instead, or None.
        guards: the exported graph's guards (:class:`everyo.onnx.guards.Guard`).
    """

    def __init__(
        self,
        model: Module,
        example_input: Any,
        *,
        input_names: Sequence[str] | None = None,
        dynamic_axes: DynamicAxes | None = None,
        providers: Sequence[str] | None = None,
        threads: int | None = None,
    ) -> None:
        self.model = model
        self._names = input_names
        self._example = example_input
        self._dynamic_axes = dynamic_axes
        self._providers = list(providers) if providers is not None else ["CPUExecutionProvider"]
        self._threads = threads
        self._lock = threading.Lock()
        self.recompile()

    # --- building -------------------------------------------------------------------------
    def recompile(self) -> None:
        """Export the model again with its current weights (after training
        steps, ``load_state_dict`` ...) and verify it on the next call."""
        self.session = self.fallback_reason = self._single = None
        self.guards: list[Any] = []
        self._verified = False
        self._weights = _weights(self.model)
        self._clock = autograd.latest_version
        self._registry_clock = _registry.registry_version
        try:
            self._build()
        except (EveryOError, ImportError) as exc:
            self._fall_back(f"it could not be exported: {exc}")

    def _build(self):
        from everyo.onnx.export import build_model
        from everyo.onnx.guards import read_guards
        from everyo.onnx.runtime import import_runtime

        ort = import_runtime("eo.onnx.compile")
        keep: dict[str, Any] = {}
        example = self._example if isinstance(self._example, tuple) else (self._example,)
        proto = build_model(
            self.model, example_input=example, input_names=self._names, dynamic_axes=self._dynamic_axes, _keep=keep
        )
        self._keep, self._bytes = keep, proto.SerializeToString()
        self.guards = read_guards(proto)
        self._guard_dims = [
            (k, [(axis, d.dim_param) for axis, d in enumerate(i.type.tensor_type.shape.dim) if d.dim_param])
            for k, i in enumerate(proto.graph.input)
        ]
        self.session = ort.InferenceSession(self._bytes, session_options(ort, self._threads), providers=self._providers)
        self._ort = ort
        inputs = self.session.get_inputs()
        self._input_names = [i.name for i in inputs]
        self._dtypes = [_NUMPY_OF.get(i.type) for i in inputs]
        self._output_names = [o.name for o in self.session.get_outputs()]
        self._in_spec = keep["input_spec"] or {"tuple": [nesting.LEAF]}
        self._flat_args = self._in_spec == {"tuple": [nesting.LEAF] * len(inputs)}
        self._out_spec = keep["trace"].output_spec
        # One plain input (most models): calls skip the general nesting and casting steps.
        self._solo = self._input_names[0] if self._flat_args and len(inputs) == 1 and not self.guards else None

    def _fall_back(self, why):
        self.session, self.fallback_reason = None, why
        warnings.warn(
            f"eo.onnx.compile: {type(self.model).__name__} runs in EveryO, not ONNX Runtime, because {why}",
            RuntimeWarning,
            stacklevel=3,
        )

    # --- calling ------------------------------------------------------------------------------
    def _check_weights(self):
        if autograd.latest_version == self._clock and _registry.registry_version == self._registry_clock:
            return  # no tensor anywhere changed in place, no module attribute anywhere was assigned
        clock, registry_clock = autograd.latest_version, _registry.registry_version
        for table, key, t, version in self._weights:
            if table.get(key) is not t or (version is not None and t._version != version):
                change = "replaced" if table.get(key) is not t else "changed in place"
                raise EveryOWeightsChangedError(
                    f"the weights of {type(self.model).__name__} changed after eo.onnx.compile ({key!r} was "
                    f"{change}); the compiled graph holds the old values. Call .recompile() on the compiled "
                    f"model to export the current weights"
                )
        self._clock, self._registry_clock = clock, registry_clock

    def _leaves(self, args):
        if self._flat_args and len(args) == len(self._input_names):
            if not any(isinstance(a, (tuple, list, dict)) for a in args):
                return args
        return nesting.call_inputs(self._in_spec, args, "the compiled model")

    def _feeds(self, leaves):
        return {name: as_feed(x, want) for name, want, x in zip(self._input_names, self._dtypes, leaves)}

    def _solo_feeds(self, args):
        """``{name: array}`` for a one-input model called with one array or
        Tensor already of the input's dtype, else None (the general path)."""
        if len(args) != 1:
            return None
        a = args[0]
        array = a._data if type(a) is Tensor else a
        if type(array) is not np.ndarray or array.dtype is not self._dtypes[0]:
            return None
        return {self._solo: array}

    def _session_for(self, feeds):
        """The session for these inputs: the one-thread session at batch 1
        when ``threads`` was not given (see the module's notes)."""
        if self._threads is not None:
            return self.session
        for a in feeds.values():
            if a.shape[:1] != (1,):
                return self.session
        single = self._single
        if single is None:
            with self._lock:
                if self._single is None:
                    self._single = self._ort.InferenceSession(
                        self._bytes, session_options(self._ort, 1), providers=self._providers
                    )
                single = self._single
        return single

    def _check_guards(self, feeds):
        from everyo.onnx.guards import check_guards

        sizes = {}
        for k, dims in self._guard_dims:
            shape = feeds[self._input_names[k]].shape
            for axis, dim in dims:
                sizes.setdefault(dim, int(shape[axis]))
        check_guards(self.guards, sizes)

    def _first_call(self, feeds, outputs):
        """Verify the graph as export_onnx(verify=True) does, and against EveryO on these inputs."""
        from everyo.onnx import dynamic
        from everyo.onnx.trace import eager_outputs
        from everyo.onnx.verify import _errors, check_agreement

        keep = self._keep
        keep["arrays3"] = dynamic.third_example(keep["arrays"], keep["input_names"], keep["ranges"])
        keep["outputs3"] = eager_outputs(self.model, keep["arrays3"], keep["input_spec"])
        try:
            check_agreement(self._bytes, keep)
        except EveryOError as exc:
            return f"its graph did not pass verification: {exc}"
        args = nesting.unflatten(self._in_spec, (Tensor(feeds[n]) for n in self._input_names))
        expected, _ = nesting.outputs(_eager(self.model, args))
        for name, a, e in zip(self._output_names, outputs, expected):
            e = np.asarray(e.data)
            if a.shape != e.shape or not _errors(a, e)[2]:
                return (
                    f"on the first call's inputs ONNX Runtime's output {name!r} differs from EveryO's "
                    f"(shapes {a.shape} and {e.shape}, max abs error {_errors(a, e)[0] if a.shape == e.shape else 'n/a'})"
                )
        return None

    def __call__(self, *args: Any) -> Any:
        """Run the compiled graph on ``args`` (nested as the model takes them;
        arrays or Tensors) and return Tensors nested as the model returns them."""
        if self.session is None:
            return _eager(self.model, args)
        self._check_weights()
        feeds = self._solo_feeds(args) if self._solo is not None else None
        if feeds is None:
            feeds = self._feeds(self._leaves(args))
            if self.guards:
                self._check_guards(feeds)
        outputs = self._session_for(feeds).run(self._output_names, feeds)
        if not self._verified:
            with self._lock:
                if not self._verified:
                    why = self._first_call(feeds, outputs)
                    if why is not None:
                        self._fall_back(why)
                        return _eager(self.model, args)
                    self._verified = True
        if self._out_spec == nesting.LEAF:
            return Tensor(outputs[0])
        return nesting.unflatten(self._out_spec, (Tensor(a) for a in outputs))

    def __repr__(self) -> str:
        where = f"EveryO ({self.fallback_reason})" if self.session is None else "ONNX Runtime"
        return f"CompiledModel({type(self.model).__name__}, runs in {where})"


def compile(
    model: Module,
    example_input: TensorLike | tuple[Any, ...],
    *,
    input_names: Sequence[str] | None = None,
    dynamic_axes: DynamicAxes | None = None,
    providers: Sequence[str] | None = None,
    threads: int | None = None,
) -> CompiledModel:
    """Serve ``model``'s predictions with ONNX Runtime: export it in memory
    and return a callable with the model's call signature.

    Args:
        model: an EveryO ``Module``; it runs as in eval mode.
        example_input: as for :func:`export_onnx` (a tuple of ``forward``'s
            arguments, nested as it takes them).
        input_names: as for :func:`export_onnx` (one per flattened tensor),
            the names ``dynamic_axes`` uses; default ``input`` or ``input0`` ...
        dynamic_axes: as for :func:`export_onnx`; default axis 0 (batch).
        providers: ONNX Runtime execution providers (default CPU).
        threads: ONNX Runtime's intra-op threads (default: one at batch 1,
            where a second thread costs more than it saves; ORT's choice
            otherwise).

    The first call verifies the graph (every value, as ``verify=True``) and
    compares it with EveryO on that call's inputs; a model that cannot be
    exported or verified runs in EveryO instead, with a ``RuntimeWarning``
    saying why. Calls raise ``EveryOWeightsChangedError`` once the weights
    change, until ``recompile()``. Outputs are Tensors (no gradient).

    Example (needs onnxruntime, so not run as a doctest)::

        fast = eo.onnx.compile(model, batch[:1])
        logits = fast(batch)
    """
    return CompiledModel(
        model, example_input, input_names=input_names, dynamic_axes=dynamic_axes, providers=providers, threads=threads
    )


__all__ = ["compile", "CompiledModel", "EveryOWeightsChangedError", "session_options"]
