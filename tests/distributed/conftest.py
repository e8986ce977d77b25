"""Shared fixtures for the distributed tests: every test must leave nothing behind.

``no_leftovers`` (used by the shared-memory tests through ``pytestmark``) fails a test that leaves a child process or a
shared-memory segment created by this process in /dev/shm. Only segments
carrying this process's pid are checked, so other test runs on the same
machine cannot make it flaky.
"""

import multiprocessing
import os

import pytest


def own_segments():
    prefix = f"everyo_{os.getpid()}_"
    try:
        return sorted(name for name in os.listdir("/dev/shm") if name.startswith(prefix))
    except FileNotFoundError:
        return []


@pytest.fixture
def no_leftovers():
    before = own_segments()
    yield
    assert own_segments() == before, "a shared-memory segment was left in /dev/shm"
    assert multiprocessing.active_children() == [], "a worker process was left running"
