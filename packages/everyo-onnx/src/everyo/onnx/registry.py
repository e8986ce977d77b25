"""The one table of translation rules: op name (``everyo.dispatch.OPS``) ->
``rule(translator, node)``. The rule modules (rules, recurrent_rules,
loss_rules, reduction_rules, indexing_rules, layer_rules) all register here;
importing :mod:`everyo.onnx.rules` imports every one of them."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

    from everyo.onnx.trace import Node
    from everyo.onnx.translate import Translator

    Rule = Callable[[Translator, Node], object]

RULES: dict[str, Rule] = {}


def rule(*names: str) -> Callable[[Rule], Rule]:
    """Decorator: register the function as the rule of each op in ``names``."""

    def register(fn: Rule) -> Rule:
        for name in names:
            if name in RULES:
                raise ValueError(f"two ONNX rules for op {name!r}: {RULES[name].__module__} and {fn.__module__}")
            RULES[name] = fn
        return fn

    return register
