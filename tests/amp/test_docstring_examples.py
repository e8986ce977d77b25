"""Every docstring example in everyo.amp runs as written (doctest)."""

from everyo.testing import run_docstring_examples


def test_amp_docstring_examples_run_as_written():
    attempted, failures = run_docstring_examples("everyo.amp")
    assert attempted > 0
    assert not failures, "\n\n".join(failures)


def test_every_name_in_amps_all_has_a_docstring():
    import importlib
    import inspect

    module = importlib.import_module("everyo.amp")
    missing = [
        n
        for n in module.__all__
        if callable(getattr(module, n))
        and not inspect.ismodule(getattr(module, n))
        and not ((getattr(module, n).__doc__ or "").strip())
    ]
    assert missing == []
