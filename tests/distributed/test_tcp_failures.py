"""Every way a TCP group can go wrong gives a clear error on the workers, and the server survives garbage.

Ranks run as threads of this process; each test checks that the server's
thread stopped and no rank thread is left behind.
"""

import os
import socket
import threading
import time

import numpy as np
import pytest
from test_tcp_collectives import run_in_threads

from everyo.distributed.tcp import wire
from everyo.distributed_tcp import TCPRendezvousServer, init_tcp_process_group
from everyo.errors import EveryODistributedError


@pytest.fixture(autouse=True)
def no_leftover_threads():
    before = set(threading.enumerate())
    yield
    deadline = time.monotonic() + 60  # a safety net: the threads end as soon as their sockets close
    while time.monotonic() < deadline:
        extra = [t for t in threading.enumerate() if t not in before and t.is_alive()]
        if not extra:
            break
        time.sleep(0.05)
    assert not extra, f"threads left running: {extra}"


def join_in_threads(port, specs, timeout=10.0):
    """Call init_tcp_process_group for each ``(rank, world_size, token)``; returns groups or exceptions."""
    out = [None] * len(specs)

    def target(i, rank, world_size, token):
        try:
            out[i] = init_tcp_process_group("127.0.0.1", port, rank, world_size, timeout=timeout, token=token)
        except BaseException as exc:  # noqa: B902
            out[i] = exc

    threads = [threading.Thread(target=target, args=(i, *spec)) for i, spec in enumerate(specs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 20)
    for item in out:
        if hasattr(item, "close"):
            item.close()
    return out


# -- rendezvous -------------------------------------------------------------------------------


def test_duplicate_rank_with_a_token_aborts_the_launch_on_both_workers():
    # Authenticated workers that conflict: the launch itself is misconfigured, everybody is told.
    with TCPRendezvousServer(port=0, world_size=2, token="t") as server:
        out = join_in_threads(server.port, [(1, 2, "t"), (1, 2, "t")])
    assert all(isinstance(e, EveryODistributedError) for e in out), out
    for e in out:
        assert "rendezvous aborted: rank 1 was claimed twice" in str(e) and "unique rank" in str(e)


@pytest.mark.parametrize("bad_first", [False, True])
def test_wrong_world_size_with_a_token_is_an_error_on_every_worker(bad_first):
    with TCPRendezvousServer(port=0, world_size=2, token="t") as server:
        if bad_first:  # a worker that joins after the misconfigured one is told too, not left waiting
            out = join_in_threads(server.port, [(1, 3, "t")]) + join_in_threads(server.port, [(0, 2, "t")])
        else:
            out = join_in_threads(server.port, [(0, 2, "t"), (1, 3, "t")])
    assert all(isinstance(e, EveryODistributedError) for e in out), out
    assert all("world_size=3" in str(e) and "expects world_size=2" in str(e) for e in out)


def rogue_join(port, rank, world_size, *, malformed=False):
    """A well-formed (or malformed) JOIN from a client that is not part of the launch; returns the server's reply."""
    from everyo.distributed.tcp import rendezvous

    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    with sock:
        nonce = wire.nonce()
        wire.send_frame(sock, wire.HELLO, nonce)
        _, challenge = wire.recv_frame(sock, (wire.CHALLENGE,), time.monotonic() + 5, "server", "test")
        body = rendezvous._JOIN.pack(rank, world_size, 1, 9) + b"127.0.0.1"
        if malformed:
            body = body[:-3]
        wire.send_frame(sock, wire.JOIN, body + wire.mac(b"", b"client", challenge[:32], nonce, body))
        try:
            wire.recv_frame(sock, (wire.PEERS,), time.monotonic() + 5, "server", "test")
        except EveryODistributedError as exc:
            return str(exc)
    return "no refusal"


@pytest.mark.parametrize("rogue", [(1, 3, False), (1, 2, False), (5, 2, False), (0, 2, True)])
def test_without_a_token_a_conflicting_or_malformed_join_is_refused_alone(rogue):
    # 0.1 aborted the whole rendezvous (until restart) on one such JOIN.
    rank, world_size, malformed = rogue
    with TCPRendezvousServer(port=0, world_size=2) as server:
        first = []
        holder = threading.Thread(target=lambda: first.extend(join_in_threads(server.port, [(1, 2, None)])))
        holder.start()  # rank 1 is taken by the genuine worker
        deadline = time.monotonic() + 60  # a safety net: the genuine worker's JOIN arrives first
        while not server._members and time.monotonic() < deadline:
            time.sleep(0.01)
        reply = rogue_join(server.port, rank, world_size, malformed=malformed)
        [zero] = join_in_threads(server.port, [(0, 2, None)])
        holder.join(30)
        assert not isinstance(zero, BaseException) and not isinstance(first[0], BaseException), (zero, first)
        assert server.groups_formed == 1
    if malformed:
        assert reply.startswith("server closed the connection") or "malformed" in reply, reply
    else:
        assert reply.startswith("rendezvous refused this worker: "), reply
        assert ("world_size=3" in reply) if world_size == 3 else ("claimed twice" in reply or "not in [0, 2)" in reply)


def test_torchrun_environment_is_all_a_worker_needs(monkeypatch):
    # MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE as torchrun, Slurm scripts and Kubernetes operators set
    # them; rank 0 starts the rendezvous server itself. The environment is per process, so the two
    # ranks are separate processes here.
    import subprocess
    import sys

    probe = socket.create_server(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    code = (
        "import numpy as np\n"
        "from everyo.distributed_tcp import init_tcp_process_group\n"
        "with init_tcp_process_group(timeout=30) as g:\n"
        "    print('sum', g.all_reduce_sum(np.array([g.rank + 1.0]))[0], g.rank, g.world_size)\n"
    )
    procs = []
    for rank in range(2):
        env = {
            **os.environ,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "WORLD_SIZE": "2",
            "EVERYO_TOKEN": "from-launcher",
        }
        env.pop(wire.TOKEN_ENV, None)
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
        )
    outputs = [p.communicate(timeout=60)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    assert "sum 3.0 0 2" in outputs[0] and "sum 3.0 1 2" in outputs[1]


def test_missing_launcher_variables_are_named(monkeypatch):
    for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(EveryODistributedError, match=r"\$MASTER_ADDR is not set.*torchrun"):
        init_tcp_process_group()
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "x")
    with pytest.raises(EveryODistributedError, match=r"\$MASTER_PORT='x' is not valid"):
        init_tcp_process_group()


def test_binding_beyond_loopback_without_a_token_warns():
    with pytest.warns(RuntimeWarning, match="without a token.*Pass token="):
        TCPRendezvousServer("0.0.0.0", 0, world_size=1).close()
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        TCPRendezvousServer("0.0.0.0", 0, world_size=1, token="secret").close()
        TCPRendezvousServer("127.0.0.1", 0, world_size=1).close()


def test_a_thousand_idle_and_garbage_connections_do_not_lock_workers_out():
    # 0.1: 64 silent connections made every genuine worker fail within milliseconds, and workers
    # did not retry. Now the oldest silent connection makes room and workers retry until their timeout.
    with TCPRendezvousServer(port=0, world_size=2) as server:
        idle, stop = [], threading.Event()

        def flood():
            while not stop.is_set() and len(idle) < 1000:
                try:
                    idle.append(socket.create_connection(("127.0.0.1", server.port), timeout=5))
                except OSError:
                    time.sleep(0.01)

        def garbage():
            while not stop.is_set():
                try:
                    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
                        s.sendall(os.urandom(64))
                except OSError:
                    pass
                time.sleep(0.002)

        threads = [threading.Thread(target=flood), threading.Thread(target=garbage)]
        for t in threads:
            t.start()
        while len(idle) < 300:
            time.sleep(0.01)
        out = join_in_threads(server.port, [(0, 2, None), (1, 2, None)], timeout=30)
        stop.set()
        for t in threads:
            t.join(10)
        for s in idle:
            s.close()
        assert not any(isinstance(e, BaseException) for e in out), out
        assert server.groups_formed == 1 and server.clients_rejected >= 300


def test_idle_connections_to_a_worker_port_do_not_delay_the_group():
    # 0.1 gave each stray on a worker's peer port 5 s: six of them failed a group with a 20 s timeout.
    from everyo.distributed.tcp import rendezvous

    strays, real_join = [], rendezvous._rendezvous

    def join_then_stray(sock, key, rank, world_size, listener, deadline, server):
        if rank == 0:  # before anybody connects to rank 0's peer port, ten strays do, and stay silent
            strays.extend(socket.create_connection(listener.getsockname()) for _ in range(10))
        return real_join(sock, key, rank, world_size, listener, deadline, server)

    rendezvous._rendezvous = join_then_stray
    try:
        with TCPRendezvousServer(port=0, world_size=3) as server:
            out = join_in_threads(server.port, [(0, 3, None), (1, 3, None), (2, 3, None)], timeout=4)
    finally:
        rendezvous._rendezvous = real_join
        for s in strays:
            s.close()
    assert not any(isinstance(e, BaseException) for e in out), out
    assert len(strays) == 10  # and the group formed within the 4 s timeout, which 0.1's 5 s per stray exceeded


@pytest.mark.parametrize("server_token, worker_token", [("right", "wrong"), ("right", None), (None, "extra")])
def test_wrong_token_is_refused(server_token, worker_token, monkeypatch):
    monkeypatch.delenv(wire.TOKEN_ENV, raising=False)
    with TCPRendezvousServer(port=0, world_size=1, token=server_token) as server:
        [error] = join_in_threads(server.port, [(0, 1, worker_token)])
        assert isinstance(error, EveryODistributedError)
        assert "token" in str(error) and "rank 0" in str(error)
        assert server.groups_formed == 0


def test_token_from_the_environment(monkeypatch):
    monkeypatch.setenv(wire.TOKEN_ENV, "from-env")
    results, errors, _ = run_in_threads(2, lambda g: g.all_reduce_sum(np.ones(3))[0])
    assert errors == [None, None] and results == [2.0, 2.0]
    # A worker that overrides the shared secret with another one is refused.
    with TCPRendezvousServer(port=0, world_size=1) as server:
        [error] = join_in_threads(server.port, [(0, 1, "not-from-env")])
    assert isinstance(error, EveryODistributedError) and "token" in str(error)


def test_rank_out_of_range_fails_before_connecting():
    with pytest.raises(ValueError, match="rank 2 is not in"):
        init_tcp_process_group("127.0.0.1", 1, 2, 2)
    with pytest.raises(TypeError):
        init_tcp_process_group("127.0.0.1", 1, 0.0, 2)


def test_rendezvous_timeout_names_the_cause():
    with TCPRendezvousServer(port=0, world_size=2) as server:
        start = time.monotonic()
        [error] = join_in_threads(server.port, [(0, 2, None)], timeout=0.5)
        assert time.monotonic() - start < 5
    assert isinstance(error, EveryODistributedError)
    assert "timed out after 0.5 s" in str(error) and "all 2 ranks" in str(error)


def test_no_server_at_all_times_out():
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    port = free.getsockname()[1]
    free.close()
    [error] = join_in_threads(port, [(0, 1, None)], timeout=0.3)
    assert isinstance(error, EveryODistributedError) and "timed out" in str(error)


def test_server_closed_while_a_worker_waits():
    server = TCPRendezvousServer(port=0, world_size=2)
    box = []
    thread = threading.Thread(target=lambda: box.append(join_in_threads(server.port, [(0, 2, None)])[0]))
    thread.start()
    time.sleep(0.5)
    server.close()
    thread.join(20)
    assert isinstance(box[0], EveryODistributedError) and "closed before the group formed" in str(box[0])


def test_a_worker_that_left_is_replaced_not_a_duplicate():
    with TCPRendezvousServer(port=0, world_size=2) as server:
        [gone] = join_in_threads(server.port, [(1, 2, None)], timeout=0.5)  # gives up, disconnects
        assert isinstance(gone, EveryODistributedError)
        time.sleep(0.2)
        out = join_in_threads(server.port, [(0, 2, None), (1, 2, None)])
        assert not any(isinstance(e, BaseException) for e in out), out
        assert server.groups_formed == 1


def garbage_clients(port):
    """Connections a rendezvous server must shrug off; returns the sockets (some left open)."""
    socks = []

    def connect():
        s = socket.create_connection(("127.0.0.1", port))
        socks.append(s)
        return s

    connect().sendall(os.urandom(1000))  # noise
    connect().sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")  # another protocol
    connect().sendall(wire.pack_header(wire.HELLO, 1 << 40))  # absurd length
    connect().sendall(wire.pack_header(wire.JOIN, 8) + bytes(8))  # wrong first frame
    hello = connect()  # valid hello, then junk
    hello.sendall(wire.pack_header(wire.HELLO, wire.NONCE_BYTES) + bytes(wire.NONCE_BYTES))
    hello.sendall(os.urandom(200))
    connect()  # silent, stays open
    connect().close()  # connects and leaves
    return socks


def test_server_survives_garbage_and_still_forms_the_group():
    with TCPRendezvousServer(port=0, world_size=2, handshake_timeout=1.0) as server:
        socks = garbage_clients(server.port)
        time.sleep(0.3)
        assert server._thread.is_alive()
        out = join_in_threads(server.port, [(0, 2, None), (1, 2, None)])
        assert not any(isinstance(e, BaseException) for e in out), out
        assert server.groups_formed == 1
        deadline = time.monotonic() + 5  # the silent client is dropped at its handshake deadline
        while server.clients_rejected < 7 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.clients_rejected == 7
        for s in socks:
            s.close()


def test_worker_talking_to_something_else_gets_a_protocol_error():
    listener = socket.create_server(("127.0.0.1", 0))

    def fake_server():
        conn, _ = listener.accept()
        with conn:
            conn.recv(1000)
            conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n" + bytes(wire.HEADER_SIZE))
            time.sleep(0.5)

    thread = threading.Thread(target=fake_server)
    thread.start()
    [error] = join_in_threads(listener.getsockname()[1], [(0, 1, None)], timeout=5)
    thread.join()
    listener.close()
    assert isinstance(error, wire.ProtocolError) and "not the everyo protocol" in str(error)


# -- collectives ------------------------------------------------------------------------------


def test_collective_mismatch_is_named_on_both_ranks():
    def body(group):
        if group.rank == 0:
            group.all_reduce_mean(np.ones(4, np.float32))
        else:
            group.barrier()

    _, errors, _ = run_in_threads(2, body)
    for e in errors:
        assert isinstance(e, EveryODistributedError)
        assert "collective mismatch" in str(e)
        assert "all_reduce_mean(size=4, dtype=float32) as collective #0" in str(e)
        assert "barrier() as collective #0" in str(e)


def test_size_mismatch_is_named():
    _, errors, _ = run_in_threads(2, lambda g: g.all_reduce_sum(np.ones(5 + g.rank)))
    assert all("size=5" in str(e) and "size=6" in str(e) for e in errors), errors


def test_peer_disconnecting_mid_collective():
    """Rank 1 sends half a frame and hangs up: rank 0 must fail at once, naming rank 1, not time out."""
    n = 200_000

    def body(group):
        x = np.ones(n, np.float32)
        if group.rank == 1:
            sock = group._socks[0]
            sock.setblocking(True)
            sock.sendall(
                group._header(
                    type(
                        "R",
                        (),
                        {"op": "all_reduce_sum", "dtype": "float32", "root": -1, "seq": 0, "size": n, "shape": str(n)},
                    )(),
                    n * 2,
                )
                + bytes(1000)
            )
            time.sleep(0.2)
            group.close()
            return None
        start = time.monotonic()
        try:
            group.all_reduce_sum(x)
        except EveryODistributedError as exc:
            return exc, time.monotonic() - start
        return "no error", None

    results, errors, _ = run_in_threads(2, body, timeout=600)
    assert errors == [None, None]
    error, _ = results[0]
    assert isinstance(error, EveryODistributedError), error
    # Noticed at the hang-up (a wait for the 600 s timeout would end in "timed out" instead).
    assert "rank 1 closed its connection" in str(error) and "rank 0, in all_reduce_sum" in str(error)


def test_garbage_from_a_peer_mid_collective_is_a_protocol_error():
    def body(group):
        if group.rank == 1:
            sock = group._socks[0]
            sock.setblocking(True)
            sock.sendall(b"\x00garbage" * 10)
            time.sleep(0.3)
            group.close()
            return None
        try:
            group.all_reduce_sum(np.ones(10))
        except EveryODistributedError as exc:
            return exc

    results, errors, _ = run_in_threads(2, body)
    assert errors == [None, None]
    assert isinstance(results[0], wire.ProtocolError)
    assert "rank 1 sent bytes that are not the everyo protocol" in str(results[0])


def test_failed_group_is_unusable_and_peers_fail_fast():
    def body(group):
        if group.rank == 1:
            return None  # leaves without calling: closes its connections
        first = second = None
        try:
            group.barrier()
        except EveryODistributedError as exc:
            first = exc
        try:
            group.barrier()
        except EveryODistributedError as exc:
            second = exc
        return first, second

    results, errors, _ = run_in_threads(2, body)
    first, second = results[0]
    assert "rank 1 closed its connection" in str(first)
    assert "unusable after an earlier failure" in str(second)


def test_collective_timeout_names_the_missing_rank():
    release = threading.Event()

    def body(group):
        if group.rank == 1:
            release.wait(10)  # alive, connected, but never calls the collective
            return None
        group.timeout = 0.5
        try:
            group.all_reduce_mean(np.ones(3))
        except EveryODistributedError as exc:
            return exc
        finally:
            release.set()

    results, errors, _ = run_in_threads(2, body)
    assert errors == [None, None]
    message = str(results[0])
    assert "timed out after 0.5 s waiting for rank(s) 1" in message and "same collectives" in message


def test_dtype_without_a_wire_code_is_refused_before_communicating():
    def body(group):
        try:
            group.all_reduce_sum(np.ones(3, np.longdouble))
        except EveryODistributedError as exc:
            return str(exc), group.all_reduce_sum(np.ones(2))[0]  # the group still works

    results, errors, _ = run_in_threads(2, body)
    assert errors == [None, None]
    for message, after in results:
        assert "has no code in the TCP wire format" in message and after == 2.0


def test_closed_group_refuses_collectives():
    results, errors, _ = run_in_threads(1, lambda g: g)
    with pytest.raises(EveryODistributedError, match="closed group"):
        results[0].barrier()


def test_peer_process_killed_while_rank_0_waits(tmp_path):
    """A real process (rank 1) is SIGKILLed while rank 0 waits in an all-reduce: rank 0 fails at once."""
    import subprocess
    import sys

    code = (
        "import os, signal, sys, time\n"
        "from everyo.distributed_tcp import init_tcp_process_group\n"
        "group = init_tcp_process_group('127.0.0.1', int(sys.argv[1]), 1, 2, timeout=30)\n"
        "time.sleep(0.3)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    with TCPRendezvousServer(port=0, world_size=2) as server:
        child = subprocess.Popen(
            [sys.executable, "-c", code, str(server.port)], env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        )
        try:
            # (with a 600 s timeout: a wait for it would end in "timed out", not in the message below)
            group = init_tcp_process_group("127.0.0.1", server.port, 0, 2, timeout=600)
            with group, pytest.raises(EveryODistributedError, match="rank 1 closed its connection"):
                group.all_reduce_mean(np.ones(10, np.float32))
            assert child.wait(120) == -9  # it really died by its own SIGKILL (120 s: a safety net only)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait(10)


def test_port_in_use_is_a_clear_error():
    with TCPRendezvousServer(port=0, world_size=1) as server:
        with pytest.raises(EveryODistributedError, match="cannot listen on 127.0.0.1.*another process holds the port"):
            TCPRendezvousServer(port=server.port, world_size=1)
    with pytest.raises(ValueError, match="world_size must be a positive int"):
        TCPRendezvousServer(port=0)
