"""Forming a TCP process group: the rendezvous server and the workers' half of its handshake.

The server (:class:`TCPRendezvousServer`, in a thread of rank 0's process) only
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

import errno
import ipaddress
import os
import select
import socket
import struct
import threading
import time
import warnings

from everyo.errors import EveryODistributedError
from everyo.distributed.tcp import wire

__all__ = ["TCPRendezvousServer", "join"]

_JOIN = struct.Struct("<iiHH")       # rank, world_size, listening port, address length
_PEER = struct.Struct("<HH")         # port, address length (then the address)
_PAIR = struct.Struct("<ii")         # connecting rank, accepting rank
SESSION_BYTES = 16
MAX_ADDRESS = 255
_PEER_HANDSHAKE_SECONDS = 5.0        # a stray connection to a worker's port is dropped after this
_MAX_PEER_PENDING = 64               # unverified connections a worker's listener holds at once
_MAX_PENDING_HANDSHAKES = 64         # connections the server checks at once (the oldest goes first) ...
_MAX_PENDING_PER_ADDRESS = 16        # ... and at most this many from one address
_HELLO_SIZE = SESSION_BYTES + 8 + 32  # PEER_HELLO payload: session, pair, MAC


def join(host, port, rank, world_size, key, deadline) -> dict:
    """Rendezvous at ``host:port`` and connect to every other rank; returns ``{peer rank: socket}``.

    A connection the server refuses, resets or closes before answering (it is
    not up yet, or busy shedding a flood of connections) is retried until
    ``deadline``; only the server's explicit refusal (an ERROR frame), a token
    mismatch or bytes that are not the protocol end it at once.

    Raises ``socket.timeout`` at ``deadline``, :class:`EveryODistributedError`
    (server's refusal, token mismatch, garbage) or ``OSError`` for the caller to reword.
    """
    server = f"the rendezvous server at {host}:{port}"
    listener = None
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
                    raise socket.timeout(f"{server} kept dropping the connection ({exc})") from None
                time.sleep(pause)
                pause = min(pause * 2, 0.5)
            finally:
                sock.close()
    except BaseException:
        if listener is not None:
            listener.close()
        raise
    with listener:
        return _connect_mesh(listener, key, session, rank, addresses, deadline)


def _connect(address, deadline, who):
    """Connect, retrying while nobody listens yet (workers may start before rank 0's server)."""
    pause = 0.02
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise socket.timeout(f"{who} did not accept a connection")
        try:
            sock = socket.create_connection(address, timeout=min(remaining, 5.0))
        except (ConnectionRefusedError, ConnectionResetError, socket.timeout):
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
    _, challenge = wire.recv_frame(sock, (wire.CHALLENGE,), deadline, server, "the handshake",
                                   max_length=2 * wire.NONCE_BYTES)
    server_nonce, proof = challenge[:wire.NONCE_BYTES], challenge[wire.NONCE_BYTES:]
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
        addresses.append((body[offset:offset + length].decode("ascii"), peer_port))
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
            _, ack = wire.recv_frame(sock, (wire.PEER_ACK,), deadline, f"rank {peer}", "connecting the group",
                                     max_length=32)
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


def _accept_peers(listener, key, session, rank, missing, deadline) -> dict:
    """Accept the higher ranks' connections; strays and garbage are dropped and delay nobody.

    Every connection is read without blocking, all at once: a stray that sends
    nothing only holds a slot until its own deadline (or until the slots run
    out, when the oldest unverified one goes), while genuine peers, which
    send their PEER_HELLO at once, are verified as soon as it arrives.
    """
    frame = wire.HEADER_SIZE + _HELLO_SIZE
    pending = {}          # socket -> (received bytes, drop-after time), insertion order = age
    found = {}
    listener.setblocking(False)
    poller = select.poll()
    try:
        while missing:
            now = time.monotonic()
            if now >= deadline:
                raise socket.timeout("waiting for higher ranks to connect")
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
        kind, _, _, _, _, _, length = wire.unpack_header(data[:wire.HEADER_SIZE], "a connecting peer")
        hello = data[wire.HEADER_SIZE:]
        if kind != wire.PEER_HELLO or length != _HELLO_SIZE:
            return None
        pair = hello[SESSION_BYTES:SESSION_BYTES + _PAIR.size]
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


class _Member:
    __slots__ = ("sock", "client", "rank", "address", "client_nonce")

    def __init__(self, sock, client, rank, address, client_nonce):
        self.sock, self.client, self.rank, self.address, self.client_nonce = sock, client, rank, address, client_nonce


class TCPRendezvousServer:
    """Introduces ``world_size`` workers to each other; runs in a background thread.

    Start it on rank 0 (before or after the workers call
    :func:`~everyo.distributed_tcp.init_tcp_process_group`: they retry until it
    answers). ``port=0`` picks a free port, read back from ``.port``. It binds
    to 127.0.0.1 unless told otherwise: pass ``host="0.0.0.0"`` (or the
    interface's address) for workers on other machines, on a trusted network only.
    ``token`` (default ``$EVERYO_DIST_TOKEN``) is the shared secret a worker
    must prove it holds. After a group forms the server is ready for another;
    after a misconfigured join (a rank claimed twice, a different world size)
    it refuses every later join with that reason. ``close()`` (or leaving the
    ``with`` block) stops it.

    Example::

        with TCPRendezvousServer(port=0, world_size=2) as server:
            ...  # start workers with init_tcp_process_group("127.0.0.1", server.port, rank, 2)
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, world_size: int = None, *,
                 token=None, handshake_timeout: float = 3.0):
        if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
            raise ValueError(f"TCPRendezvousServer: world_size must be a positive int, got {world_size!r}")
        self.world_size = world_size
        self._key = wire.resolve_token(token)
        self._handshake_timeout = handshake_timeout
        try:
            self._listener = socket.create_server((host, port), backlog=128)
        except OSError as exc:
            raise EveryODistributedError(
                f"TCPRendezvousServer cannot listen on {host}:{port}: {exc.strerror or exc}"
                + (" (another process holds the port; pick another or port=0 for a free one)"
                   if exc.errno == errno.EADDRINUSE else "")) from None
        self._listener.setblocking(False)
        self.host, self.port = host, self._listener.getsockname()[1]
        if not self._key and not _is_loopback(self._listener.getsockname()[0]):
            warnings.warn(
                f"TCPRendezvousServer listens on {host or '0.0.0.0'}:{self.port}, beyond this machine, "
                "without a token: anyone who can reach the port can join the group and read the "
                f"gradients. Pass token= (the same secret to every worker) or set ${wire.TOKEN_ENV}.",
                RuntimeWarning, stacklevel=2)
        self._wake_read, self._wake_write = socket.socketpair()
        self._lock = threading.Lock()
        self._members = {}          # rank -> _Member, the round being formed
        self._handshaking = {}      # connection being checked -> [client address, accepted at, stage]
        self._closed = False
        self._aborted = None        # why the launch is misconfigured, once a worker showed it
        self.groups_formed = 0      # rounds completed (for monitoring and tests)
        self.clients_rejected = 0   # connections dropped: garbage, wrong token, refused joins
        self._thread = threading.Thread(target=self._serve, name=f"everyo-rendezvous-{self.port}", daemon=True)
        self._thread.start()

    def __repr__(self):
        return f"TCPRendezvousServer(host={self.host!r}, port={self.port}, world_size={self.world_size})"

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()
        return False

    def close(self) -> None:
        """Stop accepting, tell waiting workers why, and release the port; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            members, self._members = list(self._members.values()), {}
            for conn in self._handshaking:
                try:
                    conn.shutdown(socket.SHUT_RDWR)   # wakes the handshake thread blocked on it
                except OSError:
                    pass
        self._wake()
        self._thread.join(5.0)
        for member in members:
            wire.send_error(member.sock, "the rendezvous server was closed before the group formed")
            member.sock.close()
        self._listener.close()
        self._wake_read.close()
        self._wake_write.close()

    def _wake(self):
        try:
            self._wake_write.send(b"x")
        except OSError:
            pass

    def _serve(self):
        """Accept connections and watch waiting members for disconnects (a crashed worker leaves the round)."""
        poller = select.poll()
        while True:
            with self._lock:
                if self._closed:
                    return
                watched = {m.sock.fileno(): m for m in self._members.values()}
            fds = {self._listener.fileno(), self._wake_read.fileno(), *watched}
            poller = select.poll()
            for fd in fds:
                poller.register(fd, select.POLLIN)
            for fd, _ in poller.poll():
                if fd == self._wake_read.fileno():
                    self._wake_read.recv(4096)
                elif fd == self._listener.fileno():
                    self._accept()
                elif fd in watched:
                    self._check_member(watched[fd])

    def _accept(self):
        """Take every waiting connection; when the slots are full, the oldest unverified one makes room.

        New connections are never refused: a flood of idle ones cannot lock
        genuine workers out, it only shortens how long each idle one is kept.
        Slots are bounded per client address and in all; the connection
        dropped is the oldest one that has not even sent its HELLO (a worker
        sends it at once), else the oldest.
        """
        for _ in range(_MAX_PENDING_HANDSHAKES):
            try:
                conn, client = self._listener.accept()
            except (BlockingIOError, InterruptedError, OSError):
                return
            with self._lock:
                if self._closed:
                    conn.close()
                    return
                same = [c for c, info in self._handshaking.items() if info[0] == client[0]]
                if len(same) >= _MAX_PENDING_PER_ADDRESS:
                    self._evict(same)
                elif len(self._handshaking) >= _MAX_PENDING_HANDSHAKES:
                    self._evict(list(self._handshaking))
                self._handshaking[conn] = [client[0], time.monotonic(), 0]
            threading.Thread(target=self._handshake, args=(conn, client), daemon=True,
                             name=f"everyo-rendezvous-client-{client[1]}").start()

    def _evict(self, candidates):
        """Shut down the oldest silent candidate (else the oldest); its handshake thread then exits."""
        info = self._handshaking
        silent = [c for c in candidates if info[c][2] == 0]
        victim = min(silent or candidates, key=lambda c: info[c][1])
        del info[victim]
        self.clients_rejected += 1
        try:
            victim.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _check_member(self, member):
        """A waiting member's socket became readable: it hung up (or broke the protocol). Drop it."""
        with self._lock:
            if self._members.get(member.rank) is not member:
                return
            try:
                member.sock.setblocking(False)
                member.sock.recv(1, socket.MSG_PEEK)
            except (BlockingIOError, InterruptedError):
                return   # spurious wake-up: nothing to read after all
            except OSError:
                pass
            del self._members[member.rank]
            member.sock.close()

    def _handshake(self, conn, client):
        who = f"client {client[0]}:{client[1]}"
        original = conn
        try:
            conn.setblocking(True)
            wire.tune_socket(conn)
            deadline = time.monotonic() + self._handshake_timeout
            _, client_nonce = wire.recv_frame(conn, (wire.HELLO,), deadline, who, "the handshake",
                                              max_length=wire.NONCE_BYTES)
            with self._lock:
                if original in self._handshaking:
                    self._handshaking[original][2] = 1   # it spoke: evicted only after the silent ones
            if len(client_nonce) != wire.NONCE_BYTES:
                raise wire.ProtocolError(f"{who} sent a {len(client_nonce)}-byte nonce")
            server_nonce = wire.nonce()
            wire.send_frame(conn, wire.CHALLENGE, server_nonce + wire.mac(self._key, b"server", client_nonce, server_nonce))
            _, join_frame = wire.recv_frame(conn, (wire.JOIN,), deadline, who, "the handshake",
                                            max_length=_JOIN.size + MAX_ADDRESS + 32)
            body, proof = join_frame[:-32], join_frame[-32:]
            if len(join_frame) < _JOIN.size + 32 or not wire.macs_equal(
                    proof, wire.mac(self._key, b"client", server_nonce, client_nonce, body)):
                raise _Refused("authentication failed: this worker's token does not match the rendezvous "
                               f"server's. Give the server and every worker the same token= (or ${wire.TOKEN_ENV}).")
            rank, world_size, port, length = _JOIN.unpack_from(body)
            if len(body) != _JOIN.size + length:
                raise wire.ProtocolError(f"{who} sent a malformed JOIN frame")
            address = body[_JOIN.size:].decode("ascii")
            self._admit(_Member(conn, f"{client[0]}:{client[1]}", rank, (address, port), client_nonce), world_size)
            conn = None   # owned by the round now
        except (_Refused, wire.ProtocolError) as exc:
            wire.send_error(conn, str(exc))
        except (OSError, EveryODistributedError, UnicodeDecodeError, struct.error):
            pass   # timed out, hung up, or sent garbage: drop it quietly
        finally:
            with self._lock:
                self._handshaking.pop(original, None)
                if conn is not None:
                    self.clients_rejected += 1
            if conn is not None:
                conn.close()

    def _admit(self, member, world_size):
        """Add an authenticated worker to the round; complete or abort the round if that decides it."""
        with self._lock:
            if self._closed:
                raise _Refused("the rendezvous server is closing")
            problem = self._aborted
            if problem is not None:
                pass   # an earlier worker already showed this launch is misconfigured
            elif world_size != self.world_size:
                problem = (f"the worker for rank {member.rank} (from {member.client}) was started with "
                           f"world_size={world_size}, but the rendezvous server expects world_size="
                           f"{self.world_size}; give every worker and the server the same world_size")
            elif not 0 <= member.rank < world_size:
                problem = f"rank {member.rank} from {member.client} is not in [0, {world_size})"
            elif member.rank in self._members and _alive(self._members[member.rank].sock):
                problem = (f"rank {member.rank} was claimed twice, by workers from "
                           f"{self._members[member.rank].client} and {member.client}; every worker "
                           f"needs a unique rank in [0, {world_size})")
            elif member.rank in self._members:   # the same worker again, after its connection dropped
                self._members.pop(member.rank).sock.close()
            if problem is not None and not self._key:
                # Without a token anybody can send a JOIN, so a conflicting one proves nothing about
                # the launch: turn away that client only, and keep forming the group.
                raise _Refused(f"rendezvous refused this worker: {problem}")
            if problem is not None:
                # Authenticated workers conflict: the launch itself is misconfigured.
                self._aborted = problem
                losers, self._members = [*self._members.values(), member], {}
                for m in losers:
                    wire.send_error(m.sock, "rendezvous aborted: " + problem)
                    m.sock.close()
                self.clients_rejected += len(losers)
                self._wake()
                return
            self._members[member.rank] = member
            self._handshaking.pop(member.sock, None)   # a member now: never evicted as a pending handshake
            if len(self._members) < self.world_size:
                self._wake()   # start watching this member for a disconnect
                return
            members, self._members = [self._members[r] for r in range(self.world_size)], {}
            self.groups_formed += 1
        self._wake()   # stop watching the members' sockets
        session = os.urandom(SESSION_BYTES)
        table = session + b"".join(_PEER.pack(m.address[1], len(m.address[0])) + m.address[0].encode("ascii")
                                   for m in members)
        for m in members:
            try:
                m.sock.setblocking(True)
                m.sock.settimeout(self._handshake_timeout)
                wire.send_frame(m.sock, wire.PEERS, table + wire.mac(self._key, b"peers", m.client_nonce, table))
            except OSError:
                pass   # that worker is gone; the others will notice when it never connects
            finally:
                m.sock.close()


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.split("%")[0]).is_loopback
    except ValueError:
        return False


def _alive(sock) -> bool:
    """Whether a waiting member's connection is still open (a worker that retried left a dead one).

    A waiting worker sends nothing, so a readable socket means it hung up (or broke the protocol).
    """
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return not poller.poll(0)


class _Refused(EveryODistributedError):
    """Reason sent to a client the server turns away."""
