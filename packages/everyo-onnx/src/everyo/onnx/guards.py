"""Guards: the conditions on input sizes an exported graph needs.

An ``assert`` on a traced size in ``forward`` (nanoGPT's
``assert t <= block_size``) does not stop the export: the graph is right
whenever the assert holds, so the exporter records it as a guard. Guards
are written into the file (model metadata ``everyo.guards``, a JSON list,
and the model's doc string) so that whatever runs the file can check them:
:func:`read_guards` gives them back, :meth:`Guard.holds` checks one against
the sizes of the inputs at hand, :func:`check_guards` checks all of them
against a set of inputs and raises naming the first that fails.

A guard is stored as a small expression tree over the file's named dynamic
axes: ``["<=", ["dim", "seq"], 8]``; operators ``+ - * // %`` and ``neg``,
comparisons ``< <= > >= == !=``. A guard on a size that could not be tied
to one named input axis keeps its text and line but no tree (``expr`` is
None): it is listed, not checked.
"""

from __future__ import annotations

import json
import operator
from typing import TYPE_CHECKING, Any

from everyo.errors import EveryOShapeError

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    import onnx

#: The model metadata key holding the guards (a JSON list of objects with text, line, expr).
GUARDS_KEY = "everyo.guards"

_OPS = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "//": operator.floordiv,
    "%": operator.mod,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
    "==": operator.eq,
    "!=": operator.ne,
}


class Guard:
    """One condition on input sizes, from an ``assert`` in the model's code.

    Attributes:
        text: the condition with the file's axis names, e.g. ``seq <= 8``.
        line: the assert's source line when the model was exported.
        expr: the condition as a JSON tree (see the module docstring), or None
            when it could not be tied to named input axes.
    """

    __slots__ = ("text", "line", "expr")

    def __init__(self, text: str, line: str, expr: Any) -> None:
        self.text, self.line, self.expr = text, line, expr

    def holds(self, sizes: Mapping[str, int]) -> bool | None:
        """Whether the condition holds for ``{axis name: size}``; None if it cannot be checked."""
        if self.expr is None:
            return None
        return bool(_evaluate(self.expr, sizes))

    def as_dict(self) -> dict[str, Any]:
        """The JSON form stored in the file."""
        return {"text": self.text, "line": self.line, "expr": self.expr}

    def __repr__(self) -> str:
        return f"Guard({self.text!r} from {self.line})"


def _evaluate(expr, sizes):
    if isinstance(expr, int):
        return expr
    op = expr[0]
    if op == "dim":
        return int(sizes[expr[1]])
    if op == "neg":
        return -_evaluate(expr[1], sizes)
    return _OPS[op](_evaluate(expr[1], sizes), _evaluate(expr[2], sizes))


def read_guards(model: onnx.ModelProto | str) -> list[Guard]:
    """The guards stored in an exported model (a ModelProto or a file path); [] if none."""
    if isinstance(model, str) or hasattr(model, "__fspath__"):
        import onnx

        model = onnx.load(str(model), load_external_data=False)
    for prop in model.metadata_props:
        if prop.key == GUARDS_KEY:
            return [Guard(g["text"], g["line"], g["expr"]) for g in json.loads(prop.value)]
    return []


def input_sizes(model: onnx.ModelProto, inputs: Mapping[str, Any]) -> dict[str, int]:
    """``{axis name: size}`` for the named dynamic axes of ``model``'s graph
    inputs, read from ``inputs`` (``{input name: array}``)."""
    sizes: dict[str, int] = {}
    for value in model.graph.input:
        if value.name not in inputs:
            continue
        shape = getattr(inputs[value.name], "shape", ())
        for k, d in enumerate(value.type.tensor_type.shape.dim):
            if d.dim_param and k < len(shape):
                sizes.setdefault(d.dim_param, int(shape[k]))
    return sizes


def check_guards(guards: Sequence[Guard], sizes: Mapping[str, int]) -> None:
    """Raise ``EveryOShapeError`` naming the first guard that ``sizes`` break."""
    for guard in guards:
        if guard.holds(sizes) is False:
            raise EveryOShapeError(
                f"the exported model needs {guard.text} (the assert at {guard.line} when it was exported), "
                f"but the inputs have {', '.join(f'{k}={v}' for k, v in sorted(sizes.items()))}; pass inputs "
                f"that satisfy it (the graph's result would not be the model's otherwise)"
            )


def _tree(x, name_of):
    """A SymInt as a JSON tree over axis names (``name_of(value, axis)``), or None."""
    from everyo.onnx.symbolic import _ARITHMETIC, SymInt

    if not isinstance(x, SymInt):
        return int(x)
    e = x.expr
    if e[0] == "dim":
        name = name_of(e[1], e[2])
        return None if name is None else ["dim", name]
    parts = [_tree(p, name_of) for p in e[1:]]
    if any(p is None for p in parts):
        return None
    return ["neg", parts[0]] if e[0] == "neg" else [_ARITHMETIC[e[0]][0], *parts]


def make_guards(decisions, name_of):  # (internal: the exporter's Decision objects)
    """Guards from the exporter's assert decisions; ``name_of(value, axis)``
    names the dynamic axis a traced size is (or None)."""
    from everyo.onnx.symbolic import _COMPARISONS

    out, seen = [], set()
    for d in decisions:
        c = d.condition
        text = c.text(name_of)
        if (text, d.line) in seen:
            continue
        seen.add((text, d.line))
        left, right = _tree(c.left, name_of), _tree(c.right, name_of)
        expr = None if left is None or right is None else [_COMPARISONS[c.op][0], left, right]
        out.append(Guard(text, d.line, expr))
    return out


__all__ = ["Guard", "GUARDS_KEY", "read_guards", "input_sizes", "check_guards"]
