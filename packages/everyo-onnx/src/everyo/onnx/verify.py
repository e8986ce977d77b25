"""Check an export against ONNX Runtime, value by value.

Every ONNX value that stands for a value EveryO recorded while tracing is
compared with it: with ONNX Runtime's graph optimisations off and on, every
such intermediate (exposed as an extra graph output); with them on and
nothing exposed (fused kernels, as deployed), the graph's outputs; and those
outputs again at the check trace's other sizes, which tests the dynamic axes
with numbers; and, from ``export_onnx(verify=True)``, the outputs on a fresh
random input of the example's own sizes against EveryO's eager pass, which
catches a value computed from the example's data outside the graph. A value
agrees when each element is within 1e-5 absolutely or relatively (float32);
integers and booleans must be equal.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from everyo.errors import EveryOExportMismatchError

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

TOLERANCE = 1e-5


def _errors(actual, expected):
    if expected.dtype.kind != "f":
        bad = np.asarray(actual != expected)
        return (float(bad.any()), float(bad.any()), not bad.any())
    a = np.asarray(actual, np.float64)
    e = np.asarray(expected, np.float64)
    both_nan = np.isnan(a) & np.isnan(e)
    same_inf = np.isinf(e) & (a == e)
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf where both are the same infinity
        diff = np.where(both_nan | same_inf, 0.0, np.abs(a - e))
        diff = np.where(np.isnan(diff), np.inf, diff)
        rel = diff / np.maximum(np.abs(e), np.finfo(np.float32).tiny)
    ok = bool(np.all((diff <= TOLERANCE) | (rel <= TOLERANCE)))
    return (float(diff.max(initial=0.0)), float(rel.max(initial=0.0)), ok)


def _session(ort, model_bytes, optimise):
    options = ort.SessionOptions()
    options.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimise else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    )
    return ort.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])


def _intermediates(keep):
    """``[(onnx name, recorded Node, recorded array)]`` in graph order, for every
    recorded value the final graph still computes in EveryO's layout."""
    g, tracer = keep["graph"], keep["trace"]
    produced = {out for n in g.nodes for out in n.output}
    rows, seen = [], set()
    for node in tracer.nodes:
        if node.op == "arange":
            # ONNX Runtime's optimiser rewrites Range into what reads it; asked to expose its output
            # anyway, 1.19 hands back None and newer versions refuse the graph. Its users are compared.
            continue
        for value in node.outputs:
            name = g.names.get(id(value))
            if name in produced and name not in g.layout_changed and name not in seen:
                seen.add(name)
                rows.append((name, node, value.data))
    return rows


def report(model_bytes, keep):
    """The per-value comparison as a list of dicts: value (the ONNX name),
    node (the ONNX node computing it), op (the EveryO op), line (the user's
    source line), run, max_abs, max_rel, ok (graph order)."""
    import onnx
    from everyo.onnx.runtime import import_runtime
    from onnx import helper

    ort = import_runtime("verify")
    feeds = dict(zip(keep["input_names"], keep["arrays"]))
    proto = onnx.load_from_string(model_bytes)
    node_of = {out: n.name for n in proto.graph.node for out in n.output}
    graph_names = {o.name for o in proto.graph.output} | {i.name for i in proto.graph.input}
    rows = [(n, node, data) for n, node, data in _intermediates(keep) if n not in graph_names]
    for name, _, _ in rows:
        proto.graph.output.append(helper.make_empty_tensor_value_info(name))
    out = []

    def compare(run, names, arrays, origins, session, inputs):
        results = session.run(names, inputs)
        for name, origin, expected, actual in zip(names, origins, arrays, results):
            if actual is None:
                actual = np.full((), np.nan)  # a value ONNX Runtime did not hand back: reported as disagreeing
            max_abs, max_rel, ok = (
                _errors(actual, expected) if actual.shape == expected.shape else (float("inf"), float("inf"), False)
            )
            out.append(
                dict(
                    value=name,
                    node=node_of.get(name, ""),
                    op=origin.op if origin is not None else "output",
                    line=origin.line if origin is not None else "",
                    run=run,
                    max_abs=max_abs,
                    max_rel=max_rel,
                    ok=ok,
                )
            )

    final = keep["output_names"]
    recorded = [np.asarray(t.data) for t in keep["outputs"]]
    sources = [keep["trace"].value_of(t).node for t in keep["outputs"]]
    exposed = proto.SerializeToString()
    names, arrays, origins = (
        [r[0] for r in rows] + final,
        [r[2] for r in rows] + recorded,
        [r[1] for r in rows] + sources,
    )
    compare("optimisations off", names, arrays, origins, _session(ort, exposed, optimise=False), feeds)
    # Optimised with every intermediate exposed (ORT still fuses what keeps them), then as deployed.
    compare(
        "optimisations on, intermediates exposed", names, arrays, origins, _session(ort, exposed, optimise=True), feeds
    )
    compare("optimisations on", final, recorded, sources, _session(ort, model_bytes, optimise=True), feeds)
    if "arrays2" in keep:
        feeds2 = dict(zip(keep["input_names"], keep["arrays2"]))
        recorded2 = [np.asarray(t.data) for t in keep["outputs2"]]
        sizes = ", ".join(str(a.shape) for a in keep["arrays2"])
        compare(
            f"optimisations on, input sizes {sizes}",
            final,
            recorded2,
            sources,
            _session(ort, model_bytes, optimise=True),
            feeds2,
        )
    if "arrays3" in keep:
        feeds3 = dict(zip(keep["input_names"], keep["arrays3"]))
        compare(
            "optimisations on, a fresh random input of the example's sizes (EveryO eager)",
            final,
            keep["outputs3"],
            sources,
            _session(ort, model_bytes, optimise=True),
            feeds3,
        )
    return out


def check_agreement(model_bytes, keep):
    """Raise ``EveryOExportMismatchError`` naming the first value over tolerance."""
    rows = report(model_bytes, keep)
    bad = [r for r in rows if not r["ok"]]
    if bad:
        r = bad[0]
        raise EveryOExportMismatchError(
            f"ONNX Runtime disagrees with EveryO at value '{r['value']}' (from op '{r['op']}' at {r['line']}, "
            f"{r['run']}): max abs error {r['max_abs']:.3g}, max rel error {r['max_rel']:.3g}, over the "
            f"tolerance {TOLERANCE:g}; {len(bad)} of {len(rows)} compared values disagree. The file was not "
            f"written (an existing file at the path is left as it was)"
        )
    return rows


def format_report(rows: Iterable[Mapping[str, Any]]) -> str:
    """The report as a text table, one line per compared value."""
    lines = [f"{'node':<34} {'op':<14} {'max abs':>10} {'max rel':>10}  ok  run"]
    for r in rows:
        lines.append(
            f"{(r['node'] or r['value'])[:34]:<34} {r['op'][:14]:<14} {r['max_abs']:>10.3g} "
            f"{r['max_rel']:>10.3g}  {'yes' if r['ok'] else 'NO ':<3} {r['run']}"
        )
    return "\n".join(lines)
