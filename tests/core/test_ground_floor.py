"""Core's ground floor imports nothing above it.

``tensor``, ``autograd``, ``dispatch``, ``casting``, ``half`` and ``_typing``
are the floor every op stands on. Read from their source (AST), each imports
at run time (module level or inside a function) only the modules listed
below it in ``FLOORS``; the floors above (``low_precision``, the ops, ``nn``,
the other packages) hand what the ground needs down through
``dispatch.bind_tensor``, ``bind_float32_route`` and ``bind_snapshot_check``.
Imports under ``if TYPE_CHECKING:`` obey the same order: a type checker reads
them, and so does a reader. Where ``dispatch`` and ``autograd`` annotate a
tensor, they name ``everyo._typing.AnyTensor``, the protocol that
``everyo.tensor.Tensor`` meets (mypy checks it at every call from tensor.py).

Before this test (issue 24), ``dispatch`` imported ``low_precision``,
``tensor`` and ``autograd`` inside functions, ``autograd`` imported
``tensor``: an 8-file import circle with ``half``, ``casting``, ``axes`` and
``_typing``. The annotations alone (``_typing``, ``dispatch`` and
``autograd`` naming ``everyo.tensor.Tensor``) still closed a 7-file one.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import everyo

SRC = Path(everyo.__file__).parent

# Bottom first: a module may import (at run time) only modules before it.
FLOORS = (
    "errors",
    "_typing",
    "kernel_table",
    "_passes",
    "_buffers",
    "random",
    "axes",
    "half",
    "casting",
    "dispatch",
    "autograd",
    "tensor",
)
GROUND = ("_typing", "half", "casting", "dispatch", "autograd", "tensor")


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _everyo_modules(node: ast.AST) -> set[str]:
    """The everyo modules one import statement names (``from everyo import a, b``
    names ``everyo.a`` and ``everyo.b``)."""
    names: set[str] = set()
    if isinstance(node, ast.Import):
        names |= {a.name for a in node.names if a.name.split(".")[0] == "everyo"}
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        if node.module == "everyo":
            names |= {f"everyo.{a.name}" for a in node.names}
        elif node.module.startswith("everyo."):
            names.add(node.module)
    return names


def imports_of(module: str) -> tuple[set[str], set[str]]:
    """(run-time imports, TYPE_CHECKING-only imports) of ``everyo.<module>``,
    as module names under everyo (``everyo.amp.x`` stays ``amp.x``)."""
    tree = ast.parse((SRC / f"{module}.py").read_text(encoding="utf-8"))
    typing_only: set[ast.AST] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for inner in node.body:
                typing_only |= set(ast.walk(inner))
    run: set[str] = set()
    typed: set[str] = set()
    for node in ast.walk(tree):
        found = {name.removeprefix("everyo.") for name in _everyo_modules(node)}
        (typed if node in typing_only else run).update(found)
    return run, typed


@pytest.mark.parametrize("module", GROUND)
def test_ground_floor_imports_only_below_it(module):
    run, typed = imports_of(module)
    below = set(FLOORS[: FLOORS.index(module)])
    assert run <= below, f"everyo.{module} imports {sorted(run - below)} at run time: above it (see FLOORS)"
    assert typed <= below, f"everyo.{module} names {sorted(typed - below)} for typing: above it (see FLOORS)"


def test_the_floors_above_bind_what_the_ground_needs():
    from everyo import autograd, dispatch, low_precision
    from everyo.tensor import Tensor

    assert dispatch._tensor_type() is Tensor
    assert dispatch._float32_route == (low_precision.low_precision_operands, low_precision.call_in_float32)
    assert dispatch._snapshots_on is autograd._recording_snapshots


def test_the_reader_sees_a_lazy_import():
    # The check must catch an import inside a function, the way the circle hid.
    source = "def f():\n    from everyo import low_precision\n"
    assert _everyo_modules(ast.parse(source).body[0].body[0]) == {"everyo.low_precision"}
