"""Every docstring example in everyo.onnx runs as written (doctest)."""
from everyo.testing import run_docstring_examples


def test_onnx_docstring_examples_run_as_written():
    _, failures = run_docstring_examples("everyo.onnx")
    # every example of everyo.onnx writes or reads a file, so they are code blocks; this catches new ones
    assert not failures, "\n\n".join(failures)
