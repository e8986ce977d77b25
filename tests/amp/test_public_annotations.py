"""everyo.amp's public API is annotated (mypy then checks the annotations: hatch run types:check)."""

import importlib

from everyo.testing import unannotated_public_api


def test_public_api_is_annotated():
    gaps = unannotated_public_api(importlib.import_module("everyo.amp"))
    assert gaps == [], f"{len(gaps)} gaps in everyo.amp's public annotations:\n" + "\n".join(gaps)
