"""all_gather, reduce_scatter, broadcast from every root and bfloat16 on all three backends (3 ranks each).

Every backend runs the same battery (``shm_workers.more_collectives_battery``);
each result is checked against a one-process NumPy reference written plainly
(a float64 loop in rank order, ``np.array_split`` for the blocks) and the three
backends must agree bit for bit. MPI ranks run this file as a program
(``python test_collectives.py OUT``) and write ``numpy.savez`` files.
"""

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import shm_workers  # noqa: E402
from mpi_launch import run_mpiexec  # noqa: E402
from shm_workers import GATHER_SIZES, SCATTER_ROWS, as_dtype, bits, gather_dtypes, rank_array  # noqa: E402

WORLD = 3


def mpi_child(out_dir):
    from everyo.distributed_mpi import init_mpi_process_group

    if out_dir.endswith("shapes"):  # one fresh group per operation: a mismatch breaks the group
        messages = {}
        for op in shm_workers.SHAPE_OPS:
            with init_mpi_process_group() as group:
                messages[op] = shm_workers.shape_mismatch(group, op)
        with open(os.path.join(out_dir, f"rank{group.rank}.json"), "w") as f:
            json.dump(messages, f)
        return
    with init_mpi_process_group() as group:
        result = shm_workers.more_collectives_battery(group)
        mismatch = result.pop("mismatch")
        np.savez(os.path.join(out_dir, f"rank{group.rank}.npz"), mismatch=np.array(json.dumps(mismatch)), **result)


def run_shm():
    from everyo.distributed import spawn

    return spawn(shm_workers.more_collectives_battery, WORLD, timeout=120)


def run_tcp():
    from test_tcp_collectives import run_in_threads

    results, errors, _ = run_in_threads(WORLD, shm_workers.more_collectives_battery)
    assert errors == [None] * WORLD, errors
    return results


def run_mpi(tmp_path):
    returncode, output = run_mpiexec(WORLD, [__file__, tmp_path], timeout=120)
    assert returncode == 0, output[-4000:]
    results = []
    for rank in range(WORLD):
        with np.load(tmp_path / f"rank{rank}.npz", allow_pickle=False) as data:
            result = {k: data[k] for k in data.files if k != "mismatch"}
            result["mismatch"] = json.loads(str(data["mismatch"]))
        results.append(result)
    return results


@pytest.fixture(scope="module")
def backends(tmp_path_factory):
    return {"shm": run_shm(), "tcp": run_tcp(), "mpi": run_mpi(tmp_path_factory.mktemp("mpi"))}


def rank_order(dtype, shape, mean):
    """The one-process reference: float64 (or int64) accumulation in rank order, rounded once."""
    inputs = [rank_array(r, dtype, shape) for r in range(WORLD)]
    if as_dtype(dtype).kind in "fV":
        acc = inputs[0].astype(np.float64)
        for x in inputs[1:]:
            acc = acc + x.astype(np.float64)
        return (acc / WORLD if mean else acc).astype(as_dtype(dtype))
    acc = inputs[0].astype(np.int64)
    for x in inputs[1:]:
        acc = acc + x.astype(np.int64)
    return acc.astype(dtype)


def expected(key, rank):
    kind, dtype, n = key.split("|")
    n = int(n)
    if kind == "gather":
        return bits(np.stack([rank_array(r, dtype, (n,)) for r in range(WORLD)]))
    if kind in ("rs_sum", "rs_mean"):
        full = rank_order(dtype, (n, 3), mean=kind == "rs_mean")
        return bits(np.array_split(full, WORLD)[rank])
    if kind == "bcast":
        return bits(rank_array(n, dtype, (100_003,)))
    if kind in ("ar_sum", "ar_mean"):
        return bits(rank_order(dtype, (n,), mean=kind == "ar_mean"))
    raise KeyError(key)


@pytest.mark.parametrize("backend", ["shm", "tcp", "mpi"])
def test_every_result_matches_the_one_process_reference(backends, backend):
    results = backends[backend]
    keys = set(results[0]) - {"mismatch"}
    assert len(keys) > 100
    assert any(k.startswith("gather|bool") for k in keys)
    for rank, result in enumerate(results):
        for key in sorted(keys):
            want = expected(key, rank)
            assert result[key].shape == want.shape, (backend, rank, key)
            assert np.array_equal(result[key], want), (backend, rank, key)


def test_the_three_backends_agree_bit_for_bit(backends):
    for rank in range(WORLD):
        for key in backends["shm"][rank]:
            if key != "mismatch":
                assert np.array_equal(backends["tcp"][rank][key], backends["shm"][rank][key]), key
                assert np.array_equal(backends["mpi"][rank][key], backends["shm"][rank][key]), key


def test_gather_and_scatter_cover_the_shapes_and_bfloat16(backends):
    keys = set(backends["shm"][0])
    for size in GATHER_SIZES:
        assert f"gather|float32|{size}" in keys
    for rows in SCATTER_ROWS:
        assert f"rs_mean|float64|{rows}" in keys
    if "bfloat16" in gather_dtypes():
        assert "ar_mean|bfloat16|100003" in keys
        # Rows split 2 / 2 / 1 for five rows, as np.array_split does.
        assert [backends["shm"][r]["rs_sum|float32|5"].shape[0] for r in range(WORLD)] == [2, 2, 1]


@pytest.mark.parametrize("backend", ["shm", "tcp", "mpi"])
def test_mismatched_all_gather_raises_on_every_rank(backends, backend):
    messages = [r["mismatch"] for r in backends[backend]]
    assert all(m.startswith("EveryODistributedError") for m in messages), messages
    named = [m for m in messages if "collective mismatch" in m]
    assert named, messages
    # shm and MPI compare every rank's record: each rank sees all three sizes; a TCP rank sees its neighbour's.
    assert all("all_gather(size=" in m for m in named)
    if backend != "tcp":
        assert all(all(f"size={n}" in m for n in (5, 6, 7)) for m in named)


def test_two_rank_large_float_reductions_on_shared_memory():
    from everyo.distributed import spawn

    results = spawn(shm_workers.large_pair_reductions, 2, timeout=60)
    for dtype in ("float16", "float32", "float64"):
        for mean in (False, True):
            want = shm_workers.rank_order_reference(dtype, 100_003, mean, 2)
            for r in results:
                assert r[dtype][mean].tobytes() == want.tobytes(), (dtype, mean)


def test_local_refusals_do_not_break_the_group():
    from test_tcp_collectives import run_in_threads

    from everyo.errors import EveryODistributedError

    def body(group):
        errors = []
        for call in (
            lambda: group.reduce_scatter_sum(np.float32(1.0)),
            lambda: group.reduce_scatter_mean(np.arange(4)),
            lambda: group.all_reduce_sum(np.ones(2, bool)),
            lambda: group.broadcast(np.ones(2), root=-1),
        ):
            try:
                call()
            except EveryODistributedError as exc:
                errors.append(str(exc))
        return errors, group.all_gather(np.array([group.rank]))

    results, errors, _ = run_in_threads(2, body)
    assert errors == [None, None]
    for messages, gathered in results:
        assert len(messages) == 4
        assert "0-d array has no rows" in messages[0] and "would truncate" in messages[1]
        assert "reduce_scatter_sum and divide" in messages[1]
        assert "bool for broadcast and all_gather" in messages[2] and "root -1" in messages[3]
        assert gathered.tolist() == [[0], [1]]


def test_tcp_broadcast_and_all_gather_are_rings_streamed_in_segments(monkeypatch):
    import threading

    from test_tcp_collectives import run_in_threads

    import everyo.distributed.tcp.group as tcp
    from everyo.distributed.tcp import wire

    monkeypatch.setattr(tcp, "_SEGMENT_BYTES", 4096)  # 100_003 float32 -> 98 segments per broadcast
    sent, lock, real_transfer = [], threading.Lock(), wire.transfer

    def recording_transfer(socks, outgoing, incoming, *args):
        me = ({0, 1, 2} - set(socks)).pop()
        with lock:
            sent.extend((me, frame.peer, sum(len(v) for v in frame.views) - wire.HEADER_SIZE) for frame in outgoing)
        return real_transfer(socks, outgoing, incoming, *args)

    monkeypatch.setattr(wire, "transfer", recording_transfer)

    def body(group):
        x = rank_array(group.rank, "float32", (100_003,))
        return group.broadcast(x, root=1), group.all_gather(x[:5000]), group.reduce_scatter_mean(x.reshape(-1, 1))

    results, errors, _ = run_in_threads(WORLD, body)
    assert errors == [None] * WORLD, errors
    for rank, (bcast, gathered, scattered) in enumerate(results):
        assert np.array_equal(bits(bcast), expected("bcast|float32|1", rank)[:100_003])
        assert np.array_equal(gathered, np.stack([rank_array(r, "float32", (100_003,))[:5000] for r in range(WORLD)]))
        want = np.array_split(rank_order("float32", (100_003,), mean=True), WORLD)[rank]
        assert np.array_equal(bits(scattered.reshape(-1)), bits(want))
    payload = {}
    for me, peer, n in sent:
        payload[me, peer] = payload.get((me, peer), 0) + n
    # Broadcast from 1: 1 -> 2 -> 0 carry the array, 0 -> 1 only closes the ring of checks (empty frame);
    # all-gather: each rank sends only to the next; reduce-scatter: everyone sends each owner its block.
    array, block = 100_003 * 4, 5000 * 4
    assert payload[1, 2] == array + 2 * block + 33_334 * 4
    assert payload[2, 0] == array + 2 * block + 33_335 * 4  # rows split 33_335 / 33_334 / 33_334
    assert payload[0, 1] == 0 + 2 * block + 33_334 * 4
    assert payload.get((1, 0), 0) == 33_335 * 4 and payload.get((2, 1), 0) == 33_334 * 4
    assert payload.get((0, 2), 0) == 33_334 * 4


def check_shape_messages(messages):
    assert all(m.startswith(("EveryODistributedError", "PeerFailedError", "PeerLost")) for m in messages), messages
    named = [m for m in messages if "collective mismatch" in m]
    assert named, messages  # (over TCP a rank may instead see its neighbour leave)
    assert all("shape=(2, 6)" in m and "shape=(3, 4)" in m and "size=12" in m for m in named), named


@pytest.mark.parametrize("op", shm_workers.SHAPE_OPS)
def test_same_size_different_shapes_is_a_named_mismatch_on_shared_memory_and_tcp(op):
    # 0.2 compared only size and dtype: all_gather of (2, 6) and (3, 4) returned inconsistent results.
    from test_tcp_collectives import run_in_threads

    from everyo.distributed import spawn

    check_shape_messages(spawn(shm_workers.shape_mismatch, 2, args=(op,), timeout=120))
    tcp, errors, _ = run_in_threads(2, lambda group: shm_workers.shape_mismatch(group, op))
    assert errors == [None, None], errors
    check_shape_messages(tcp)


def test_same_size_different_shapes_is_a_named_mismatch_under_mpi(tmp_path):
    out = tmp_path / "shapes"
    out.mkdir()
    returncode, output = run_mpiexec(2, [__file__, out], timeout=120)
    assert returncode == 0, output[-4000:]
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    for op in shm_workers.SHAPE_OPS:
        messages = [r[op] for r in ranks]
        check_shape_messages(messages)
        assert all("collective mismatch" in m for m in messages)  # MPI compares every rank's record


if __name__ == "__main__":
    mpi_child(sys.argv[1])
