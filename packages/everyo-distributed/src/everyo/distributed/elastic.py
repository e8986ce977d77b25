"""Elastic restart: a lost worker costs seconds, not the job.

Run the job with restarts and snapshots::

    spawn(worker, 2, max_restarts=3, snapshot_every=10)                  # shared memory
    python -m everyo.distributed.run --nproc 2 --max-restarts 3 --snapshot-every 10 train.py   # TCP

and let the worker ask for its state once its model, optimizer (and scaler,
sampler) exist::

    model = DistributedDataParallel(build_model(), group)
    optimizer = eo.SGD(model.parameters(), lr=0.05)
    state = elastic.state(model, optimizer, sampler=sampler)
    for step in range(state.step, steps):   # 0 on a fresh start, the snapshot's step after a restart
        ...                                 # the usual step: forward, backward, optimizer.step()

Every ``snapshot_every`` synchronized steps, the ``DistributedDataParallel``
wrapper saves, at the start of the next forward pass (after the optimizer
step), the model's state (parameters, buffers, random streams), the
optimizer's, the GradScaler's, the sampler's epoch and the process's global
random states (``numpy.random``'s and ``random``'s) into shared memory,
double-buffered, so that a worker killed while writing leaves the previous
snapshot intact. When a worker dies, the launcher stops the others at their
next collective and starts all of them again; :func:`state` then finds the
latest step every rank holds a complete snapshot of, and loads it: the run
continues exactly as if nothing had happened -- the same bits as an
uninterrupted run, as long as each step is a function of the state and the
step number (take the batch from ``step``, not from an iterator that was
running before).

Snapshots live in ``/dev/shm`` segments that the launcher (``spawn``, or
``python -m everyo.distributed.run``) owns and removes when the job ends;
they are written and read only by this machine's workers. Without those
launchers (or with ``snapshot_every=0``), :func:`state` returns ``step == 0``
and snapshots nothing, so the same script runs anywhere.
"""

from __future__ import annotations

import mmap
import os
import pickle
import random
import struct
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from everyo.distributed.ddp import DistributedDataParallel
    from everyo.distributed.sampler import DistributedSampler

__all__ = ["state", "ElasticState", "BASE_ENV", "EVERY_ENV", "RESTART_ENV", "snapshot_names", "remove_snapshots"]

#: The snapshot segments' name prefix, set by the launcher.
BASE_ENV = "EVERYO_ELASTIC_BASE"
#: Steps between snapshots (0: none), set by the launcher.
EVERY_ENV = "EVERYO_SNAPSHOT_EVERY"
#: How many times the job was restarted (torchrun's variable).
RESTART_ENV = "TORCHELASTIC_RESTART_COUNT"

_HEADER = struct.Struct("<qq")  # step (-1: being written), payload bytes
_SLOTS = 2


def snapshot_names(base: str, world_size: int) -> list[str]:
    """Every segment name the workers of a job may create under ``base`` (for the launcher's cleanup)."""
    return [f"{base}_r{rank}_{slot}" for rank in range(world_size) for slot in range(_SLOTS)]


def _posixshmem() -> Any:
    import _posixshmem  # type: ignore[import-not-found]  # CPython's module behind shared_memory; no stub

    return _posixshmem


def remove_snapshots(base: str, world_size: int) -> None:
    """Unlink every snapshot segment of the job (the launcher's cleanup); names already gone are skipped."""
    shm = _posixshmem()
    for name in snapshot_names(base, world_size):
        try:
            shm.shm_unlink(name)
        except FileNotFoundError:
            pass


class _Slot:
    """One snapshot buffer: a shared-memory segment that outlives the process that wrote it.

    Not registered with the resource tracker: a worker's tracker would unlink it when the worker
    dies, which is exactly when it is needed. The launcher unlinks it at the end of the job.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._shm = _posixshmem()
        self._map: mmap.mmap | None = None

    def _mapping(self, size: int = 0, create: bool = False) -> mmap.mmap | None:
        if self._map is not None and self._map.size() >= size:
            return self._map
        flags = os.O_RDWR | (os.O_CREAT if create else 0)
        try:
            fd = self._shm.shm_open(self.name, flags, mode=0o600)
        except FileNotFoundError:
            return None
        try:
            current = os.fstat(fd).st_size
            if current < max(size, _HEADER.size):
                if not create:
                    return None
                current = max(size, _HEADER.size) * 5 // 4  # room for a state that grows a little
                os.ftruncate(fd, current)
            if self._map is not None:
                self._map.close()
            self._map = mmap.mmap(fd, current)
        finally:
            os.close(fd)
        return self._map

    def step(self) -> int:
        buf = self._mapping()
        return -1 if buf is None else _HEADER.unpack_from(buf, 0)[0]

    def read(self) -> bytes:
        buf = self._mapping()
        assert buf is not None
        step, nbytes = _HEADER.unpack_from(buf, 0)
        return bytes(buf[_HEADER.size : _HEADER.size + nbytes])

    def write(self, step: int, payload: bytes) -> None:
        need = _HEADER.size + len(payload)
        buf = self._mapping(need, create=True)
        assert buf is not None
        _HEADER.pack_into(buf, 0, -1, 0)  # invalid while being written: a death here leaves it invalid
        buf[_HEADER.size : need] = payload
        _HEADER.pack_into(buf, 0, -1, len(payload))
        _HEADER.pack_into(buf, 0, step, len(payload))  # the step last: the slot is complete


class ElasticState:
    """What :func:`state` returns: ``step``, the step to start from, and the snapshotting behind it.

    ``step`` is 0 on a fresh start and the snapshot's step after a restart;
    ``restarts`` how many times the job was restarted; ``resumed`` whether a
    snapshot was loaded.
    """

    def __init__(
        self,
        model: DistributedDataParallel,
        optimizer: Any = None,
        *,
        scaler: Any = None,
        sampler: DistributedSampler | None = None,
        every: int | None = None,
    ) -> None:
        from everyo.distributed.ddp import DistributedDataParallel

        if not isinstance(model, DistributedDataParallel):
            raise TypeError(
                "elastic.state: model must be the DistributedDataParallel wrapper (it takes the snapshots), "
                f"got {type(model).__name__}"
            )
        self.model, self.optimizer, self.scaler, self.sampler = model, optimizer, scaler, sampler
        group = model.group
        base = os.environ.get(BASE_ENV, "")
        self.every = int(os.environ.get(EVERY_ENV, "0") or 0) if every is None else int(every)
        self.restarts = int(os.environ.get(RESTART_ENV, "0") or 0)
        self.step = 0
        self.resumed = False
        self._last = -1
        self._slots = [_Slot(f"{base}_r{group.rank}_{s}") for s in range(_SLOTS)] if base else []
        if self._slots and self.restarts > 0:
            self._resume()
        model._synced_steps = self.step
        if self._slots and self.every > 0:
            model._elastic = self

    def _resume(self) -> None:
        """Find the latest step every rank holds a complete snapshot of (one all_gather) and load it."""
        steps = np.array([slot.step() for slot in self._slots], np.int64)
        table = self.model.group.all_gather(steps)
        common = set(table[0].tolist())
        for row in table[1:]:
            common &= set(row.tolist())
        common.discard(-1)
        if not common:
            return  # no step every rank completed: start again from scratch (the same bits)
        step = max(common)
        slot = self._slots[int(np.nonzero(steps == step)[0][0])]
        snapshot = pickle.loads(slot.read())  # written by this job's own worker on this machine
        self.model.module.load_state_dict(snapshot["model"])
        if self.optimizer is not None:
            self.optimizer.load_state_dict(snapshot["optimizer"])
        if self.scaler is not None:
            self.scaler.load_state_dict(snapshot["scaler"])
        if self.sampler is not None and snapshot["sampler_epoch"] is not None:
            self.sampler.set_epoch(snapshot["sampler_epoch"])
        np.random.set_state(snapshot["numpy_random"])  # noqa: NPY002 - the global stream is what user code draws from
        random.setstate(snapshot["random"])
        self.step, self.resumed, self._last = step, True, step

    def snapshot(self, step: int) -> None:
        """Save the state as of ``step`` completed steps into the older of this rank's two slots."""
        if not self._slots:
            return
        snapshot = {
            "model": self.model.module.state_dict(),
            "optimizer": None if self.optimizer is None else self.optimizer.state_dict(),
            "scaler": None if self.scaler is None else self.scaler.state_dict(),
            "sampler_epoch": None if self.sampler is None else self.sampler.epoch,
            "numpy_random": np.random.get_state(),  # noqa: NPY002
            "random": random.getstate(),
        }
        payload = pickle.dumps(snapshot, protocol=5)
        steps = [slot.step() for slot in self._slots]
        self._slots[steps.index(min(steps))].write(step, payload)
        self._last = step

    def _on_forward(self, synced_steps: int) -> None:
        if synced_steps > self._last and synced_steps % self.every == 0:
            self.snapshot(synced_steps)

    def __repr__(self) -> str:
        return f"ElasticState(step={self.step}, resumed={self.resumed}, restarts={self.restarts}, every={self.every})"


def state(
    model: DistributedDataParallel,
    optimizer: Any = None,
    *,
    scaler: Any = None,
    sampler: DistributedSampler | None = None,
) -> ElasticState:
    """The training state to start from: ``state(model, optimizer, ...).step``.

    Call it on every rank (it may run one collective), after building the
    ``DistributedDataParallel`` wrapper, the optimizer and, if used, the
    ``GradScaler`` and the ``DistributedSampler``. After a restart it loads the
    latest snapshot every rank completed into them and returns its step;
    otherwise ``step`` is 0. From then on the wrapper snapshots every
    ``snapshot_every`` synchronized steps (as the launcher was told).

    Raises:
        TypeError: ``model`` is not a ``DistributedDataParallel``.
    """
    return ElasticState(model, optimizer, scaler=scaler, sampler=sampler)
