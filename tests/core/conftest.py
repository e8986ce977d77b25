"""The Python 3.11 core cell runs the torch-comparing tests: fail there, never skip.

hatch.toml installs torch 2.13.0 (CPU) in that cell and sets
EVERYO_REQUIRE_TORCH=1. Tests that compare with PyTorch use
``pytest.importorskip("torch")``, which elsewhere skips them; in that cell a
torch that cannot be imported stops the whole run at the start instead, so a
broken install cannot turn the comparisons into silent skips.
"""

import os

import pytest


def pytest_sessionstart(session: pytest.Session) -> None:
    if os.environ.get("EVERYO_REQUIRE_TORCH") != "1":
        return
    try:
        import torch  # noqa: F401
    except Exception as exc:  # ImportError, or a broken binary's OSError
        pytest.exit(
            f"EVERYO_REQUIRE_TORCH=1 (the Python 3.11 core cell) but torch cannot be imported: {exc!r}; "
            "the torch-comparing tests would be skipped. hatch.toml installs torch==2.13.0 there "
            "(uv must see the CPU wheel: see tools/test_matrix.py)",
            returncode=1,
        )
