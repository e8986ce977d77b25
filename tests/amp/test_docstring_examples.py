"""Every docstring example in everyo.amp runs as written (doctest)."""
from everyo.testing import run_docstring_examples


def test_amp_docstring_examples_run_as_written():
    attempted, failures = run_docstring_examples("everyo.amp")
    assert attempted > 0
    assert not failures, "\n\n".join(failures)
