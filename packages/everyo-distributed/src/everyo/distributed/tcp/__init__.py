"""The TCP backend: ``wire`` (frames, handshakes, the transfer loop), ``rendezvous`` (forming a group), ``group``.

The public names live in :mod:`everyo.distributed_tcp`. Needs no shared memory.
"""
