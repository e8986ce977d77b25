"""How many BLAS threads each worker gets.

A BLAS reads its thread count from the environment once, when NumPy loads it,
so the only place to set it for a worker is the environment the worker starts
with. ``spawn`` does that: with no thread variable set by the user, every
worker gets ``max(1, cores // world_size)`` threads through all the usual
variables. When the user set one, it is left alone, and a warning says so if
``threads x workers`` still exceeds the cores (the spec's measurement: four
workers took 1.8 s with ``OMP_NUM_THREADS=1`` and 11.0 s without).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

__all__ = ["THREAD_VARIABLES", "available_cores", "worker_thread_env"]

# In the order a BLAS gives them precedence (OpenBLAS reads its own variable
# before OMP_NUM_THREADS; MKL likewise).
THREAD_VARIABLES = (
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "BLIS_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "OMP_NUM_THREADS",
)


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity, which containers restrict)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def worker_thread_env(
    world_size: int, environ: Mapping[str, str] = os.environ, cores: int | None = None
) -> tuple[dict[str, str], str | None]:
    """Return ``(variables to set for the workers, warning or None)``.

    Nothing is set when the user set any of :data:`THREAD_VARIABLES`; then the
    effective count is the highest-precedence variable's value, and the warning
    is returned only if ``count * world_size > cores``. With nothing set, each
    worker gets ``max(1, cores // world_size)``; the only remaining
    oversubscription is more workers than cores, which is warned about too.
    """
    cores = available_cores() if cores is None else cores
    user_set = [name for name in THREAD_VARIABLES if environ.get(name, "").strip()]
    if not user_set:
        per_worker = max(1, cores // world_size)
        updates = {name: str(per_worker) for name in THREAD_VARIABLES}
        warning = None
        if world_size > cores:
            warning = _time_share(world_size, cores)
        return updates, warning
    name = user_set[0]
    try:
        per_worker = int(environ[name])
    except ValueError:
        return {}, f"spawn: {name}={environ[name]!r} is not an integer; BLAS thread count unknown"
    if per_worker * world_size > cores and per_worker <= 1:
        return {}, _time_share(world_size, cores)
    if per_worker * world_size > cores:
        return {}, (
            f"spawn: {name}={per_worker} with {world_size} workers asks for "
            f"{per_worker * world_size} threads on {cores} cores; the workers' BLAS thread pools "
            f"will fight over the cores. Unset it (spawn then gives each worker "
            f"{max(1, cores // world_size)}) or set it to {max(1, cores // world_size)}."
        )
    return {}, None


def _time_share(world_size: int, cores: int) -> str:
    return (
        f"spawn: {world_size} workers on {cores} cores: each has one BLAS thread, "
        "but the workers themselves time-share the cores, so expect no speedup beyond "
        f"{cores} workers"
    )
