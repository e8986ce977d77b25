"""Shared fixtures of the amp cell."""

import pytest


@pytest.fixture
def numpy_conversions():
    """Core's own float16 conversions for the test (no outside converter).

    Tests that count memory with tracemalloc need it: tracemalloc sees only
    what NumPy allocates, and the arrays everyo-amp's onnxruntime converter
    returns live in onnxruntime's memory, so with it installed those tests
    would count too little and could not fail. The arrays kept are the same
    either way. For the same reason core's recycling of large results
    (everyo._buffers) is suspended: a recycled buffer is no new allocation."""
    import everyo.amp  # noqa: F401  (imported first: its import installs the converter when none is set)
    import everyo.half as half
    from everyo import _buffers

    previous = half.set_cast_kernel(None)
    with _buffers.suspended():
        yield
    half.set_cast_kernel(previous)
