"""tests/kernels: everyo-kernels against core's NumPy paths.

In the matrix's ``kernels`` cell (EVERYO_TEST_CELL=kernels) the package must be
installed and its kernels active: a missing or broken numba fails the cell
instead of skipping it. Run elsewhere without the package, these tests skip.
"""

import os

import pytest

from everyo import kernel_table

CELL = os.environ.get("EVERYO_TEST_CELL")


@pytest.fixture(scope="session", autouse=True)
def _kernels_present():
    status = kernel_table.kernels()
    if not status.enabled:
        if CELL == "kernels":
            pytest.fail(f"the kernels cell runs without compiled kernels: {status.reason}")
        pytest.skip(f"no compiled kernels here: {status.reason}")


def count_calls(monkeypatch, names):
    """Wrap the named kernels so a test can see they really ran; returns name -> calls."""
    calls = dict.fromkeys(names, 0)
    table = dict(kernel_table._table)

    def counted(name):
        fn = table[name]

        def run(*args):
            calls[name] += 1
            return fn(*args)

        return run

    monkeypatch.setattr(kernel_table, "_table", {**table, **{n: counted(n) for n in names}})
    return calls
