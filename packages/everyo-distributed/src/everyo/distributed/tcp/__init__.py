"""The TCP backend: ``wire`` (frames, handshakes, the transfer loop), ``rendezvous`` (a worker joining,
the mesh of peer connections), ``server`` (the rendezvous server) and ``group`` (the collectives).

The public names live in :mod:`everyo.distributed_tcp`. Needs no shared memory.
"""
