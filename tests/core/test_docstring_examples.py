"""Every docstring example in everyo-core runs as written (doctest)."""

from everyo.testing import run_docstring_examples

ADDONS = ("everyo.amp", "everyo.onnx", "everyo.distributed", "everyo.distributed_tcp", "everyo.distributed_mpi")


def test_core_docstring_examples_run_as_written():
    attempted, failures = run_docstring_examples("everyo", skip=ADDONS)
    assert attempted > 0
    assert not failures, "\n\n".join(failures)
