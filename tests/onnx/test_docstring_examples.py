"""Every docstring example in everyo.onnx runs as written (doctest)."""

from everyo.testing import run_docstring_examples, undocumented_public_api


def test_onnx_docstring_examples_run_as_written():
    _, failures = run_docstring_examples("everyo.onnx")
    # every example of everyo.onnx writes or reads a file, so they are code blocks; this catches new ones
    assert not failures, "\n\n".join(failures)


def test_every_name_in_onnxs_all_has_a_docstring():
    import importlib

    assert undocumented_public_api(importlib.import_module("everyo.onnx")) == []
