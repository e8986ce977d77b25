"""The global random state: ``eo.manual_seed``, and generator states as arrays.

Every draw EveryO makes without an explicit ``seed=`` (a layer's default
initialisation, a Dropout or DataLoader built without ``seed=``, ``eo.randn``)
takes its generator from one process-wide ``numpy.random.Generator`` here.
Each such object gets its *own* child generator, seeded by one draw from the
global one at construction, so after ``eo.manual_seed(n)`` the same program
builds the same weights and later makes the same Dropout masks and shuffles,
while two Dropout layers still draw different masks.

``seed=`` keeps its 0.1 meaning: ``numpy.random.default_rng(seed)``, the same
numbers as before, independent of the global state.

Until ``manual_seed`` is called, the global generator is seeded from the
operating system's entropy (as ``numpy.random.default_rng()`` is), so nothing
is reproducible by accident. ``np.random.seed`` does not affect EveryO.

A generator's state is stored as a ``uint64`` array (see :func:`generator_state`),
so it fits in a ``state_dict`` and in ``eo.save`` checkpoints.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from everyo.errors import EveryOStateDictError

if TYPE_CHECKING:
    from numpy.typing import ArrayLike, NDArray

__all__ = [
    "manual_seed",
    "get_rng_state",
    "set_rng_state",
    "default_generator",
    "generator_for",
    "generator_state",
    "set_generator_state",
]

_MASK64 = (1 << 64) - 1
# Layout of a PCG64 state as uint64 words: 128-bit state and increment, the
# buffered-uint32 flag and the buffered value (so a resumed stream continues
# exactly, even after an odd number of 32-bit draws).
_PCG_WORDS = 6
_PCG_KINDS = ("PCG64", "PCG64DXSM")

_global: np.random.Generator | None = None


def default_generator() -> np.random.Generator:
    """The process-wide generator that unseeded draws come from."""
    global _global
    if _global is None:
        _global = np.random.default_rng()
    return _global


def manual_seed(n: int) -> np.random.Generator:
    """Seed the global generator: every later default initialisation, Dropout
    mask and DataLoader shuffle (of objects built without ``seed=``) is
    reproducible. Returns the global generator.

    Examples:
        >>> _ = eo.manual_seed(0)
        >>> a = eo.Linear(4, 2).weight.data
        >>> _ = eo.manual_seed(0)
        >>> bool((eo.Linear(4, 2).weight.data == a).all())
        True
    """
    global _global
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise ValueError(f"eo.manual_seed needs a non-negative integer, got {n!r}")
    _global = np.random.default_rng(int(n))
    return _global


def generator_for(seed: int | np.random.Generator | None = None) -> np.random.Generator:
    """A generator for one layer, loader or call.

    With ``seed`` given: ``numpy.random.default_rng(seed)``, as in 0.1. Without:
    a child of the global generator (one 63-bit draw seeds it), so
    :func:`manual_seed` makes it reproducible.
    """
    if seed is not None:
        return np.random.default_rng(seed)
    return np.random.default_rng(int(default_generator().integers(2**63)))


def generator_state(rng: np.random.Generator, what: str = "generator") -> NDArray[np.uint64]:
    """The state of ``rng`` (a PCG64 ``numpy.random.Generator``) as a uint64 array of 6 words."""
    bits = rng.bit_generator
    state = bits.state
    if state.get("bit_generator") not in _PCG_KINDS:
        raise EveryOStateDictError(
            f"{what}: cannot save the state of a {state.get('bit_generator')} generator; "
            f"EveryO saves PCG64 generators (numpy.random.default_rng)"
        )
    s, inc = state["state"]["state"], state["state"]["inc"]
    words = [s >> 64, s & _MASK64, inc >> 64, inc & _MASK64, state["has_uint32"], state["uinteger"]]
    return np.array(words, dtype=np.uint64)


def check_generator_state(array: ArrayLike, what: str = "generator") -> NDArray[np.uint64]:
    """Validate a saved state (from :func:`generator_state`); returns it as a uint64 array."""
    arr = np.asarray(array)
    if arr.shape != (_PCG_WORDS,) or arr.dtype != np.uint64:
        raise EveryOStateDictError(
            f"{what}: a generator state is a uint64 array of shape ({_PCG_WORDS},), "
            f"got {arr.dtype} of shape {arr.shape}"
        )
    if int(arr[4]) not in (0, 1) or int(arr[3]) % 2 == 0:
        raise EveryOStateDictError(f"{what}: not a PCG64 state (the increment must be odd, the flag 0 or 1)")
    return arr


def set_generator_state(rng: np.random.Generator, array: ArrayLike, what: str = "generator") -> np.random.Generator:
    """Restore ``rng`` to a state saved by :func:`generator_state` (validated first)."""
    arr = check_generator_state(array, what)
    words = [int(w) for w in arr]
    rng.bit_generator.state = {
        "bit_generator": rng.bit_generator.state["bit_generator"],
        "state": {"state": (words[0] << 64) | words[1], "inc": (words[2] << 64) | words[3]},
        "has_uint32": words[4],
        "uinteger": words[5],
    }
    return rng


def get_rng_state() -> NDArray[np.uint64]:
    """The global generator's state, a uint64 array (save it with ``eo.save``)."""
    return generator_state(default_generator(), "eo.get_rng_state")


def set_rng_state(state: ArrayLike) -> None:
    """Restore the global generator from :func:`get_rng_state`'s array."""
    set_generator_state(default_generator(), state, "eo.set_rng_state")
