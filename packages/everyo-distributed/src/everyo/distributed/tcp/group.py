"""Process groups over TCP: data-parallel training across machines (the spec's "Multi-node TCP process groups").

Rank 0 starts a :class:`TCPRendezvousServer`; every worker (rank 0 included)
calls :func:`init_tcp_process_group` with the server's address and its own
rank, and gets a :class:`~everyo.distributed.ProcessGroup` that
``average_gradients`` uses unchanged::

    from everyo.distributed_tcp import TCPRendezvousServer, init_tcp_process_group

    server = TCPRendezvousServer("0.0.0.0", 29500, world_size=2) if rank == 0 else None
    with init_tcp_process_group("node0", 29500, rank, 2) as group:
        ...   # average_gradients(model.parameters(), group) every step
    if server is not None:
        server.close()

The server only introduces the workers to each other: each worker opens a
listening socket, reports it, gets everybody's address back, and the workers
connect to each other directly (one connection per pair). Collective data never
passes through the server, nor through rank 0.

All-reduce is a reduce-scatter then an all-gather, both point to point: rank
``r`` owns the ``r``-th of ``world_size`` contiguous blocks of the array; every
rank sends each owner that owner's block, each owner sums its block over the
ranks in rank order 0, 1, 2, ... in float64 (the same
:func:`~everyo.distributed.reduce_in_rank_order` as the shared-memory group),
rounds once to the input dtype and sends the result to everybody. Every rank
sends and receives ``2 (world_size - 1) / world_size`` of the array, which is
what a ring moves, and every element is computed once, so all ranks hold the
same bits -- the same bits the shared-memory group gives. Large blocks travel
in 4 MiB segments, each reduced as soon as it has arrived from every rank, so
the reduction overlaps the transfers. Small arrays skip the split: everybody
sends everything to everybody and reduces locally (one round trip, not two).

Broadcast and all-gather are pipelined rings: the root's array travels
``root -> root + 1 -> ...`` in 4 MiB segments, each forwarded as soon as it
has arrived, and in the all-gather every rank passes on the block it received
one step before, so no rank sends more than ``(world_size - 1)`` arrays' worth
and the root's link is not the bottleneck. Reduce-scatter is the first half
of the all-reduce. Every frame's header carries the sender's
:class:`~everyo.distributed.CollectiveRecord`; since every rank checks the
rank it receives from, and the ring closes, a rank that called something
else is named on its neighbours.

Security: the wire format carries raw array bytes behind a fixed header and is
never unpickled; every length is bounded; with a shared ``token`` (or
``$EVERYO_DIST_TOKEN``) a peer is admitted only after an HMAC challenge. There
is no encryption: use it on trusted networks only.
"""

from __future__ import annotations

import os
import socket
import sys
import time

import numpy as np

from everyo.distributed.protocol import (
    HINT,
    CollectiveRecord,
    PeerFailedError,
    ProcessGroup,
    reduce_in_rank_order,
    split_blocks,
)
from everyo.distributed.tcp import rendezvous, wire
from everyo.distributed.tcp.server import TCPRendezvousServer
from everyo.errors import EveryODistributedError

__all__ = ["TCPRendezvousServer", "init_tcp_process_group", "TCPProcessGroup"]

_SEGMENT_BYTES = 1 << 22  # all-reduce streams blocks in pieces this large
_REUSE_BYTES = 1 << 20  # results this large are recycled (see TCPProcessGroup._output)
_SMALL_BYTES = 1 << 16  # below this, one round trip beats splitting the reduction
_STUCK_HINT = "A rank may also be stuck, or stopped, outside the collectives."
_LAUNCHER_ENV = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")


def _from_environment(name, value, convert):
    if value is not None:
        return value
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        raise EveryODistributedError(
            f"init_tcp_process_group: no {name.lower().replace('master_', '')} given and ${name} is not set. "
            "Pass host, port, rank and world_size, or launch with a tool that sets "
            + ", ".join("$" + v for v in _LAUNCHER_ENV)
            + " (torchrun, Slurm scripts, Kubernetes operators)"
        )
    try:
        return convert(raw)
    except ValueError:
        raise EveryODistributedError(f"init_tcp_process_group: ${name}={raw!r} is not valid") from None


def init_tcp_process_group(
    host: str | None = None,
    port: int | None = None,
    rank: int | None = None,
    world_size: int | None = None,
    *,
    timeout: float = 60.0,
    token: str | bytes | None = None,
) -> TCPProcessGroup:
    """Join the group that the :class:`TCPRendezvousServer` at ``host:port`` is forming.

    Blocks until all ``world_size`` ranks have joined and this rank is connected
    to every other. ``timeout`` (seconds) bounds the whole rendezvous and, later,
    each collective. ``token`` (default ``$EVERYO_DIST_TOKEN``, else
    ``$EVERYO_TOKEN``) must match the server's and every other worker's.

    Launcher conventions (torchrun's): an argument left out is read from
    ``$MASTER_ADDR``, ``$MASTER_PORT``, ``$RANK`` and ``$WORLD_SIZE``. Called
    with neither ``host`` nor ``port``, rank 0 also starts the
    :class:`TCPRendezvousServer` on ``$MASTER_ADDR:$MASTER_PORT`` itself (the
    group closes it), so a launcher's environment is all it needs. (torchrun's
    own agent store may already hold ``MASTER_PORT``: then start the server
    yourself on another port and pass it.)

    Example (needs torchrun's or srun's environment, so not run as a doctest)::

        group = init_tcp_process_group()  # under torchrun or srun

    Raises:
        ValueError: ``rank`` is not in ``[0, world_size)``.
        EveryODistributedError: the server refused this worker (wrong token, a
            duplicate rank, a different world size), sent garbage, or the
            group did not form within ``timeout``.
    """
    own_server = host is None and port is None
    host = _from_environment("MASTER_ADDR", host, str)
    port = _from_environment("MASTER_PORT", port, int)
    rank = _from_environment("RANK", rank, int)
    world_size = _from_environment("WORLD_SIZE", world_size, int)
    for name, value in (("rank", rank), ("world_size", world_size), ("port", port)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"init_tcp_process_group: {name} must be an int, got {value!r}")
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"init_tcp_process_group: rank {rank} is not in [0, world_size={world_size})")
    if not timeout > 0:
        raise ValueError(f"init_tcp_process_group: timeout must be positive seconds, got {timeout!r}")
    key = wire.resolve_token(token)
    server = None
    if own_server and rank == 0:
        server = TCPRendezvousServer(_bind_address(host), port, world_size, token=token)
    deadline = time.monotonic() + timeout
    where = f"rank {rank}: joining the group at {host}:{port}"
    try:
        socks = rendezvous.join(host, port, rank, world_size, key, deadline)
    except BaseException as exc:
        if server is not None:
            server.close()
        if isinstance(exc, socket.timeout):
            raise EveryODistributedError(
                f"{where}: timed out after {timeout:g} s. The group forms once all {world_size} ranks have "
                "joined: check that every rank was started, with the same host, port and world_size, "
                "and that the server is running on rank 0's machine."
            ) from None
        if isinstance(exc, wire.ProtocolError):
            raise wire.ProtocolError(f"{where}: {exc}") from None
        if isinstance(exc, (EveryODistributedError, OSError)):
            raise EveryODistributedError(f"{where}: {exc}") from None
        raise
    return TCPProcessGroup(rank, world_size, socks, timeout, server=server)


def _bind_address(host: str) -> str:
    """Where rank 0's own server listens for ``host``: the address itself if it is this machine's."""
    try:
        socket.create_server((host, 0)).close()
        return host
    except OSError:
        return "0.0.0.0"  # a name that resolves elsewhere (NAT, container): listen everywhere


def _byte_view(array: np.ndarray) -> memoryview:
    return array.reshape(-1).view(np.uint8).data


def _segments(lo: int, hi: int, itemsize: int) -> list[tuple[int, int]]:
    """The element ranges a block travels in (both ends cut it the same way); one, possibly empty, at least."""
    step = max(1, _SEGMENT_BYTES // itemsize)
    return [(a, min(a + step, hi)) for a in range(lo, hi, step)] or [(lo, hi)]


class TCPProcessGroup(ProcessGroup):
    """One rank's connections to every other rank; returned by :func:`init_tcp_process_group`.

    Collectives block, must be called by every rank in the same order, and
    raise :class:`~everyo.errors.EveryODistributedError` on every rank when the
    ranks disagree, when a peer disconnects, or after ``timeout`` seconds. After
    such an error the group is unusable (its connections are closed, so the
    other ranks fail promptly too). Not thread-safe: one collective at a time.
    """

    def __init__(
        self,
        rank: int,
        world_size: int,
        socks: dict[int, socket.socket],
        timeout: float,
        server: TCPRendezvousServer | None = None,
    ) -> None:
        super().__init__(rank, world_size)
        self.timeout = timeout
        self._socks: dict[int, socket.socket] | None = socks
        self._server = server
        for sock in socks.values():
            sock.setblocking(False)
        self._scratch: dict[int, np.ndarray] = {}  # peer -> reusable receive buffer (uint8), grown as needed
        self._last_out: np.ndarray | None = None  # the last large result, reused once the caller drops it

    def _close(self) -> None:
        """Close the connections to every peer (and rank 0's own rendezvous server, if it started one)."""
        socks, self._socks = self._socks, None
        for sock in (socks or {}).values():
            try:
                sock.close()
            except OSError:
                pass
        if self._server is not None:
            self._server.close()
            self._server = None

    # -- collectives -------------------------------------------------------------------------------
    def _barrier(self, record):
        peers = self._peers()
        self._run(
            record,
            [wire.Outgoing(p, self._header(record, 0), b"") for p in peers],
            [self._incoming(record, p, memoryview(b"")) for p in peers],
        )

    def _broadcast(self, record, data, root):
        """A pipelined chain root -> root+1 -> ... -> root-1, then an empty frame back to the root.

        Each rank checks the header of the rank before it and the root checks
        the last one's, so the ring of checks covers every rank.
        """
        world, me = self._world_size, self._rank
        flat = data.reshape(-1)
        out = flat.copy() if me == root else np.empty(flat.size, flat.dtype)
        if world == 1:
            return out
        prev, nxt = (me - 1) % world, (me + 1) % world
        segments = _segments(0, flat.size, flat.itemsize)
        outgoing, incoming = [], []
        last = (root - 1) % world
        if me == root:
            for a, b in segments:
                payload = _byte_view(out[a:b])
                outgoing.append(wire.Outgoing(nxt, self._header(record, payload.nbytes), payload))
            incoming.append(self._incoming(record, last, memoryview(b"")))
        else:
            forward = nxt != root
            for a, b in segments:
                payload = _byte_view(out[a:b])
                frame = None
                if forward:
                    frame = wire.Outgoing(nxt, self._header(record, payload.nbytes), payload, ready=False)
                    outgoing.append(frame)
                incoming.append(self._incoming(record, prev, payload, on_done=_release(frame)))
            if not forward:
                outgoing.append(wire.Outgoing(root, self._header(record, 0), b""))
        self._run(record, outgoing, incoming)
        return out

    def _all_gather(self, record, data):
        """A ring: at step k every rank sends ``next`` the block it received at step k - 1."""
        world, me = self._world_size, self._rank
        out = np.empty((world, data.size), data.dtype)
        out[me] = data.reshape(-1)
        if world == 1:
            return out
        prev, nxt = (me - 1) % world, (me + 1) % world
        outgoing, incoming = [], []
        payload = _byte_view(out[me])
        outgoing.append(wire.Outgoing(nxt, self._header(record, payload.nbytes), payload))
        for k in range(1, world):
            block = (me - k) % world  # arrives from prev at step k
            payload = _byte_view(out[block])
            frame = None
            if k < world - 1:  # the last block received is next's own
                frame = wire.Outgoing(nxt, self._header(record, payload.nbytes), payload, ready=False)
                outgoing.append(frame)
            incoming.append(self._incoming(record, prev, payload, on_done=_release(frame)))
        self._run(record, outgoing, incoming)
        return out

    def _reduce_scatter(self, record, data, op, blocks):
        flat = data.reshape(-1)
        if self._world_size == 1:
            return reduce_in_rank_order([flat], op)
        lo, hi = blocks[self._rank]
        out = np.empty(hi - lo, flat.dtype)
        self._split(record, flat, op, blocks, None, mine=out)
        return out

    def _all_reduce(self, record, data, op):
        flat, world = data.reshape(-1), self._world_size
        if world == 1:
            return reduce_in_rank_order([flat], op)
        peers = self._peers()
        if data.nbytes <= _SMALL_BYTES or flat.size < world:
            received = {p: self._buffer(p, data.nbytes).view(data.dtype) for p in peers}
            mine = _byte_view(flat)
            self._run(
                record,
                [wire.Outgoing(p, self._header(record, mine.nbytes), mine) for p in peers],
                [self._incoming(record, p, _byte_view(received[p])) for p in peers],
            )
            return reduce_in_rank_order([received.get(r, flat) for r in range(world)], op)
        out = self._output(flat.size, flat.dtype)
        lo, hi = split_blocks(flat.size, world)[self._rank]
        self._split(record, flat, op, split_blocks(flat.size, world), out, mine=out[lo:hi])
        return out

    def _split(self, record, flat, op, blocks, out, mine):
        """Reduce-scatter (then, if ``out`` is given, all-gather), streamed in segments.

        Rank r owns block r. Each block travels in segments of about
        ``_SEGMENT_BYTES``; as soon as a segment of this rank's block has
        arrived from every peer it is reduced (while still in cache) into
        ``mine`` and, for an all-reduce, its all-gather frames are released,
        so reduction, sending and receiving overlap. Both ends cut a block
        into the same segments, so frame order on every connection matches.
        """
        world, me, peers = self._world_size, self._rank, self._peers()
        lo, hi = blocks[me]
        segments = {r: _segments(start, end, flat.itemsize) for r, (start, end) in enumerate(blocks)}
        received = {p: self._buffer(p, (hi - lo) * flat.itemsize).view(flat.dtype) for p in peers}
        outgoing, incoming = [], []
        gathers = []  # per segment of my block: its all-gather frames, released once reduced
        for a, b in segments[me]:
            if out is None:
                gathers.append([])
                continue
            payload = _byte_view(mine[a - lo : b - lo])
            gathers.append(
                [wire.Outgoing(p, self._header(record, payload.nbytes), payload, ready=False) for p in peers]
            )
        arrivals = [0] * len(segments[me])

        def arrived(k):
            arrivals[k] += 1
            if arrivals[k] == len(peers):
                a, b = segments[me][k]
                reduce_in_rank_order(
                    [received[r][a - lo : b - lo] if r != me else flat[a:b] for r in range(world)],
                    op,
                    out=mine[a - lo : b - lo],
                )
                for frame in gathers[k]:
                    frame.ready = True

        for p in peers:
            for a, b in segments[p]:  # reduce-scatter: my data for p's block
                payload = _byte_view(flat[a:b])
                outgoing.append(wire.Outgoing(p, self._header(record, payload.nbytes), payload))
            for k, (a, b) in enumerate(segments[me]):  # p's data for my block
                incoming.append(
                    self._incoming(record, p, _byte_view(received[p][a - lo : b - lo]), on_done=lambda k=k: arrived(k))
                )
        for frames in gathers:  # all-gather: my reduced block, to everybody
            outgoing.extend(frames)
        if out is not None:
            for p in peers:
                for a, b in segments[p]:  # everybody's reduced block, straight into the result
                    incoming.append(self._incoming(record, p, _byte_view(out[a:b])))
        self._run(record, outgoing, incoming)

    def _output(self, size, dtype):
        """A new result array, or the previous large one once the caller has dropped every reference to it.

        Arrays above glibc's mmap threshold (32 MiB) come fresh from the kernel
        on every allocation, and zeroing 40 MB of new pages costs about as much
        CPU as the reduction itself (reusing made a 1e7-element all-reduce
        12-20% faster, measured A/B on the 2-core machine). Training loops (``average_gradients``)
        drop the result before the next call, so its memory can be reused: then
        the only references are ``self._last_out``, the local ``last`` and
        ``getrefcount``'s argument. A view, a buffer export or any other holder
        keeps the count higher, and a fresh array is returned.
        """
        last = self._last_out
        if last is not None and last.size == size and last.dtype == dtype and sys.getrefcount(last) == 3:
            return last
        out = np.empty(size, dtype)
        self._last_out = out if out.nbytes >= _REUSE_BYTES else None
        return out

    def _buffer(self, peer, nbytes):
        buf = self._scratch.get(peer)
        if buf is None or buf.size < nbytes:
            buf = self._scratch[peer] = np.empty(nbytes, np.uint8)
        return buf[:nbytes]

    # -- frames ---------------------------------------------------------------------------------------
    def _peers(self):
        return [p for p in range(self._world_size) if p != self._rank]

    def _refuse(self, op, data):
        if data is not None and data.dtype.name not in wire.DTYPES:
            return (
                f"{op}: dtype {data.dtype.name} has no code in the TCP wire format; "
                f"supported: {', '.join(wire.DTYPES[1:])}"
            )
        return None

    def _header(self, record: CollectiveRecord, length: int) -> bytes:
        return wire.pack_header(
            wire.DATA,
            length,
            op=wire.OPS.index(record.op),
            dtype=wire.DTYPES.index(record.dtype),
            root=record.root,
            seq=record.seq,
            count=record.size,
            shape=record.shape.encode("ascii"),
        )

    def _incoming(self, record, peer, payload, on_done=None):
        def check(fields):
            kind, op, dtype, root, seq, count, _, shape = fields
            if kind != wire.DATA:
                raise wire.ProtocolError(f"rank {peer} sent a {wire.KIND_NAMES[kind]} frame inside a collective")
            text = shape.rstrip(b"\0").decode("ascii", errors="replace")
            theirs = CollectiveRecord(wire.OPS[op], count, wire.DTYPES[dtype], seq, root, text)
            if theirs != record:
                raise EveryODistributedError(
                    f"collective mismatch: rank {self._rank} called {record.describe()}, "
                    f"but rank {peer} called {theirs.describe()}. {HINT}"
                )

        return wire.Incoming(peer, payload, check, on_done)

    def _run(self, record, outgoing, incoming):
        """Move the frames; on any failure, close every connection so the peers fail fast too."""

        def timed_out(peers):
            who = ", ".join(map(str, peers))
            # A consequence: the rank(s) waited for are the ones stuck (or slow), not this one.
            return PeerFailedError(
                f"timed out after {self.timeout:g} s waiting for rank(s) {who}. {HINT} {_STUCK_HINT}", peers[0]
            )

        try:
            wire.transfer(
                self._socks, outgoing, incoming, time.monotonic() + self.timeout, timed_out, lambda peer: f"rank {peer}"
            )
        except BaseException as exc:
            self.close()
            if isinstance(exc, PeerFailedError):
                raise type(exc)(f"rank {self._rank}, in {record.describe()}: {exc}", exc.failed_rank) from None
            if isinstance(exc, EveryODistributedError):
                raise type(exc)(f"rank {self._rank}, in {record.describe()}: {exc}") from None
            raise


def _release(frame):
    """An ``on_done`` callback that lets ``frame`` (a forward to the next rank) go out; None if no frame."""
    if frame is None:
        return None

    def release():
        frame.ready = True

    return release
