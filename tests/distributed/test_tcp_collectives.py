"""The TCP process group on 127.0.0.1: collectives against NumPy, the spec's training against one process.

Protocol-level tests run the ranks as threads of this process (real sockets,
fast); the training test runs them as processes started by
``everyo.distributed.spawn``, which rank 0 also uses to tell the others the
port its rendezvous server picked.
"""

import socket
import threading
import time

import numpy as np
import pytest
import shm_workers
from shm_workers import DTYPES, SIZES, rank_data

from everyo.distributed import spawn
from everyo.distributed.tcp import wire
from everyo.distributed_tcp import TCPProcessGroup, TCPRendezvousServer, init_tcp_process_group

WORLD = 3


def run_in_threads(world_size, body, *, timeout=20.0, tokens=None, server_token=None, join_timeout=60.0):
    """Form a group of ``world_size`` thread ranks and run ``body(group)`` on each.

    Returns ``(results, errors, server)``: per rank, what ``body`` returned or
    the exception it (or ``init_tcp_process_group``) raised. The server is closed.
    """
    results, errors = [None] * world_size, [None] * world_size
    with TCPRendezvousServer(port=0, world_size=world_size, token=server_token) as server:

        def rank_main(rank):
            try:
                token = None if tokens is None else tokens[rank]
                with init_tcp_process_group(
                    "127.0.0.1", server.port, rank, world_size, timeout=timeout, token=token
                ) as group:
                    results[rank] = body(group)
            except BaseException as exc:  # noqa: B902 - reported to the test
                errors[rank] = exc

        threads = [threading.Thread(target=rank_main, args=(r,), daemon=True) for r in range(world_size)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(join_timeout)
        assert not any(t.is_alive() for t in threads), "a rank thread hung"
    assert not server._thread.is_alive()
    return results, errors, server


def reference(dtype, size, mean, world=WORLD):
    return shm_workers.rank_order_reference(dtype, size, mean, world)


@pytest.fixture(scope="module")
def battery():
    results, errors, server = run_in_threads(WORLD, shm_workers.collectives_battery)
    assert errors == [None] * WORLD, errors
    assert server.groups_formed == 1
    return results


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("size", SIZES)
def test_sum_mean_broadcast_match_numpy_and_agree_bitwise(battery, dtype, size):
    # SIZES cover both algorithms: up to 64 KiB everybody sends everything (one round trip),
    # above it (100_003 elements) the reduction is split into per-rank blocks.
    for result in battery:
        got = result["sum"][dtype, size]
        assert got.dtype == np.dtype(dtype) and got.shape == (size,)
        assert got.tobytes() == reference(dtype, size, mean=False).tobytes()
        if np.dtype(dtype).kind == "f":
            assert result["mean"][dtype, size].tobytes() == reference(dtype, size, mean=True).tobytes()
        assert result["bcast"][dtype, size].tobytes() == rank_data(size % WORLD, dtype, size).tobytes()


def test_float64_accumulation_shape_bool_and_local_errors(battery):
    for result in battery:
        assert result["cancel32"] == 1.0 and result["cancel16"] == 1.0  # float32 accumulation would give 0
        np.testing.assert_array_equal(result["matrix_sum"], np.arange(12, dtype=np.float32).reshape(3, 4) * 6)
        np.testing.assert_array_equal(result["bool_bcast"], np.array([True, False]) ^ True)
        assert {"int_mean", "bool_sum", "bad_root"} <= set(result["errors"])
        assert "would truncate" in result["errors"]["int_mean"]
        assert result["after"].tolist() == [0 + 1 + 2]  # refused calls did not break the group


def test_barrier_waits_for_the_slowest_rank(battery):
    # Rank r reaches the barrier r * 50 ms late; nobody may leave before the last arrival.
    last_arrival = max(r["barrier"][0] for r in battery)
    assert all(r["barrier"][1] >= last_arrival for r in battery)


def test_world_size_one():
    results, errors, _ = run_in_threads(
        1, lambda g: (g.all_reduce_mean(np.arange(4.0)), g.broadcast(np.ones(2)), g.barrier(), g.rank, g.world_size)
    )
    assert errors == [None]
    mean, bcast, _, rank, world = results[0]
    assert mean.tolist() == [0, 1, 2, 3] and bcast.tolist() == [1, 1] and (rank, world) == (0, 1)


def test_the_server_forms_one_group_after_another():
    for _ in range(2):
        results, errors, _server = run_in_threads(2, lambda g: g.all_reduce_sum(np.array([g.rank + 1.0])))
        assert errors == [None, None] and [r.tolist() for r in results] == [[3.0], [3.0]]
    with TCPRendezvousServer(port=0, world_size=2) as server:
        groups = [None, None]

        def join(rank):
            groups[rank] = init_tcp_process_group("127.0.0.1", server.port, rank, 2, timeout=10)

        for _ in range(2):
            threads = [threading.Thread(target=join, args=(r,)) for r in range(2)]
            [t.start() for t in threads]
            [t.join(30) for t in threads]
            for g in groups:
                g.close()
        assert server.groups_formed == 2


def test_data_moves_point_to_point_not_through_rank_0():
    """With 3 ranks, ranks 1 and 2 hold a connection to each other and the server holds none."""

    def body(group):
        peers = sorted(group._socks)
        local = {group._socks[p].getsockname()[1] for p in peers}
        return peers, local, group.all_reduce_sum(np.full(50_000, group.rank, np.float32))[:3].tolist()

    results, errors, server = run_in_threads(3, body)
    assert errors == [None] * 3
    assert [r[0] for r in results] == [[1, 2], [0, 2], [0, 1]]
    assert all(r[2] == [3.0, 3.0, 3.0] for r in results)
    assert server.port not in set().union(*(r[1] for r in results))


@pytest.mark.parametrize("world", [2, 3])
def test_streamed_segments_match_numpy(monkeypatch, world):
    """Large all-reduces stream each block in segments; tiny segments here make many, with ragged ends."""
    import everyo.distributed.tcp.group as tcp

    monkeypatch.setattr(tcp, "_SEGMENT_BYTES", 4096)
    cases = [("float32", 70_001), ("float64", 33_337), ("int64", 20_011), ("float16", 90_001)]

    def body(group):
        return {
            (dtype, n, op): getattr(group, op)(rank_data(group.rank, dtype, n))
            for dtype, n in cases
            for op in ("all_reduce_sum", "all_reduce_mean")
            if op == "all_reduce_sum" or np.dtype(dtype).kind == "f"
        }

    results, errors, _ = run_in_threads(world, body)
    assert errors == [None] * world, errors
    for (dtype, n, op), got in results[0].items():
        expected = reference(dtype, n, op == "all_reduce_mean", world)
        assert got.tobytes() == expected.tobytes(), (dtype, n, op)
        assert all(r[dtype, n, op].tobytes() == got.tobytes() for r in results)


def test_large_results_are_recycled_only_once_dropped():
    """The last large result's memory is reused when the caller let it go, never while it is held."""

    def body(group):
        x = np.full(600_000, group.rank + 1.0, np.float32)  # 2.4 MB: above the recycling size
        held = group.all_reduce_sum(x)
        view_of_held = held[10:20]
        second = group.all_reduce_sum(x * 2)  # `held` is alive: must not be overwritten
        intact = bool((held == 3).all() and (view_of_held == 3).all()) and not np.shares_memory(held, second)
        second_ok = bool((second == 6).all())
        second_address = second.__array_interface__["data"][0]
        del held, view_of_held, second
        third = group.all_reduce_sum(x * 3)
        return intact, second_ok and bool((third == 9).all()), third.__array_interface__["data"][0] == second_address

    results, errors, _ = run_in_threads(2, body)
    assert errors == [None, None]
    assert all(r == (True, True, True) for r in results)


# -- the spec's training example through TCP ----------------------------------------------------


def tcp_spec_worker(shm_group, inputs, targets, steps):
    """Rank 0 starts the rendezvous server; the shared-memory group only carries its port."""
    server = TCPRendezvousServer(port=0, world_size=shm_group.world_size) if shm_group.rank == 0 else None
    try:
        port = int(shm_group.broadcast(np.array([server.port if server else 0]), root=0)[0])
        with init_tcp_process_group("127.0.0.1", port, shm_group.rank, shm_group.world_size, timeout=60) as group:
            assert isinstance(group, TCPProcessGroup)
            return shm_workers.spec_worker(group, inputs, targets, steps)
    finally:
        if server is not None:
            server.close()


one_process = shm_workers.one_process


def test_spec_training_through_tcp_matches_one_process_and_shared_memory(recwarn):
    rng = np.random.default_rng(0)
    inputs = rng.standard_normal((256, 16)).astype(np.float32)
    targets = np.sin(inputs[:, :1] * 2).astype(np.float32)
    steps = 15
    reference = one_process(inputs, targets, steps)
    tcp = spawn(tcp_spec_worker, 2, args=(inputs, targets, steps), timeout=120)
    for a, b in zip(tcp[0], tcp[1]):
        assert a.tobytes() == b.tobytes()  # every rank ends bit-identical
    moved = max(float(np.abs(r - p.data).max()) for r, p in zip(reference, shm_workers.build_spec_model().parameters()))
    drift = max(float(np.abs(a - r).max()) for a, r in zip(tcp[0], reference))
    assert moved > 1e-2 and drift < 1e-5
    # Same reduction, same order as the shared-memory group: the same bits.
    shm = spawn(shm_workers.spec_worker, 2, args=(inputs, targets, steps), timeout=120)
    assert all(a.tobytes() == b.tobytes() for a, b in zip(tcp[0], shm[0]))


# -- wire format -------------------------------------------------------------------------------


def test_header_round_trip_and_bounds():
    raw = wire.pack_header(wire.DATA, 12, op=1, dtype=2, root=-1, seq=7, count=3, shape=b"3")
    assert len(raw) == wire.HEADER_SIZE == 72
    assert wire.unpack_header(raw, "peer") == (wire.DATA, 1, 2, -1, 7, 3, 12, b"3" + bytes(31))
    with pytest.raises(wire.ProtocolError, match="not the everyo protocol"):
        wire.unpack_header(b"GET / HTTP/1.1\r\n" + bytes(56), "peer")
    with pytest.raises(wire.ProtocolError, match="wire version 9"):
        wire.unpack_header(wire.HEADER.pack(wire.MAGIC, 9, 1, 0, 0, 0, 0, 0, 0, b""), "peer")
    with pytest.raises(wire.ProtocolError, match="malformed"):
        wire.unpack_header(wire.HEADER.pack(wire.MAGIC, wire.VERSION, 99, 0, 0, 0, 0, 0, 0, b""), "peer")


def test_oversized_length_is_refused_before_reading_the_payload():
    a, b = socket.socketpair()
    with a, b:
        # Announce a 1 GiB control frame and send nothing more: the reader must refuse at once, not wait.
        a.sendall(wire.pack_header(wire.HELLO, 1 << 30))
        # (A reader that waited for the payload would time out instead, with another error.)
        with pytest.raises(wire.ProtocolError, match="limit is"):
            wire.recv_frame(b, (wire.HELLO,), time.monotonic() + 60, "peer", "test")


def test_token_resolution(monkeypatch):
    monkeypatch.delenv(wire.TOKEN_ENV, raising=False)
    assert wire.resolve_token(None) == b""
    monkeypatch.setenv(wire.TOKEN_ENV, "s3cret")
    assert wire.resolve_token(None) == b"s3cret"
    assert wire.resolve_token("other") == b"other" and wire.resolve_token(b"raw") == b"raw"
    with pytest.raises(TypeError):
        wire.resolve_token(123)
