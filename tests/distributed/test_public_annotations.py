"""everyo.distributed's public API is annotated (mypy then checks the annotations: hatch run types:check)."""

import importlib

import pytest

from everyo.testing import unannotated_public_api


@pytest.mark.parametrize("name", ["everyo.distributed", "everyo.distributed_tcp", "everyo.distributed_mpi"])
def test_public_api_is_annotated(name):
    gaps = unannotated_public_api(importlib.import_module(name))
    assert gaps == [], f"{len(gaps)} gaps in {name}'s public annotations:\n" + "\n".join(gaps)
