"""A process group on MPI (mpi4py): the engine for clusters.

Launch every rank with MPI's own launcher and build the group from the
communicator; ``average_gradients`` and the training loop do not change::

    mpiexec -n 4 python train.py

    from everyo.distributed_mpi import init_mpi_process_group
    group = init_mpi_process_group()          # MPI.COMM_WORLD
    ...   # average_gradients(model.parameters(), group) every step

Needs the ``mpi`` extra: ``pip install everyo-distributed[mpi]`` (mpi4py and
the mpich wheel). The implementation lives in :mod:`everyo.distributed.mpi`;
this module is its public face.
"""

from everyo.distributed.mpi import MPIProcessGroup, find_mpiexec, init_mpi_process_group

__all__ = ["init_mpi_process_group", "MPIProcessGroup", "find_mpiexec"]
