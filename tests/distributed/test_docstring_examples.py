"""Every docstring example in everyo.distributed (and its TCP and MPI backends) runs as written (doctest)."""

import pytest

from everyo.testing import run_docstring_examples, undocumented_public_api


@pytest.mark.parametrize("package", ["everyo.distributed", "everyo.distributed_tcp", "everyo.distributed_mpi"])
def test_distributed_docstring_examples_run_as_written(package):
    _, failures = run_docstring_examples(package)
    assert not failures, "\n\n".join(failures)


def test_every_name_in_distributeds_all_has_a_docstring():
    import importlib

    assert undocumented_public_api(importlib.import_module("everyo.distributed")) == []
