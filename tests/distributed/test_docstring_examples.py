"""Every docstring example in everyo.distributed (and its TCP and MPI backends) runs as written (doctest)."""
import pytest

from everyo.testing import run_docstring_examples


@pytest.mark.parametrize("package", ["everyo.distributed", "everyo.distributed_tcp", "everyo.distributed_mpi"])
def test_distributed_docstring_examples_run_as_written(package):
    _, failures = run_docstring_examples(package)
    assert not failures, "\n\n".join(failures)
