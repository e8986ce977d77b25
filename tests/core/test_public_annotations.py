"""Core's public API is annotated (mypy then checks the annotations: hatch run types:check)."""

import importlib

import pytest

from everyo.testing import unannotated_public_api

MODULES = [
    "everyo",
    "everyo.nn",
    "everyo.optim",
    "everyo.optim.lr_scheduler",
    "everyo.data",
    "everyo.io",
    "everyo.testing",
    "everyo.autograd",
    "everyo.dispatch",
    "everyo.random",
]


@pytest.mark.parametrize("name", MODULES)
def test_public_api_is_annotated(name):
    gaps = unannotated_public_api(importlib.import_module(name))
    assert gaps == [], f"{len(gaps)} gaps in {name}'s public annotations:\n" + "\n".join(gaps)


def test_the_check_finds_a_missing_annotation():
    import types

    module = types.ModuleType("everyo.fake")

    def annotated(x: int) -> int:
        return x

    def bare(x, y: int):
        return x

    class Thing:
        def method(self, a: int) -> None: ...

        @property
        def value(self):
            return 1

    for obj in (annotated, bare, Thing):
        obj.__module__ = "everyo.fake"
    module.annotated, module.bare, module.Thing = annotated, bare, Thing
    module.__all__ = ["annotated", "bare", "Thing"]
    assert unannotated_public_api(module) == [
        "bare: parameter 'x' has no annotation",
        "bare: no return annotation",
        "Thing.value: no return annotation",
    ]
