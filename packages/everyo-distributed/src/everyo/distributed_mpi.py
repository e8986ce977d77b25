"""A process group on MPI (mpi4py): the engine for clusters.

Launch every rank with MPI's own launcher and build the group from the
communicator; ``average_gradients`` and the training loop do not change::

    mpiexec -n 4 python train.py

    from everyo.distributed_mpi import init_mpi_process_group
    group = init_mpi_process_group()          # MPI.COMM_WORLD
    ...   # average_gradients(model.parameters(), group) every step

Everything moves through mpi4py's buffer methods (``Allreduce``, ``Bcast``,
``Allgather``) on NumPy arrays -- never the lowercase, pickle-based ones.
Floats are reduced in float64 (integers in 64-bit integers) and rounded once
to the input dtype, as in the other backends (with two ranks, float32 and
float64 go through one native ``Allreduce``, which provably gives the same
bits). The order in which the ranks'
contributions are added is MPI's; MPI implementations give every rank the
same bits (MPICH and Open MPI do), and with two ranks the float64 sum of two
values does not depend on the order at all.

Needs the ``mpi`` extra: ``pip install everyo-distributed[mpi]`` (mpi4py and
the mpich wheel).
"""
from __future__ import annotations

import os
import shutil
import sys

import numpy as np

from everyo.errors import EveryODistributedError
from everyo.distributed.group import CollectiveRecord, ProcessGroup, check_records, prepare_array

__all__ = ["init_mpi_process_group", "MPIProcessGroup", "find_mpiexec"]

_NATIVE_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
_INSTALL_HINT = ("everyo.distributed_mpi needs mpi4py and an MPI library. Install them with: "
                 "pip install everyo-distributed[mpi]   (or: pip install mpi4py mpich)")


def _mpi():
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise ImportError(_INSTALL_HINT) from exc
    return MPI


def find_mpiexec():
    """Path of the ``mpiexec`` to launch with, or ``None``.

    The one beside the running Python comes first: the mpich wheel installs its
    launcher into the virtual environment's ``bin``, which need not be on PATH.
    """
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return beside if os.path.exists(beside) else shutil.which("mpiexec")


def init_mpi_process_group(comm=None) -> "MPIProcessGroup":
    """Return a process group over ``comm`` (default ``MPI.COMM_WORLD``).

    The group works on a duplicate of ``comm``, so its collectives never
    interleave with the caller's own MPI calls on ``comm``. Every rank of
    ``comm`` must call this (it is collective).

    Raises:
        ImportError: mpi4py is not installed (the message gives the pip command).
    """
    MPI = _mpi()
    if comm is None:
        comm = MPI.COMM_WORLD
    if not isinstance(comm, MPI.Comm) or comm == MPI.COMM_NULL:
        raise TypeError(f"init_mpi_process_group: comm must be an mpi4py communicator, got {comm!r}")
    return MPIProcessGroup(comm.Dup(), MPI)


class MPIProcessGroup(ProcessGroup):
    """One rank's handle on an MPI communicator; returned by :func:`init_mpi_process_group`.

    Before moving data, every collective exchanges a 64-byte description of
    the call (:class:`~everyo.distributed.CollectiveRecord`, one ``Allgather``)
    so that ranks calling different collectives, or passing arrays of different
    sizes or dtypes, get an :class:`~everyo.errors.EveryODistributedError`
    naming them instead of a hang or silently mixed data.
    """

    def __init__(self, comm, MPI):
        self._comm, self._MPI = comm, MPI
        self._rank, self._world_size = comm.Get_rank(), comm.Get_size()
        self._seq = 0
        self._records = np.empty((self._world_size, CollectiveRecord.PACKED_SIZE), np.uint8)

    @property
    def comm(self):
        """The group's own (duplicated) communicator."""
        return self._comm

    def barrier(self) -> None:
        self._agree("barrier", 0, "none", -1)   # an Allgather completes only once every rank joined

    def broadcast(self, array, root: int = 0) -> np.ndarray:
        if not isinstance(root, int) or not 0 <= root < self._world_size:
            raise EveryODistributedError(
                f"broadcast: root {root} is not a rank of this group (world_size {self._world_size})")
        data = prepare_array(array, "broadcast")
        self._agree("broadcast", data.size, data.dtype.name, root)
        out = data.copy() if self._rank == root else np.empty(data.shape, data.dtype)
        if out.size:
            self._comm.Bcast(out.reshape(-1), root=root)
        return out

    def close(self) -> None:
        """Free the group's communicator; idempotent."""
        comm, self._comm = self._comm, None
        if comm is not None and not self._MPI.Is_finalized():
            comm.Free()

    def _all_reduce(self, array, op_name, op):
        data = prepare_array(array, op_name)
        self._agree(op_name, data.size, data.dtype.name, -1)
        kind = data.dtype.kind
        if self._world_size == 2 and data.dtype in _NATIVE_DTYPES and data.size:
            # Two ranks: one IEEE addition in the input dtype gives the same bits as the float64
            # path (rounding twice is innocuous when 53 >= 2p + 2; see reduce_in_rank_order).
            out = np.empty(data.shape, data.dtype)
            self._comm.Allreduce(data.reshape(-1), out.reshape(-1), op=self._MPI.SUM)
            if op_name == "all_reduce_sum":
                return out
            # Mean: halve the rounded sum. If the sum was exact, multiplying by 0.5 rounds the exact
            # half once. If it was rounded, its magnitude is at least 2**-125 (smaller sums of
            # float32 values are exact), so halving is exact and commutes with the rounding. Only an
            # overflow to inf differs: then redo it in float64. Every rank holds the same `out`, so
            # every rank takes the same branch.
            np.multiply(out, 0.5, out=out)
            if np.isfinite(out).all():
                return out
        accumulator = np.float64 if kind == "f" else (np.uint64 if kind == "u" else np.int64)
        total = data.reshape(-1).astype(accumulator)     # a copy: the caller's array is untouched
        if total.size:
            self._comm.Allreduce(self._MPI.IN_PLACE, total, op=self._MPI.SUM)
        if op_name == "all_reduce_mean":
            total /= self._world_size
        return total.astype(data.dtype, casting="unsafe").reshape(data.shape)

    def _agree(self, op, size, dtype, root) -> None:
        """Check that every rank is calling the same collective (one small Allgather)."""
        if self._comm is None:
            raise EveryODistributedError(f"rank {self._rank}: {op} on a closed group")
        record = CollectiveRecord(op, size, dtype, self._seq, root)
        self._seq += 1
        mine = np.frombuffer(record.pack(), np.uint8)
        self._comm.Allgather(mine, self._records)
        if not (self._records == mine).all():
            try:
                check_records([CollectiveRecord.unpack(row.tobytes()) for row in self._records])
            except EveryODistributedError as exc:
                raise EveryODistributedError(f"rank {self._rank}: {exc}") from None
