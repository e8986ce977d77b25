"""The TCP process group's wire format, handshakes and non-blocking transfer loop.

Every message is one frame: a fixed 40-byte little-endian header, then
``length`` raw bytes. Nothing on the wire is ever unpickled: control payloads
are fixed ``struct`` layouts or UTF-8 text, data payloads are the raw bytes
of a NumPy array whose dtype is one of :data:`DTYPES` (by code). Every length
is checked against a bound before a byte of payload is read: control frames
against :data:`MAX_CONTROL_BYTES`, data frames against the exact size the
receiver computed from its own call.

Header fields: magic, version, kind (what the frame is), op (which
collective), dtype code, root, seq (collective number), count (elements in
the whole collective), length (payload bytes). A data frame's op, dtype,
root, seq and count must equal the receiver's own, which is how a rank that
took a different path through the loop is caught and named.

Authentication: both sides prove knowledge of the shared token with an
HMAC-SHA256 over fresh random nonces (the token itself never travels). With
no token the key is empty: the same exchange still rejects stray clients
and foreign protocols, but anyone who speaks the protocol can join.
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import os
import select
import socket
import struct
import sys
import time
from typing import TYPE_CHECKING

import numpy as np

from everyo.distributed.protocol import PeerFailedError
from everyo.errors import EveryODistributedError

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from everyo._typing import DType

MAGIC = b"EvOD"
VERSION = 2  # 2: the header carries the array's shape (CollectiveRecord.shape)
HEADER = struct.Struct("<4sHHHHiQQQ32s")
HEADER_SIZE = HEADER.size  # 72
MAX_CONTROL_BYTES = 1 << 20
MAX_ERROR_BYTES = 4096
NONCE_BYTES = 32
TOKEN_ENV = "EVERYO_DIST_TOKEN"

# Frame kinds.
HELLO, CHALLENGE, JOIN, PEERS, ERROR, PEER_HELLO, PEER_ACK, DATA = range(1, 9)
KIND_NAMES = {
    HELLO: "HELLO",
    CHALLENGE: "CHALLENGE",
    JOIN: "JOIN",
    PEERS: "PEERS",
    ERROR: "ERROR",
    PEER_HELLO: "PEER_HELLO",
    PEER_ACK: "PEER_ACK",
    DATA: "DATA",
}
# Collective operations (codes on the wire <-> CollectiveRecord.op names).
# (Appending keeps the wire compatible with 0.1 for the old codes.)
OPS = (
    "none",
    "all_reduce_sum",
    "all_reduce_mean",
    "broadcast",
    "barrier",
    "all_gather",
    "reduce_scatter_sum",
    "reduce_scatter_mean",
)
# Data dtypes, always little-endian on the wire.
DTYPES = (
    "none",
    "float16",
    "float32",
    "float64",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "bool",
    "bfloat16",
)

if sys.byteorder != "little":  # pragma: no cover - every supported platform is little-endian
    raise ImportError("everyo's TCP process group sends native arrays and needs a little-endian host")


class ProtocolError(EveryODistributedError):
    """A peer sent bytes that are not a valid everyo frame (garbage, wrong version, bad length)."""


def resolve_token(token: str | bytes | bytearray | None) -> bytes:
    """The HMAC key: ``token`` if given, else ``$EVERYO_DIST_TOKEN``, else ``$EVERYO_TOKEN``, else empty."""
    if token is None:
        token = os.environ.get(TOKEN_ENV) or os.environ.get("EVERYO_TOKEN", "")
    if isinstance(token, str):
        token = token.encode("utf-8")
    if not isinstance(token, (bytes, bytearray)):
        raise TypeError(f"token must be str, bytes or None, got {type(token).__name__}")
    return bytes(token)


def mac(key: bytes, *parts: bytes) -> bytes:
    return hmac.new(key, b"\0".join(parts), hashlib.sha256).digest()


def macs_equal(a: bytes, b: bytes) -> bool:
    return hmac.compare_digest(a, b)


def nonce() -> bytes:
    return os.urandom(NONCE_BYTES)


def pack_header(
    kind: int,
    length: int = 0,
    op: int = 0,
    dtype: int = 0,
    root: int = 0,
    seq: int = 0,
    count: int = 0,
    shape: bytes = b"",
) -> bytes:
    return HEADER.pack(MAGIC, VERSION, kind, op, dtype, root, seq, count, length, shape)


def unpack_header(raw: bytes | bytearray | memoryview, who: str) -> tuple[int, int, int, int, int, int, int, bytes]:
    """``(kind, op, dtype, root, seq, count, length, shape)``; raises :class:`ProtocolError` on garbage."""
    magic, version, kind, op, dtype, root, seq, count, length, shape = HEADER.unpack(raw)
    if magic != MAGIC:
        raise ProtocolError(
            f"{who} sent bytes that are not the everyo protocol (first bytes {bytes(raw[:8])!r}); "
            "is that address really an everyo rendezvous server or worker?"
        )
    if version != VERSION:
        raise ProtocolError(
            f"{who} speaks everyo wire version {version}, this process speaks {VERSION}; "
            "install the same everyo-distributed version everywhere"
        )
    if kind not in KIND_NAMES or op >= len(OPS) or dtype >= len(DTYPES):
        raise ProtocolError(f"{who} sent a malformed frame header (kind {kind}, op {op}, dtype {dtype})")
    return kind, op, dtype, root, seq, count, length, shape


def dtype_code(dtype: DType) -> int:
    name = np.dtype(dtype).name
    if name not in DTYPES:
        raise EveryODistributedError(f"dtype {name} cannot be sent by the TCP process group")
    return DTYPES.index(name)


# -- blocking frames, for handshakes -------------------------------------------------------


def send_frame(sock: socket.socket, kind: int, payload: bytes | bytearray | memoryview = b"", **fields: int) -> None:
    sock.sendall(pack_header(kind, len(payload), **fields) + bytes(payload))  # type: ignore[arg-type]


def send_error(sock: socket.socket, message: str) -> None:
    """Best effort: tell the other side why we are hanging up."""
    try:
        sock.settimeout(1.0)
        send_frame(sock, ERROR, message.encode("utf-8")[:MAX_ERROR_BYTES])
    except OSError:
        pass


def _recv_exactly(sock: socket.socket, size: int, deadline: float, who: str, what: str) -> bytearray:
    buf = bytearray(size)
    view, got = memoryview(buf), 0
    while got < size:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"timed out waiting for {who} during {what}")
        sock.settimeout(remaining)
        n = sock.recv_into(view[got:])
        if n == 0:
            raise ConnectionError(f"{who} closed the connection during {what}")
        got += n
    return buf


def recv_frame(
    sock: socket.socket,
    expect: tuple[int, ...],
    deadline: float,
    who: str,
    what: str,
    max_length: int = MAX_CONTROL_BYTES,
) -> tuple[int, bytes]:
    """Read one control frame of a kind in ``expect``; return ``(kind, payload)``.

    An ERROR frame from the other side is raised as :class:`EveryODistributedError`
    carrying its message. Time-outs and disconnects raise ``socket.timeout`` /
    ``ConnectionError`` for the caller to reword.
    """
    kind, _, _, _, _, _, length, _ = unpack_header(_recv_exactly(sock, HEADER_SIZE, deadline, who, what), who)
    limit = MAX_ERROR_BYTES if kind == ERROR else max_length
    if length > limit:
        raise ProtocolError(
            f"{who} announced a {length}-byte {KIND_NAMES[kind]} frame during {what}; the limit is {limit} bytes"
        )
    payload = bytes(_recv_exactly(sock, length, deadline, who, what)) if length else b""
    if kind == ERROR:
        raise EveryODistributedError(payload.decode("utf-8", "replace"))
    if kind not in expect:
        names = "/".join(KIND_NAMES[k] for k in expect)
        raise ProtocolError(f"{who} sent a {KIND_NAMES[kind]} frame during {what}, expected {names}")
    return kind, payload


def tune_socket(sock: socket.socket) -> None:
    """Small frames go out at once (no Nagle delay); buffers are left to Linux's autotuning,
    which on loopback and LANs grows them past what SO_SNDBUF may be set to without privileges."""
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


# -- non-blocking transfer of many frames at once, for collectives --------------------------


class PeerLost(PeerFailedError):
    """A peer closed its connection or reset it in the middle of a collective (``failed_rank``: that peer)."""


_LOST = "; it failed, exited or closed its group (its own error says why)"


class Outgoing:
    """One frame to send: header then payload, resumable after partial writes.

    ``ready`` False holds the frame (and the ones queued after it for the same
    peer) until an :class:`Incoming`'s ``on_done`` callback sets it True.
    """

    __slots__ = ("peer", "views", "ready")

    def __init__(self, peer: int, header: bytes, payload: bytes | memoryview, ready: bool = True) -> None:
        self.peer, self.ready = peer, ready
        self.views: list[bytes | memoryview] = [memoryview(header)]
        if len(payload):
            self.views.append(payload)


class Incoming:
    """One frame to receive into ``payload`` (a writable byte view of the exact expected size).

    ``check(fields)`` validates the header fields before any payload byte is
    read; ``on_done()`` (optional) runs once the payload is complete.
    """

    __slots__ = ("peer", "header", "header_view", "got_header", "payload", "got", "check", "on_done")

    def __init__(
        self,
        peer: int,
        payload: memoryview,
        check: Callable[[tuple[int, int, int, int, int, int, int, bytes]], None],
        on_done: Callable[[], object] | None = None,
    ) -> None:
        self.peer, self.payload, self.check, self.on_done = peer, payload, check, on_done
        self.header = bytearray(HEADER_SIZE)
        self.header_view = memoryview(self.header)
        self.got_header = 0
        self.got = 0


def _queues(frames):
    queues = {}
    for frame in frames:
        queues.setdefault(frame.peer, collections.deque()).append(frame)
    return queues


def _send_some(sock: socket.socket, out: Outgoing) -> bool:
    """Send what the socket takes now; True once the whole frame is out."""
    sent = sock.sendmsg(out.views)
    views = out.views
    while sent and views:
        if sent >= len(views[0]):
            sent -= len(views[0])
            views.pop(0)
        else:
            views[0] = views[0][sent:]
            sent = 0
    return not views


def _recv_some(sock: socket.socket, inc: Incoming, who: str) -> bool:
    """Receive what has arrived; True once the whole frame is in. Checks the header as soon as it is complete."""
    if inc.got_header < HEADER_SIZE:
        n = sock.recv_into(inc.header_view[inc.got_header :])
        if n == 0:
            raise PeerLost(
                f"{who} closed its connection ({inc.got_header} bytes of the expected frame had arrived){_LOST}",
                inc.peer,
            )
        inc.got_header += n
        if inc.got_header < HEADER_SIZE:
            return False
        fields = unpack_header(inc.header, who)
        inc.check(fields)
        if fields[6] != len(inc.payload):
            raise ProtocolError(f"{who} announced {fields[6]} payload bytes, expected exactly {len(inc.payload)}")
    elif inc.got < len(inc.payload):
        n = sock.recv_into(inc.payload[inc.got :])
        if n == 0:
            raise PeerLost(
                f"{who} closed its connection ({HEADER_SIZE + inc.got} bytes of the expected frame had arrived){_LOST}",
                inc.peer,
            )
        inc.got += n
    return inc.got == len(inc.payload)


def transfer(
    socks: Mapping[int, socket.socket],
    outgoing: list[Outgoing],
    incoming: list[Incoming],
    deadline: float,
    on_timeout: Callable[[list[int]], BaseException],
    who_is: Callable[[int], str],
) -> None:
    """Send every :class:`Outgoing` and receive every :class:`Incoming`, all at once.

    ``socks`` maps peer rank -> non-blocking socket. Frames to (or from) the
    same peer go in list order; different peers proceed independently. Each
    pass tries every peer once and only waits in ``poll`` when nothing moved,
    so a large send never blocks a receive (which would deadlock two ranks
    sending to each other), and work done in ``on_done`` callbacks overlaps
    with the transfers still in flight. ``on_timeout(pending_peers)`` builds
    the timeout error; ``who_is(peer)`` names a peer in messages.
    """
    sends, recvs = _queues(outgoing), _queues(incoming)
    poller = select.poll()
    registered: dict[int, int] = {}
    while sends or recvs:
        progressed = False
        for peer in list(sends):
            queue = sends[peer]
            if not queue[0].ready:
                continue
            try:
                done = _send_some(socks[peer], queue[0])
            except (BlockingIOError, InterruptedError):
                continue
            except OSError as exc:  # EPIPE, ECONNRESET: the peer is gone
                raise PeerLost(f"{who_is(peer)} closed its connection ({exc.strerror or exc}){_LOST}", peer) from None
            progressed = True
            if done:
                queue.popleft()
                if not queue:
                    del sends[peer]
        for peer in list(recvs):
            queue = recvs[peer]
            try:
                done = _recv_some(socks[peer], queue[0], who_is(peer))
            except (BlockingIOError, InterruptedError):
                continue
            except PeerLost:
                raise
            except OSError as exc:
                raise PeerLost(f"{who_is(peer)} closed its connection ({exc.strerror or exc}){_LOST}", peer) from None
            progressed = True
            if done:
                finished = queue.popleft()
                if not queue:
                    del recvs[peer]
                if finished.on_done is not None:
                    finished.on_done()
        if progressed or not (sends or recvs):
            continue
        masks = {peer: select.POLLIN for peer in recvs}
        for peer, queue in sends.items():
            if queue[0].ready:
                masks[peer] = masks.get(peer, 0) | select.POLLOUT
        if not masks:
            raise RuntimeError("transfer: every pending frame waits for a callback that cannot run")
        fds = {}
        for peer, mask in masks.items():
            fd = socks[peer].fileno()
            fds[fd] = mask
            if registered.get(fd) != mask:
                (poller.modify if fd in registered else poller.register)(fd, mask)
                registered[fd] = mask
        for fd in [fd for fd in registered if fd not in fds]:
            poller.unregister(fd)
            del registered[fd]
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise on_timeout(sorted(set(sends) | set(recvs)))
        poller.poll(min(remaining, 1.0) * 1000)
