"""Process groups over TCP: data-parallel training across machines (the spec's "Multi-node TCP process groups").

Rank 0 starts a :class:`TCPRendezvousServer`; every worker (rank 0 included)
calls :func:`init_tcp_process_group` with the server's address and its own
rank, and gets a :class:`~everyo.distributed.ProcessGroup` that
``average_gradients`` and ``DistributedDataParallel`` use unchanged::

    from everyo.distributed_tcp import TCPRendezvousServer, init_tcp_process_group

    server = TCPRendezvousServer("0.0.0.0", 29500, world_size=2, token=secret) if rank == 0 else None
    with init_tcp_process_group("node0", 29500, rank, 2, token=secret) as group:
        ...   # average_gradients(model.parameters(), group) every step
    if server is not None:
        server.close()

Under a launcher that sets ``MASTER_ADDR``, ``MASTER_PORT``, ``RANK`` and
``WORLD_SIZE``, ``init_tcp_process_group()`` needs no arguments. The
implementation lives in :mod:`everyo.distributed.tcp`; this module is its
public face.
"""

from everyo.distributed.tcp.group import TCPProcessGroup, init_tcp_process_group
from everyo.distributed.tcp.server import TCPRendezvousServer

__all__ = ["TCPRendezvousServer", "init_tcp_process_group", "TCPProcessGroup"]
