"""Forming a TCP process group: the workers' half of the rendezvous, and the mesh of peer connections.

The server (:class:`~everyo.distributed.tcp.server.TCPRendezvousServer`, in a
thread of rank 0's process) only
introduces the workers: each worker connects, both sides prove they hold the
same token (HMAC over fresh nonces, see :mod:`everyo.distributed.tcp.wire`), the
worker reports its rank, world size and the address of its own listening
socket, and once all ranks are in, every worker gets the table of addresses and
a random session id. The workers then connect to each other directly (one
connection per pair, :func:`join`), checking the session id and the token
again, and the server is out of the picture.

The server must not fall over because of what a client sends: each connection
gets its own short-lived thread and a handshake deadline, every length is
bounded, and any bad byte only closes that connection. A *misconfigured but
authenticated* worker (a rank taken twice, a different world size) aborts the
round when the server has a token: the reason goes to every waiting worker and
to every worker that joins later, because the launch it belongs to cannot form
a correct group (whichever order the workers arrive in, all of them fail with
the same reason). Restart the job, server included, to try again. Without a
token anybody can send a JOIN, so a conflicting or malformed one is refused
alone and the group keeps forming.

Floods: new connections are never refused; when the handshake slots are full
(in all, or for one client address) the oldest connection that has not sent
its HELLO is dropped, and each handshake has a short deadline. Workers retry
a dropped connection until their own timeout.
"""

from __future__ import annotations

import select
import socket
import struct
import time

from everyo.distributed.tcp import wire
from everyo.errors import EveryODistributedError

__all__ = ["join"]

_JOIN = struct.Struct("<iiHH")  # rank, world_size, listening port, address length
_PEER = struct.Struct("<HH")  # port, address length (then the address)
_PAIR = struct.Struct("<ii")  # connecting rank, accepting rank
SESSION_BYTES = 16
MAX_ADDRESS = 255
_PEER_HANDSHAKE_SECONDS = 5.0  # a stray connection to a worker's port is dropped after this
_MAX_PEER_PENDING = 64  # unverified connections a worker's listener holds at once
_HELLO_SIZE = SESSION_BYTES + 8 + 32  # PEER_HELLO payload: session, pair, MAC


def join(host: str, port: int, rank: int, world_size: int, key: bytes, deadline: float) -> dict[int, socket.socket]:
    """Rendezvous at ``host:port`` and connect to every other rank; returns ``{peer rank: socket}``.

    A connection the server refuses, resets or closes before answering (it is
    not up yet, or busy shedding a flood of connections) is retried until
    ``deadline``; only the server's explicit refusal (an ERROR frame), a token
    mismatch or bytes that are not the protocol end it at once.

    Raises ``socket.timeout`` at ``deadline``, :class:`EveryODistributedError`
    (server's refusal, token mismatch, garbage) or ``OSError`` for the caller to reword.
    """
    server = f"the rendezvous server at {host}:{port}"
    listener: socket.socket | None = None
    pause = 0.02
    try:
        while True:
            sock = _connect((host, port), deadline, server)
            try:
                if listener is None:
                    listener = socket.socket(sock.family, socket.SOCK_STREAM)
                    # Listen on the interface that reaches the server: the one the peers can reach too.
                    listener.bind((sock.getsockname()[0], 0))
                    listener.listen(world_size + 16)
                session, addresses = _rendezvous(sock, key, rank, world_size, listener, deadline, server)
                break
            except (ConnectionError, BrokenPipeError) as exc:
                if time.monotonic() + pause >= deadline:
                    raise TimeoutError(f"{server} kept dropping the connection ({exc})") from None
                time.sleep(pause)
                pause = min(pause * 2, 0.5)
            finally:
                sock.close()
    except BaseException:
        if listener is not None:
            listener.close()
        raise
    assert listener is not None  # opened before the loop could break
    with listener:
        return _connect_mesh(listener, key, session, rank, addresses, deadline)


def _connect(address, deadline, who):
    """Connect, retrying while nobody listens yet (workers may start before rank 0's server)."""
    pause = 0.02
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"{who} did not accept a connection")
        try:
            sock = socket.create_connection(address, timeout=min(remaining, 5.0))
        except (TimeoutError, ConnectionRefusedError, ConnectionResetError):
            time.sleep(min(pause, max(remaining, 0)))
            pause = min(pause * 2, 0.5)
            continue
        except socket.gaierror as exc:
            raise EveryODistributedError(f"cannot resolve {address[0]!r}: {exc}") from None
        wire.tune_socket(sock)
        return sock


def _rendezvous(sock, key, rank, world_size, listener, deadline, server):
    """The client half of the server's handshake; returns the session id and every rank's address."""
    client_nonce = wire.nonce()
    wire.send_frame(sock, wire.HELLO, client_nonce)
    _, challenge = wire.recv_frame(
        sock, (wire.CHALLENGE,), deadline, server, "the handshake", max_length=2 * wire.NONCE_BYTES
    )
    server_nonce, proof = challenge[: wire.NONCE_BYTES], challenge[wire.NONCE_BYTES :]
    if not wire.macs_equal(proof, wire.mac(key, b"server", client_nonce, server_nonce)):
        raise EveryODistributedError(
            f"{server} failed the token check: it was started with a different token (or none). "
            f"Give the server and every worker the same token= (or ${wire.TOKEN_ENV})."
        )
    address = listener.getsockname()[0].encode("ascii")
    join = _JOIN.pack(rank, world_size, listener.getsockname()[1], len(address)) + address
    wire.send_frame(sock, wire.JOIN, join + wire.mac(key, b"client", server_nonce, client_nonce, join))
    _, peers = wire.recv_frame(sock, (wire.PEERS,), deadline, server, "waiting for the other ranks to join")
    body, proof = peers[:-32], peers[-32:]
    if not wire.macs_equal(proof, wire.mac(key, b"peers", client_nonce, body)):
        raise wire.ProtocolError(f"{server} sent a peer table that fails the token check")
    session, offset, addresses = body[:SESSION_BYTES], SESSION_BYTES, []
    for _ in range(world_size):
        if offset + _PEER.size > len(body):
            raise wire.ProtocolError(f"{server} sent a truncated peer table")
        peer_port, length = _PEER.unpack_from(body, offset)
        offset += _PEER.size
        addresses.append((body[offset : offset + length].decode("ascii"), peer_port))
        offset += length
    if offset != len(body) or len(session) != SESSION_BYTES:
        raise wire.ProtocolError(f"{server} sent a malformed peer table")
    return session, addresses


def _connect_mesh(listener, key, session, rank, addresses, deadline):
    """One connection per pair: connect to every lower rank, accept every higher one.

    Waits only point downwards (rank r waits for lower ranks' acknowledgements),
    so the mesh cannot deadlock. Connections to ``listener`` that fail the
    handshake (strays, garbage) are dropped and the wait goes on.
    """
    socks = {}
    try:
        for peer in range(rank):
            socks[peer] = sock = _connect(addresses[peer], deadline, f"rank {peer}")
            pair = _PAIR.pack(rank, peer)
            wire.send_frame(sock, wire.PEER_HELLO, session + pair + wire.mac(key, b"peer", session, pair))
            _, ack = wire.recv_frame(
                sock, (wire.PEER_ACK,), deadline, f"rank {peer}", "connecting the group", max_length=32
            )
            if not wire.macs_equal(ack, wire.mac(key, b"ack", session, pair)):
                raise wire.ProtocolError(f"rank {peer} failed the token check while connecting the group")
        missing = set(range(rank + 1, len(addresses)))
        if missing:
            socks.update(_accept_peers(listener, key, session, rank, missing, deadline))
    except BaseException:
        for sock in socks.values():
            sock.close()
        raise
    return socks


def _accept_peers(
    listener: socket.socket, key: bytes, session: bytes, rank: int, missing: set[int], deadline: float
) -> dict[int, socket.socket]:
    """Accept the higher ranks' connections; strays and garbage are dropped and delay nobody.

    Every connection is read without blocking, all at once: a stray that sends
    nothing only holds a slot until its own deadline (or until the slots run
    out, when the oldest unverified one goes), while genuine peers, which
    send their PEER_HELLO at once, are verified as soon as it arrives.
    """
    frame = wire.HEADER_SIZE + _HELLO_SIZE
    pending: dict[socket.socket, tuple[bytearray, float]] = {}  # socket -> (received bytes, drop-after time), by age
    found: dict[int, socket.socket] = {}
    conn: socket.socket | None
    listener.setblocking(False)
    poller = select.poll()
    try:
        while missing:
            now = time.monotonic()
            if now >= deadline:
                raise TimeoutError("waiting for higher ranks to connect")
            for conn in [c for c, (_, limit) in pending.items() if limit <= now]:
                del pending[conn]
                conn.close()
            poller = select.poll()
            poller.register(listener, select.POLLIN)
            for conn in pending:
                poller.register(conn, select.POLLIN)
            wake = min([deadline] + [limit for _, limit in pending.values()])
            for fd, _ in poller.poll(max(0.0, min(wake - now, 1.0)) * 1000):
                if fd == listener.fileno():
                    while True:
                        try:
                            conn, _ = listener.accept()
                        except (BlockingIOError, InterruptedError):
                            break
                        conn.setblocking(False)
                        if len(pending) >= _MAX_PEER_PENDING:
                            oldest = next(iter(pending))
                            del pending[oldest]
                            oldest.close()
                        pending[conn] = (bytearray(), min(deadline, time.monotonic() + _PEER_HANDSHAKE_SECONDS))
                    continue
                conn = next((c for c in pending if c.fileno() == fd), None)
                if conn is None:
                    continue
                data, limit = pending[conn]
                try:
                    chunk = conn.recv(frame - len(data))
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    chunk = b""
                if not chunk:
                    del pending[conn]
                    conn.close()
                    continue
                data += chunk
                if len(data) < frame:
                    continue
                del pending[conn]
                peer = _verify_peer(conn, bytes(data), key, session, rank, missing)
                if peer is None:
                    conn.close()
                else:
                    missing.discard(peer)
                    found[peer] = conn
    except BaseException:
        for conn in list(pending) + list(found.values()):
            conn.close()
        raise
    for conn in pending:
        conn.close()
    return found


def _verify_peer(conn, data, key, session, rank, missing):
    """Check a complete PEER_HELLO frame; acknowledge it and return the peer rank, or None to drop it."""
    try:
        kind, _, _, _, _, _, length, _ = wire.unpack_header(data[: wire.HEADER_SIZE], "a connecting peer")
        hello = data[wire.HEADER_SIZE :]
        if kind != wire.PEER_HELLO or length != _HELLO_SIZE:
            return None
        pair = hello[SESSION_BYTES : SESSION_BYTES + _PAIR.size]
        if hello[:SESSION_BYTES] != session or not wire.macs_equal(hello[-32:], wire.mac(key, b"peer", session, pair)):
            return None
        peer, target = _PAIR.unpack(pair)
        if target != rank or peer not in missing:
            return None
        conn.setblocking(True)
        conn.settimeout(_PEER_HANDSHAKE_SECONDS)
        wire.tune_socket(conn)
        wire.send_frame(conn, wire.PEER_ACK, wire.mac(key, b"ack", session, pair))
        return peer
    except (OSError, EveryODistributedError, struct.error):
        return None
