"""Every docstring example in everyo.amp runs as written (doctest)."""

from everyo.testing import run_docstring_examples, undocumented_public_api


def test_amp_docstring_examples_run_as_written():
    attempted, failures = run_docstring_examples("everyo.amp")
    assert attempted > 0
    assert not failures, "\n\n".join(failures)


def test_every_name_in_amps_all_has_a_docstring():
    import importlib

    assert undocumented_public_api(importlib.import_module("everyo.amp")) == []
