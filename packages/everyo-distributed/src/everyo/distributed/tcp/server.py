"""The rendezvous server: introduces ``world_size`` workers to each other, and shrugs off everybody else.

See :mod:`everyo.distributed.tcp.rendezvous` for the protocol (the workers'
half lives there). Here: each connection gets its own short-lived thread and a
handshake deadline, every length is bounded, any bad byte only closes that
connection, and a flood of connections cannot lock genuine workers out (new
connections are never refused; when the slots are full the oldest one that
has not even sent its HELLO makes room).
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
from typing import TYPE_CHECKING, Any, Literal

from everyo.distributed.tcp import wire
from everyo.distributed.tcp.rendezvous import _JOIN, _PEER, MAX_ADDRESS, SESSION_BYTES
from everyo.errors import EveryODistributedError

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["TCPRendezvousServer"]

_MAX_PENDING_HANDSHAKES = 64  # connections the server checks at once (the oldest goes first) ...
_MAX_PENDING_PER_ADDRESS = 16  # ... and at most this many from one address


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

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        world_size: int | None = None,
        *,
        token: str | bytes | None = None,
        handshake_timeout: float = 3.0,
    ) -> None:
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
                + (
                    " (another process holds the port; pick another or port=0 for a free one)"
                    if exc.errno == errno.EADDRINUSE
                    else ""
                )
            ) from None
        self._listener.setblocking(False)
        self.host, self.port = host, self._listener.getsockname()[1]
        if not self._key and not _is_loopback(self._listener.getsockname()[0]):
            warnings.warn(
                f"TCPRendezvousServer listens on {host or '0.0.0.0'}:{self.port}, beyond this machine, "
                "without a token: anyone who can reach the port can join the group and read the "
                f"gradients. Pass token= (the same secret to every worker) or set ${wire.TOKEN_ENV}.",
                RuntimeWarning,
                stacklevel=2,
            )
        self._wake_read, self._wake_write = socket.socketpair()
        self._lock = threading.Lock()
        self._members: dict[int, _Member] = {}  # rank -> _Member, the round being formed
        # connection being checked -> [client address, accepted at, stage]
        self._handshaking: dict[socket.socket, list[Any]] = {}
        self._closed = False
        self._aborted: str | None = None  # why the launch is misconfigured, once a worker showed it
        self.groups_formed = 0  # rounds completed (for monitoring and tests)
        self.clients_rejected = 0  # connections dropped: garbage, wrong token, refused joins
        self._thread = threading.Thread(target=self._serve, name=f"everyo-rendezvous-{self.port}", daemon=True)
        self._thread.start()

    def __repr__(self) -> str:
        return f"TCPRendezvousServer(host={self.host!r}, port={self.port}, world_size={self.world_size})"

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> Literal[False]:
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
                    conn.shutdown(socket.SHUT_RDWR)  # wakes the handshake thread blocked on it
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
            threading.Thread(
                target=self._handshake, args=(conn, client), daemon=True, name=f"everyo-rendezvous-client-{client[1]}"
            ).start()

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
                return  # spurious wake-up: nothing to read after all
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
            _, client_nonce = wire.recv_frame(
                conn, (wire.HELLO,), deadline, who, "the handshake", max_length=wire.NONCE_BYTES
            )
            with self._lock:
                if original in self._handshaking:
                    self._handshaking[original][2] = 1  # it spoke: evicted only after the silent ones
            if len(client_nonce) != wire.NONCE_BYTES:
                raise wire.ProtocolError(f"{who} sent a {len(client_nonce)}-byte nonce")
            server_nonce = wire.nonce()
            wire.send_frame(
                conn, wire.CHALLENGE, server_nonce + wire.mac(self._key, b"server", client_nonce, server_nonce)
            )
            _, join_frame = wire.recv_frame(
                conn, (wire.JOIN,), deadline, who, "the handshake", max_length=_JOIN.size + MAX_ADDRESS + 32
            )
            body, proof = join_frame[:-32], join_frame[-32:]
            if len(join_frame) < _JOIN.size + 32 or not wire.macs_equal(
                proof, wire.mac(self._key, b"client", server_nonce, client_nonce, body)
            ):
                raise _Refused(
                    "authentication failed: this worker's token does not match the rendezvous "
                    f"server's. Give the server and every worker the same token= (or ${wire.TOKEN_ENV})."
                )
            rank, world_size, port, length = _JOIN.unpack_from(body)
            if len(body) != _JOIN.size + length:
                raise wire.ProtocolError(f"{who} sent a malformed JOIN frame")
            address = body[_JOIN.size :].decode("ascii")
            self._admit(_Member(conn, f"{client[0]}:{client[1]}", rank, (address, port), client_nonce), world_size)
            conn = None  # owned by the round now
        except (_Refused, wire.ProtocolError) as exc:
            wire.send_error(conn, str(exc))
        except (OSError, EveryODistributedError, UnicodeDecodeError, struct.error):
            pass  # timed out, hung up, or sent garbage: drop it quietly
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
                pass  # an earlier worker already showed this launch is misconfigured
            elif world_size != self.world_size:
                problem = (
                    f"the worker for rank {member.rank} (from {member.client}) was started with "
                    f"world_size={world_size}, but the rendezvous server expects world_size="
                    f"{self.world_size}; give every worker and the server the same world_size"
                )
            elif not 0 <= member.rank < world_size:
                problem = f"rank {member.rank} from {member.client} is not in [0, {world_size})"
            elif member.rank in self._members and _alive(self._members[member.rank].sock):
                problem = (
                    f"rank {member.rank} was claimed twice, by workers from "
                    f"{self._members[member.rank].client} and {member.client}; every worker "
                    f"needs a unique rank in [0, {world_size})"
                )
            elif member.rank in self._members:  # the same worker again, after its connection dropped
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
            self._handshaking.pop(member.sock, None)  # a member now: never evicted as a pending handshake
            if len(self._members) < self.world_size:
                self._wake()  # start watching this member for a disconnect
                return
            members, self._members = [self._members[r] for r in range(self.world_size)], {}
            self.groups_formed += 1
        self._wake()  # stop watching the members' sockets
        session = os.urandom(SESSION_BYTES)
        table = session + b"".join(
            _PEER.pack(m.address[1], len(m.address[0])) + m.address[0].encode("ascii") for m in members
        )
        for m in members:
            try:
                m.sock.setblocking(True)
                m.sock.settimeout(self._handshake_timeout)
                wire.send_frame(m.sock, wire.PEERS, table + wire.mac(self._key, b"peers", m.client_nonce, table))
            except OSError:
                pass  # that worker is gone; the others will notice when it never connects
            finally:
                m.sock.close()


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.split("%")[0]).is_loopback
    except ValueError:
        return False


def _alive(sock: socket.socket) -> bool:
    """Whether a waiting member's connection is still open (a worker that retried left a dead one).

    A waiting worker sends nothing, so a readable socket means it hung up (or broke the protocol).
    """
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return not poller.poll(0)


class _Refused(EveryODistributedError):
    """Reason sent to a client the server turns away."""
