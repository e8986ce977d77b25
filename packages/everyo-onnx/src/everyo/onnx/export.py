"""export_onnx: trace an EveryO model and write it as an ONNX file.

Everything that can be refused is refused before a byte is written: the
model's dtypes and layers, the trace (data-dependent Python values, ops with
no rule, in-place ``.data`` changes), the dynamic-axes check, ONNX's checker,
the 2 GiB limit and, with ``verify=True``, ONNX Runtime's agreement.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import numpy as np

import everyo
from everyo.errors import EveryOSerializationError
from everyo.io import atomic_write
from everyo.nn import Module
from everyo.onnx import dynamic, nesting
from everyo.onnx.graph import onnx_type
from everyo.onnx.guards import GUARDS_KEY, make_guards
from everyo.onnx.optimize import cancel_transposes, eliminate_dead, identity_outputs
from everyo.onnx.rules import RULES
from everyo.onnx.trace import GuardFailed, Tracer, trace
from everyo.onnx.translate import Translator

if TYPE_CHECKING:
    import os
    from collections.abc import Mapping, Sequence
    from typing import TypeAlias, TypeVar

    import onnx
    from everyo._typing import TensorLike

    #: The path type export_onnx was given, which it returns.
    PathT = TypeVar("PathT", bound="str | os.PathLike[str]")
    #: ``{"input": {0: "batch", 1: "seq"}}``, or ``{"input": [0, 1]}`` (axes named ``input_dim0`` ...).
    DynamicAxes: TypeAlias = Mapping[str, Mapping[int, str] | list[int] | tuple[int, ...]]

# Opset 17 is run by every ONNX Runtime since 1.13 (2022) and by most other
# runtimes. Any opset from MIN_OPSET (Softmax over one axis, Split/Squeeze
# taking their sizes as inputs) to the newest the installed onnx knows works.
DEFAULT_OPSET = 17
MIN_OPSET = 13
# A protobuf message cannot exceed 2 GiB; the weights must fit with room for the graph.
MAX_MODEL_BYTES = 2**31 - 2**24

INSTALL_HINT = "Install it with: pip install everyo-core[onnx]"


def _import_onnx():
    try:
        import onnx
    except ImportError as exc:
        raise ImportError(f"export_onnx needs the onnx package, which is not installed. {INSTALL_HINT}") from exc
    return onnx


def _module_paths(model, path="model"):
    """``(position, module)`` for every module: ``model[1][0]`` inside
    Sequentials, ``model.encoder.norm`` for attributes."""
    yield path, model
    for name, child in model._modules.items():
        sub = f"{path}[{name}]" if isinstance(model, everyo.Sequential) and name.isdigit() else f"{path}.{name}"
        yield from _module_paths(child, sub)


def _check_model(model):
    """Refuse float64/bfloat16/float16 weights and batch norms without
    running statistics, naming every offending layer at once."""
    problems = []
    for where, m in _module_paths(model):
        if isinstance(m, (everyo.BatchNorm1D, everyo.BatchNorm2D)) and not m.track_running_stats:
            problems.append(
                f"{type(m).__name__} at {where} was built with track_running_stats=False: it has no running "
                f"statistics, so there is no inference-time behaviour to export (rebuild it with "
                f"track_running_stats=True and train it)"
            )
        tensors = list(m._parameters.items()) + list(m._buffers.items())
        for pname, t in tensors:
            dtype = None if t is None else np.asarray(t.data).dtype
            if dtype is not None and dtype.kind in "fV" and dtype != np.float32:
                extra = " (bfloat16 to float32 is exact)" if dtype.name == "bfloat16" else ""
                problems.append(
                    f"{type(m).__name__} at {where} has {pname} of dtype {dtype.name}; the exporter writes "
                    f"float32 graphs (ONNX Runtime's CPU Conv and AveragePool have no float64 kernels). Call "
                    f"model.to('float32') before exporting{extra}"
                )
    if problems:
        raise EveryOSerializationError(
            "cannot export this model to ONNX, nothing was written: " + "; ".join(problems) + "."
        )


def _parameter_names(model):
    names = {}
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        names.setdefault(id(t), name)
    return names


def _as_list(names, singular, label, count=None):
    if names is None:
        names = singular
    if names is None:
        return None
    names = [names] if isinstance(names, str) else list(names)
    if not names or not all(isinstance(n, str) and n for n in names):
        raise ValueError(f"{label} must be non-empty strings, got {names!r}")
    if len(set(names)) != len(names):
        raise ValueError(f"{label} must be distinct, got {names!r}")
    return names


def _default_names(stem, count):
    return [stem] if count == 1 else [f"{stem}{k}" for k in range(count)]


def _check_opset(onnx, opset):
    newest = onnx.defs.onnx_opset_version()
    opset = DEFAULT_OPSET if opset is None else opset
    if not isinstance(opset, int) or isinstance(opset, bool) or not MIN_OPSET <= opset <= newest:
        raise ValueError(
            f"opset must be an integer from {MIN_OPSET} to {newest} (the newest the installed onnx "
            f"package knows), got {opset!r}; the default is {DEFAULT_OPSET}"
        )
    return opset


def _user_frame(tb):
    """``file:line in function`` of the innermost frame of ``tb`` in the user's
    code (not everyo's, not an installed package's or the standard library's)."""
    import os
    import sys
    import traceback

    from everyo.onnx.trace import _LIBRARY_DIRS

    installed = tuple({os.path.normcase(os.path.abspath(p)) + os.sep for p in (sys.prefix, sys.base_prefix)})
    found = None
    for frame, line in traceback.walk_tb(tb):
        filename = os.path.normcase(os.path.abspath(frame.f_code.co_filename))
        if not filename.startswith(_LIBRARY_DIRS + installed) and not filename.startswith("<"):
            found = f"{frame.f_code.co_filename}:{line} in {frame.f_code.co_name}"
    return found


def _wrap_model_error(exc, model, arrays, when):
    shapes = ", ".join(f"{a.shape} {a.dtype}" for a in arrays)
    where = _user_frame(exc.__traceback__)
    at = f" (raised from {where})" if where else ""
    message = f"while tracing {type(model).__name__} {when} on input(s) {shapes}{at}: {exc}"
    try:
        new = type(exc)(message)
    except Exception:
        new = EveryOSerializationError(message)
    return new


def _run_trace(model, arrays, input_names, names, when, axes, tracer=None, spec=None):
    try:
        return trace(model, arrays, input_names, names, axes, tracer=tracer, spec=spec)
    except (EveryOSerializationError, GuardFailed):
        raise  # the tracer's own refusals already say what and where
    except Exception as exc:
        raise _wrap_model_error(exc, model, arrays, when) from exc


_CHECK_TRACE = (
    "again with every dynamic axis one larger (the dynamic-axes check; dynamic axes {axes}; an axis "
    "that cannot change size must be left out of dynamic_axes)"
)


def _check_trace(model, first, arrays, input_names, names, axes, spec=None):
    """The second trace, at other sizes: every dynamic axis one larger, or,
    when that breaks one of the model's asserts on sizes, one smaller. Python
    decisions on changing sizes are refused here (naming their line) before
    any other difference is looked at. Returns (tracer, outputs, arrays, guards)."""
    ranges = dynamic.integer_ranges(first)
    failed = None
    for shrink in (False, True):
        arrays2 = dynamic.second_example(arrays, axes, input_names, ranges, shrink=shrink)
        second = Tracer(names, check=True)
        try:
            _, outputs2 = _run_trace(
                model, arrays2, input_names, names, _CHECK_TRACE.format(axes=axes), axes, second, spec
            )
        except GuardFailed as exc:
            dynamic.same_decisions(first, second, arrays, arrays2)
            failed = exc
            continue
        except Exception:
            dynamic.same_decisions(first, second, arrays, arrays2)  # a decision on a size explains it best
            raise
        return second, outputs2, arrays2, dynamic.same_decisions(first, second, arrays, arrays2)
    raise EveryOSerializationError(
        f"cannot export with these dynamic axes: the dynamic-axes check traces the model at other sizes, but both "
        f"one larger and one smaller break {failed}. Give an example whose dynamic sizes can change by one either "
        f"way within the assert, or leave that axis out of dynamic_axes. Nothing was written"
    )


def _axis_namer(first, second, axes, input_names, arrays, arrays2):
    """``name_of(value, axis)``: the dynamic axis name a traced size is: an
    input's declared axis, or the one axis whose sizes in both traces it matches."""
    sizes1 = dynamic._sizes(axes, input_names, arrays)
    sizes2 = dynamic._sizes(axes, input_names, arrays2)

    def name_of(value, axis):
        if value.kind == "input":
            return axes.get(value.name, {}).get(axis)
        other = second.nodes[value.node.index].outputs[value.index] if value.node is not None else None
        if other is None or axis >= other.data.ndim:
            return None
        n1, n2 = value.shape[axis], other.shape[axis]
        found = [d for d in sizes1 if sizes1[d] == n1 and sizes2.get(d) == n2]
        return found[0] if len(found) == 1 else None

    return name_of


def _translate(tracer, outputs, partner, opset, output_names):
    t = Translator(tracer, partner, opset)
    for name in output_names:  # so that no generated name can take a graph output's name
        t.g.reserve(name)
    g = t.run(RULES)
    final = [t.name(tracer.value_of(o)) for o in outputs]  # an output never recorded is a constant
    cancel_transposes(g, final)
    final = identity_outputs(g, output_names, final)
    eliminate_dead(g, final)
    return g


def _value_infos(helper, names, values, dims):
    return [helper.make_tensor_value_info(n, onnx_type(v.dtype), d) for n, v, d in zip(names, values, dims)]


def build_model(
    model: Module,
    *,
    input_shape: Sequence[int | None] | None = None,
    example_input: TensorLike | tuple[TensorLike, ...] | None = None,
    input_names: str | Sequence[str] | None = None,
    output_names: str | Sequence[str] | None = None,
    dynamic_axes: DynamicAxes | None = None,
    opset: int | None = None,
    input_name: str | None = None,
    output_name: str | None = None,
    _keep: dict[str, Any] | None = None,
) -> onnx.ModelProto:
    """Trace ``model`` and build the checked ``onnx.ModelProto`` without writing it.

    Takes the same arguments as :func:`export_onnx` (no path, no verify).
    """
    onnx = _import_onnx()
    from onnx import helper, numpy_helper

    if not isinstance(model, Module):
        raise TypeError(f"export_onnx expects an EveryO Module, got {type(model).__name__}")
    opset = _check_opset(onnx, opset)
    arrays = dynamic.example_arrays(input_shape, example_input)
    in_spec = None if example_input is None else nesting.example_inputs(example_input)[1]
    input_names = _as_list(input_names, input_name, "input_names") or _default_names("input", len(arrays))
    if len(input_names) != len(arrays):
        nested = (
            ""
            if in_spec is None
            else f" (example_input is {nesting.describe(in_spec)}, T a tensor, flattened in order)"
        )
        raise ValueError(
            f"input_names has {len(input_names)} names for {len(arrays)} example input tensors{nested}; give one "
            f"name per tensor, in order, or leave input_names out for generated names"
        )
    _check_model(model)
    names = _parameter_names(model)
    axes = dynamic.normalize_axes(dynamic_axes, input_names, arrays)

    first, outputs = _run_trace(model, arrays, input_names, names, "", axes, spec=in_spec)
    changed = first.changed_in_place()
    if changed is not None:
        value, user = changed
        what = value.name or f"a {value.kind} tensor of shape {value.shape}"
        where = user.describe() if user is not None else "the trace"
        wrote = first.written_at(value.tensor)
        at = f" at {wrote}" if wrote else " (by a direct write into its array)"
        raise EveryOSerializationError(
            f"cannot export: the .data of {what} (used by {where}) was changed in place{at} during the forward "
            f"pass; the exported graph would use one value where EveryO used two. Compute the new value with "
            f"EveryO ops (or change it outside forward()). Nothing was written"
        )
    output_names = _as_list(output_names, output_name, "output_names") or _default_names("output", len(outputs))
    if len(output_names) != len(outputs):
        raise ValueError(f"output_names has {len(output_names)} names, but the model returns {len(outputs)} outputs")
    clash = set(output_names) & set(input_names)
    if clash:
        raise ValueError(f"input and output names must differ, both use {sorted(clash)}")
    unknown = sorted(set(axes) - set(input_names) - set(output_names))
    if unknown:
        raise ValueError(f"dynamic_axes names {unknown}, which are not inputs {input_names} or outputs {output_names}")

    second, outputs2, arrays2, decisions = _check_trace(model, first, arrays, input_names, names, axes, in_spec)
    guards = make_guards(decisions, _axis_namer(first, second, axes, input_names, arrays, arrays2))
    try:
        dynamic.same_ops(first, second, arrays, arrays2)
        g = _translate(first, outputs, second, opset, output_names)
        g2 = _translate(second, outputs2, first, opset, output_names)
        dynamic.same_graph(g, g2, arrays, arrays2)
    except EveryOSerializationError as exc:
        if not first.len_lines or "differ" not in str(exc):
            raise
        raise EveryOSerializationError(
            f"{exc} (Note: the model takes len() of a traced tensor at {', '.join(first.len_lines)}: Python's len() "
            f"is always a plain int, which the graph cannot follow; write x.shape[0], a size the graph computes.)"
        ) from None

    out_values = [first.value_of(o) for o in outputs]
    out_values2 = [second.value_of(o) for o in outputs2]
    in_dims = [dynamic.dims(a.shape, axes.get(n, {})) for n, a in zip(input_names, arrays)]
    out_dims = [
        dynamic.output_dims(v.shape, v2.shape, name, axes, input_names, arrays, arrays2)
        for name, v, v2 in zip(output_names, out_values, out_values2)
    ]
    size = sum(a.nbytes for a in g.initializers.values())
    if size > MAX_MODEL_BYTES:
        raise EveryOSerializationError(
            f"cannot export: the model's weights take {size / 2**30:.2f} GiB, more than an ONNX file without "
            f"external data can hold (2 GiB, protobuf's limit); the exporter does not write external data. "
            f"Nothing was written"
        )
    graph = helper.make_graph(
        g.nodes,
        "everyo",
        _value_infos(helper, input_names, first.inputs, in_dims),
        _value_infos(helper, output_names, out_values, out_dims),
        initializer=[numpy_helper.from_array(a, n) for n, a in g.initializers.items()],
    )
    opsets = [helper.make_opsetid("", opset)]
    proto = helper.make_model(
        graph,
        opset_imports=opsets,
        ir_version=helper.find_min_ir_version_for(opsets),
        producer_name="everyo",
        producer_version=everyo.__version__,
        doc_string=f"Exported by everyo.onnx from {type(model).__name__} (traced)."
        + "".join(f"\nGuard: {g.text} (assert at {g.line})" for g in guards),
    )
    # The nesting of forward()'s arguments and result, for run_onnx and compile (everyo.onnx.nesting).
    props = {
        nesting.INPUTS_KEY: nesting.to_json(in_spec or {"tuple": [nesting.LEAF]}),
        nesting.OUTPUTS_KEY: nesting.to_json(first.output_spec),
    }
    if guards:
        props[GUARDS_KEY] = json.dumps([g.as_dict() for g in guards])
    helper.set_model_props(proto, props)
    try:
        onnx.checker.check_model(proto, full_check=True)
    except onnx.checker.ValidationError as exc:
        named = [(len(n.name), k) for k, n in enumerate(g.nodes) if n.name and n.name in str(exc)]
        origin = g.origins[max(named)[1]] if named else None
        where = f" at the node for {origin.describe()}" if origin is not None else ""
        raise EveryOSerializationError(
            f"the exported graph failed onnx.checker{where} ({exc}): an exporter bug, please report it with the "
            f"model; exporting with an older opset= may avoid it. Nothing was written"
        ) from exc
    if _keep is not None:
        _keep.update(
            graph=g,
            trace=first,
            outputs=outputs,
            arrays=arrays,
            second=second,
            outputs2=outputs2,
            arrays2=arrays2,
            ranges=dynamic.integer_ranges(first),
            guards=guards,
            input_spec=in_spec,
            input_names=input_names,
            output_names=output_names,
        )
    return proto


def export_onnx(
    model: Module,
    path: PathT,
    *,
    input_shape: Sequence[int | None] | None = None,
    example_input: TensorLike | tuple[TensorLike, ...] | None = None,
    input_names: str | Sequence[str] | None = None,
    output_names: str | Sequence[str] | None = None,
    dynamic_axes: DynamicAxes | None = None,
    opset: int | None = None,
    verify: bool = False,
    input_name: str | None = None,
    output_name: str | None = None,
) -> PathT:
    """Export ``model`` to an ONNX file at ``path`` by tracing its forward pass.

    Args:
        model: any EveryO ``Module`` (custom ``forward`` included).
        path: file to write, atomically: a failed or refused export leaves no
            file, and an existing file stays as it was.
        input_shape: ``(batch, ...)``; a float32 example is made from it.
        example_input: an array or Tensor, or a tuple of ``forward()``'s
            arguments (integer token ids and boolean masks included), nested as
            ``forward`` takes them: ``(ids, (h0, c0))`` is three graph inputs,
            flattened in order (dicts by sorted key); nothing is stacked.
        input_names: the graph's input names, one per flattened tensor
            (``input_name`` for one input still works). Default ``input``, or
            ``input0``, ``input1`` ... when there are several.
        output_names: the graph's output names, one per tensor of the result
            flattened the same way (``output_name`` for one output still
            works). Default ``output``, or ``output0``, ``output1`` ... A
            ``None`` in the result (nanoGPT's ``(logits, None)``) is not a
            graph output: it is dropped, and its place is kept with the rest
            of the nesting in the file's metadata (``everyo.outputs``), so
            ``run_onnx`` and ``compile`` return ``(logits, None)`` again.
        dynamic_axes: ``{"input": {0: "batch", 1: "seq"}}`` (or a list of
            axes); default: axis 0 of every input is ``batch``. Checked by a
            second trace at other sizes.
        opset: ONNX opset, default ``DEFAULT_OPSET`` (17).
        verify: run ONNX Runtime (optimisations off and on) on the example and
            raise ``EveryOExportMismatchError`` naming the first node over 1e-5;
            the outputs are also compared on the check trace's inputs and on a
            fresh random input of the example's sizes (integer inputs drawn
            from the rows they index, else from the example's range) run by
            EveryO itself, so a value folded from the example is caught.

    An ``assert`` on a traced size in ``forward`` becomes a *guard* of the
    file (see :mod:`everyo.onnx.guards`); Python control flow on a size that
    changes with the dynamic axes is refused, naming the line.

    The graph is the model's inference behaviour (the trace runs in eval
    mode); the model's modes and weights are left as they were.

    Example (writes a file, so not run as a doctest)::

        eo.export_onnx(model, "model.onnx", input_shape=(1, 8, 8, 1), output_name="logits")
        eo.run_onnx("model.onnx", batch)
    """
    keep: dict[str, Any] | None = {} if verify else None
    proto = build_model(
        model,
        input_shape=input_shape,
        example_input=example_input,
        input_names=input_names,
        output_names=output_names,
        dynamic_axes=dynamic_axes,
        opset=opset,
        input_name=input_name,
        output_name=output_name,
        _keep=keep,
    )
    data = proto.SerializeToString()
    if keep is not None:
        from everyo.onnx.trace import eager_outputs
        from everyo.onnx.verify import check_agreement

        # A value computed outside the graph from the example (folded) can agree at the example and
        # even at the check trace's sizes; fresh random inputs of the example's sizes, run by EveryO
        # itself, catch it.
        keep["arrays3"] = dynamic.third_example(keep["arrays"], keep["input_names"], keep["ranges"])
        keep["outputs3"] = eager_outputs(model, keep["arrays3"], keep["input_spec"])

        check_agreement(data, keep)  # raises before anything is written
    atomic_write(path, lambda f: f.write(data))
    return path


def verify_onnx(
    model: Module, path: str | os.PathLike[str], example_input: TensorLike | tuple[TensorLike, ...]
) -> list[dict[str, Any]]:
    """Compare the ONNX file at ``path`` with ``model`` on ``example_input``,
    value by value, and return the report (a list of dicts with ``value``,
    ``op``, ``line``, ``run``, ``max_abs``, ``max_rel``, ``ok``).

    The model is traced again on ``example_input`` with the file's input and
    output names, opset and dynamic axes, so the file's intermediate values
    can be matched to EveryO's. Nothing is raised for a disagreement: read
    the ``ok`` column (``format_report(rows)`` prints a table). Rows are the
    dicts of :func:`report`: ``value``, ``node``, ``op``, ``line``, ``run``,
    ``max_abs``, ``max_rel``, ``ok``.

    Example (reads an exported file, so not run as a doctest)::

        rows = eo.verify_onnx(model, "model.onnx", batch)
        print(eo.onnx.format_report(rows))
    """
    import onnx
    from everyo.onnx.verify import report

    proto = onnx.load(str(path))
    initializers = {i.name for i in proto.graph.initializer}
    inputs = [i for i in proto.graph.input if i.name not in initializers]
    axes = {}  # the file's symbolic input dims, so the re-trace builds the same graph
    for value in inputs:
        named = {k: d.dim_param for k, d in enumerate(value.type.tensor_type.shape.dim) if d.dim_param}
        if named:
            axes[value.name] = named
    opset = next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))
    example = example_input if isinstance(example_input, tuple) else (example_input,)
    keep: dict[str, Any] = {}
    build_model(
        model,
        example_input=example,
        input_names=[i.name for i in inputs],
        output_names=[o.name for o in proto.graph.output],
        dynamic_axes=axes,
        opset=opset,
        _keep=keep,
    )
    return report(proto.SerializeToString(), keep)


__all__ = ["export_onnx", "build_model", "verify_onnx", "DEFAULT_OPSET", "MIN_OPSET"]
