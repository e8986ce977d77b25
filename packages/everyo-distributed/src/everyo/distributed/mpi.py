"""A process group on MPI (mpi4py): the engine for clusters.

Launch every rank with MPI's own launcher and build the group from the
communicator; ``average_gradients`` and the training loop do not change::

    mpiexec -n 4 python train.py

    from everyo.distributed_mpi import init_mpi_process_group
    group = init_mpi_process_group()          # MPI.COMM_WORLD
    ...   # average_gradients(model.parameters(), group) every step

Everything moves through mpi4py's buffer methods (``Allreduce``, ``Bcast``,
``Allgather``) on NumPy arrays -- never the lowercase, pickle-based ones.
Reductions are the other backends' algorithm on MPI's transport: an
``Alltoallv`` hands rank ``r`` everybody's ``r``-th block, rank ``r`` reduces
it with :func:`~everyo.distributed.reduce_in_rank_order` (float64, ranks in
order 0, 1, 2, ..., rounded once), and an ``Allgatherv`` shares the blocks --
so the bits equal the shared-memory and TCP groups' for any number of ranks,
and each rank moves what a ring would. Two ranks' float32/float64 all-reduce
is one native ``Allreduce``, which provably gives the same bits. Broadcast and
all-gather are ``Bcast`` and ``Allgather`` on the arrays' bytes.

Needs the ``mpi`` extra: ``pip install everyo-distributed[mpi]`` (mpi4py and
the mpich wheel).
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from everyo.distributed.protocol import (
    CollectiveRecord,
    ProcessGroup,
    check_records,
    reduce_in_rank_order,
    split_blocks,
)
from everyo.errors import EveryODistributedError

if TYPE_CHECKING:
    from types import ModuleType

__all__ = ["init_mpi_process_group", "MPIProcessGroup", "find_mpiexec"]

# mpi4py is an optional dependency (absent where the types are checked), so its
# communicators are typed Any here: an mpi4py.MPI.Comm.

_NATIVE_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
# How long a rank with an uncaught exception waits, after writing its traceback,
# before aborting the job (see _install_abort_hook).
_ABORT_GRACE_SECONDS = 0.5
_INSTALL_HINT = (
    "everyo.distributed_mpi needs mpi4py and an MPI library. Install them with: "
    "pip install everyo-distributed[mpi]   (or: pip install mpi4py mpich)"
)


def _mpi():
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise ImportError(_INSTALL_HINT) from exc
    return MPI


def find_mpiexec() -> str | None:
    """Path of the ``mpiexec`` to launch with, or ``None``.

    The one beside the running Python comes first: the mpich wheel installs its
    launcher into the virtual environment's ``bin``, which need not be on PATH.
    """
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return beside if os.path.exists(beside) else shutil.which("mpiexec")


def init_mpi_process_group(comm: Any = None, *, abort_on_exception: bool = True) -> MPIProcessGroup:
    """Return a process group over ``comm`` (default ``MPI.COMM_WORLD``).

    The group works on a duplicate of ``comm``, so its collectives never
    interleave with the caller's own MPI calls on ``comm``. Every rank of
    ``comm`` must call this (it is collective).

    ``abort_on_exception`` (default True): an exception that nothing catches
    on any rank prints its traceback, waits half a second so the launcher
    forwards it, and then calls ``MPI.COMM_WORLD.Abort``, so the whole job
    ends at once, however it was launched. Without it, the
    failed rank's interpreter waits in ``MPI_Finalize`` for peers that wait in
    a collective for it: a plain ``mpiexec -n 2 python train.py`` hangs
    (``python -m mpi4py train.py`` aborts, which is what this does). It wraps
    ``sys.excepthook`` once per process, keeping the previous hook.

    Raises:
        ImportError: mpi4py is not installed (the message gives the pip command).
    """
    MPI = _mpi()
    if comm is None:
        comm = MPI.COMM_WORLD
    if not isinstance(comm, MPI.Comm) or comm == MPI.COMM_NULL:
        raise TypeError(f"init_mpi_process_group: comm must be an mpi4py communicator, got {comm!r}")
    if abort_on_exception:
        _install_abort_hook(MPI)
    group = MPIProcessGroup(comm.Dup(), MPI)
    _unlink_mpich_segments(group.comm)
    return group


_MPICH_SHM = "/dev/shm/mpich_shm_"


def _unlink_mpich_segments(comm: Any) -> None:
    """Unlink MPICH's intranode shared-memory segment once every rank has it mapped.

    MPICH creates ``/dev/shm/mpich_shm_*`` (2 MB) in ``MPI_Init`` and unlinks it
    only in ``MPI_Finalize``, so a job that ends in ``MPI_Abort``, ``os._exit``
    or a signal leaves it behind (there is no orderly abort path in MPICH that
    removes it). Once every rank has mapped it -- after the barrier below --
    the name is no longer needed: unlinking it now, like an open temporary
    file, leaves the mappings working and nothing in /dev/shm however the job
    ends. MPICH's own unlink at finalize then finds it gone, which it ignores.
    ``EVERYO_MPI_KEEP_SHM=1`` keeps it (for a program that spawns MPI processes
    later, which would attach by name).
    """
    comm.Barrier()  # every rank of the group (each node's local ranks among them) has mapped it
    if os.environ.get("EVERYO_MPI_KEEP_SHM") == "1":
        return
    try:
        with open("/proc/self/maps") as maps:
            names = {line.split()[5] for line in maps if _MPICH_SHM in line and len(line.split()) >= 6}
    except OSError:
        return  # not Linux: nothing known to clean
    for name in names:
        try:
            os.unlink(name)
        except OSError:
            pass  # another local rank unlinked it first


def _install_abort_hook(MPI: ModuleType) -> None:
    previous = sys.excepthook
    if getattr(previous, "_everyo_mpi_abort", False):
        return

    def abort_job(kind: Any, value: Any, tb: Any) -> None:
        try:
            previous(kind, value, tb)  # the traceback first, while stderr still works
            sys.stderr.write(
                f"everyo.distributed_mpi: uncaught {kind.__name__} on rank "
                f"{MPI.COMM_WORLD.Get_rank()}: aborting the MPI job (MPI.COMM_WORLD.Abort)\n"
            )
            sys.stderr.flush()
            # The launcher forwards each rank's output through a pipe of its
            # own and stops forwarding when the job aborts: without a pause,
            # all but the traceback's first line can be lost (seen with MPICH's
            # mpiexec under load). Only a failing rank ever waits here.
            time.sleep(_ABORT_GRACE_SECONDS)
        finally:
            MPI.COMM_WORLD.Abort(1)

    abort_job._everyo_mpi_abort = True  # type: ignore[attr-defined]  # a mark on the function object
    sys.excepthook = abort_job


def _bytes(array: np.ndarray) -> np.ndarray:
    """A flat uint8 view: MPI moves bytes, whatever the dtype (bool and bfloat16 included)."""
    return array.reshape(-1).view(np.uint8)


class MPIProcessGroup(ProcessGroup):
    """One rank's handle on an MPI communicator; returned by :func:`init_mpi_process_group`.

    Before moving data, every collective exchanges a 64-byte description of
    the call (:class:`~everyo.distributed.CollectiveRecord`, one ``Allgather``)
    so that ranks calling different collectives, or passing arrays of different
    sizes or dtypes, get an :class:`~everyo.errors.EveryODistributedError`
    naming them instead of a hang or silently mixed data.
    """

    def __init__(self, comm: Any, MPI: ModuleType) -> None:
        super().__init__(comm.Get_rank(), comm.Get_size())
        self._comm, self._MPI = comm, MPI
        self._records = np.empty((self._world_size, CollectiveRecord.PACKED_SIZE), np.uint8)

    @property
    def comm(self) -> Any:
        """The group's own (duplicated) communicator."""
        return self._comm

    def _close(self) -> None:
        """Free the group's communicator."""
        comm, self._comm = self._comm, None
        if comm is not None and not self._MPI.Is_finalized():
            comm.Free()

    def _barrier(self, record: CollectiveRecord) -> None:
        self._agree(record)  # an Allgather completes only once every rank joined

    def _broadcast(self, record, data, root):
        self._agree(record)
        out = data.reshape(-1).copy() if self._rank == root else np.empty(data.size, data.dtype)
        if out.size:
            self._comm.Bcast(_bytes(out), root=root)
        return out

    def _all_gather(self, record, data):
        self._agree(record)
        out = np.empty((self._world_size, data.size), data.dtype)
        if data.size:
            self._comm.Allgather(_bytes(data), _bytes(out))
        return out

    def _reduce_scatter(self, record, data, op, blocks):
        self._agree(record)
        return self._scatter_reduce(data.reshape(-1), op, blocks)

    def _all_reduce(self, record, data, op):
        self._agree(record)
        flat = data.reshape(-1)
        if self._world_size == 2 and data.dtype in _NATIVE_DTYPES and data.size:
            # Two ranks: one IEEE addition in the input dtype gives the same bits as the float64
            # path (rounding twice is innocuous when 53 >= 2p + 2; see reduce_in_rank_order).
            out = np.empty(flat.shape, data.dtype)
            self._comm.Allreduce(flat, out, op=self._MPI.SUM)
            if op == "sum":
                return out
            # Mean: halve the rounded sum. If the sum was exact, multiplying by 0.5 rounds the exact
            # half once. If it was rounded, its magnitude is at least 2**-125 (smaller sums of
            # float32 values are exact), so halving is exact and commutes with the rounding. Only an
            # overflow to inf differs: then take the general path. Every rank holds the same `out`, so
            # every rank takes the same branch.
            np.multiply(out, 0.5, out=out)
            if np.isfinite(out).all():
                return out
        blocks = split_blocks(flat.size, self._world_size)
        mine = self._scatter_reduce(flat, op, blocks)
        out = np.empty(flat.size, flat.dtype)
        if flat.size:
            size = flat.itemsize
            counts = [(hi - lo) * size for lo, hi in blocks]
            displs = [lo * size for lo, _ in blocks]
            self._comm.Allgatherv(_bytes(mine), [_bytes(out), (counts, displs), self._MPI.BYTE])
        return out

    def _scatter_reduce(self, flat, op, blocks):
        """Everybody's block ``rank`` (one Alltoallv), reduced in rank order: this rank's share."""
        world, (lo, hi) = self._world_size, blocks[self._rank]
        if world == 1:
            return reduce_in_rank_order([flat[lo:hi]], op)
        received = np.empty((world, hi - lo), flat.dtype)
        if flat.size:
            size, MPI = flat.itemsize, self._MPI
            send = [_bytes(flat), ([(b - a) * size for a, b in blocks], [a * size for a, _ in blocks]), MPI.BYTE]
            mine = (hi - lo) * size
            recv = [_bytes(received), ([mine] * world, [r * mine for r in range(world)]), MPI.BYTE]
            self._comm.Alltoallv(send, recv)
        return reduce_in_rank_order(list(received), op)

    def _agree(self, record: CollectiveRecord) -> None:
        """Check that every rank is calling the same collective (one small Allgather)."""
        mine = np.frombuffer(record.pack(), np.uint8)
        self._comm.Allgather(mine, self._records)
        if not (self._records == mine).all():
            try:
                check_records([CollectiveRecord.unpack(row.tobytes()) for row in self._records])
            except EveryODistributedError as exc:
                raise EveryODistributedError(f"rank {self._rank}: {exc}") from None
