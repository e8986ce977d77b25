"""The MPI process group under a real ``mpiexec``: the spec's training against one process, collectives against NumPy.

The MPI ranks run this file as a program (``python test_mpi.py train|battery OUT``)
and write their results with ``numpy.savez`` (no pickle); the tests read them
back and compare. Skipped, with the reason, only when mpi4py is not installed.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import shm_workers  # noqa: E402
from mpi_launch import run_mpiexec  # noqa: E402
from shm_workers import DTYPES, SIZES, rank_data  # noqa: E402

TRAIN_STEPS = 15


def training_data():
    rng = np.random.default_rng(0)
    inputs = rng.standard_normal((256, 16)).astype(np.float32)
    return inputs, np.sin(inputs[:, :1] * 2).astype(np.float32)


def edge_cases():
    """Two ranks' inputs where a float32/float64 shortcut could differ from the float64 path."""
    cases = {}
    for dtype in (np.float32, np.float64):
        info = np.finfo(dtype)
        rng = np.random.default_rng(0)
        plain = np.concatenate(
            [
                rng.standard_normal(2000),
                rng.standard_normal(2000) * info.tiny * 4,  # near the subnormal range
                rng.standard_normal(200) * info.smallest_subnormal * 7,  # subnormals
                rng.standard_normal(2000) * 2.0 ** rng.integers(info.minexp - 20, info.maxexp - 2, 2000),
            ]
        ).astype(dtype)
        special = np.concatenate(
            [
                plain,
                np.full(10, info.max * 0.75, dtype),  # sums overflow, means do not
                np.array([np.inf, -np.inf, np.nan, 0.0, -0.0], dtype),
            ]
        )
        for name, base in (("plain", plain), ("special", special)):
            cases[f"{np.dtype(dtype).name}|{name}"] = (base, base[::-1].copy())
    return cases


# -- what each MPI rank runs ---------------------------------------------------------------------


def child(mode, out_dir):
    from everyo.distributed_mpi import MPIProcessGroup, init_mpi_process_group

    group = init_mpi_process_group()
    assert isinstance(group, MPIProcessGroup)
    arrays = {}
    if mode == "train":
        weights = shm_workers.spec_worker(group, *training_data(), TRAIN_STEPS)
        arrays = {f"w{i}": w for i, w in enumerate(weights)}
    elif mode == "edges":
        for name, (a, b) in edge_cases().items():
            mine = a if group.rank == 0 else b
            arrays[f"sum|{name}"] = group.all_reduce_sum(mine)
            arrays[f"mean|{name}"] = group.all_reduce_mean(mine)
    else:
        result = shm_workers.collectives_battery(group)
        for key in ("sum", "mean", "bcast"):
            for (dtype, size), value in result[key].items():
                arrays[f"{key}|{dtype}|{size}"] = value
        for key in ("cancel32", "cancel16", "matrix_sum", "bool_bcast", "after"):
            arrays[key] = result[key]
        arrays["barrier"] = np.array(result["barrier"])
        errors = dict(result["errors"])
        try:
            group.all_reduce_sum(np.ones(5 + group.rank, np.float32))  # sizes 5, 6, 7
        except Exception as exc:  # noqa: BLE001 - recorded for the test
            errors["mismatch"] = f"{type(exc).__name__}: {exc}"
        arrays["errors"] = np.array(json.dumps(errors))
    np.savez(os.path.join(out_dir, f"rank{group.rank}.npz"), world=np.array(group.world_size), **arrays)
    group.close()


# -- the tests ----------------------------------------------------------------------------------


def run_mpi(world_size, mode, tmp_path):
    returncode, output = run_mpiexec(world_size, [__file__, mode, tmp_path], timeout=120)
    assert returncode == 0, f"mpiexec exited with {returncode}:\n{output[-4000:]}"
    results = []
    for rank in range(world_size):
        with np.load(tmp_path / f"rank{rank}.npz", allow_pickle=False) as data:
            results.append({k: data[k] for k in data.files})
    assert all(int(r["world"]) == world_size for r in results)
    return results


def test_missing_mpi4py_gives_the_install_hint(monkeypatch):
    import everyo.distributed_mpi as dm

    monkeypatch.setitem(sys.modules, "mpi4py", None)  # makes `from mpi4py import MPI` fail
    with pytest.raises(ImportError, match=r"pip install everyo-distributed\[mpi\]"):
        dm.init_mpi_process_group()


def test_spec_training_under_mpiexec_matches_one_process(tmp_path):
    from shm_workers import one_process

    from everyo.distributed import spawn

    ranks = run_mpi(2, "train", tmp_path)
    weights = [[r[f"w{i}"] for i in range(len(r) - 1)] for r in ranks]
    for a, b in zip(*weights):
        assert a.tobytes() == b.tobytes()  # both ranks end bit-identical
    inputs, targets = training_data()
    reference = one_process(inputs, targets, TRAIN_STEPS)
    drift = max(float(np.abs(a - r).max()) for a, r in zip(weights[0], reference))
    moved = max(float(np.abs(r - p.data).max()) for r, p in zip(reference, shm_workers.build_spec_model().parameters()))
    assert moved > 1e-2 and drift < 1e-5
    # With two ranks a float64 sum does not depend on the order, so MPI gives the shared-memory bits.
    shm = spawn(shm_workers.spec_worker, 2, args=(inputs, targets, TRAIN_STEPS), timeout=120)
    assert all(a.tobytes() == b.tobytes() for a, b in zip(weights[0], shm[0]))


def test_two_rank_shortcuts_give_the_float64_bits(tmp_path):
    """Two ranks' float sum and mean go through one native Allreduce; the bits must be the float64 path's."""
    ranks = run_mpi(2, "edges", tmp_path)
    for name, (a, b) in edge_cases().items():
        with np.errstate(all="ignore"):
            total = a.astype(np.float64) + b.astype(np.float64)
            expected = {"sum": total.astype(a.dtype), "mean": (total / 2).astype(a.dtype)}
        for op, want in expected.items():
            for r in ranks:
                got = r[f"{op}|{name}"]
                assert got.dtype == a.dtype and got.tobytes() == want.tobytes(), (op, name)


@pytest.fixture(scope="module")
def battery(tmp_path_factory):
    return run_mpi(3, "battery", tmp_path_factory.mktemp("mpi_battery"))


@pytest.mark.parametrize("dtype", DTYPES)
def test_collectives_under_mpiexec_match_numpy(battery, dtype):
    for size in SIZES:
        for key, mean in (("sum", False), ("mean", True)):
            name = f"{key}|{dtype}|{size}"
            if name not in battery[0]:
                continue
            expected = shm_workers.rank_order_reference(dtype, size, mean, 3)
            for r in battery:
                assert r[name].dtype == np.dtype(dtype) and r[name].shape == (size,)
                # Alltoallv + rank-order reduction: the same bits as the other backends, with 3 ranks too.
                assert r[name].tobytes() == expected.tobytes(), name
                assert r[name].tobytes() == battery[0][name].tobytes()  # every rank, same bits
            bcast = f"bcast|{dtype}|{size}"
            assert all(r[bcast].tobytes() == rank_data(size % 3, dtype, size).tobytes() for r in battery)


def test_mpi_float64_accumulation_errors_and_barrier(battery):
    for r in battery:
        assert r["cancel32"] == 1.0 and r["cancel16"] == 1.0
        np.testing.assert_array_equal(r["matrix_sum"], np.arange(12, dtype=np.float32).reshape(3, 4) * 6)
        np.testing.assert_array_equal(r["bool_bcast"], np.array([True, False]) ^ True)
        assert r["after"].tolist() == [3]
        errors = json.loads(str(r["errors"]))
        assert "would truncate" in errors["int_mean"] and "not supported" in errors["bool_sum"]
        assert "collective mismatch" in errors["mismatch"]
        assert all(f"size={n}" in errors["mismatch"] for n in (5, 6, 7))
    last_arrival = max(r["barrier"][0] for r in battery)
    assert all(r["barrier"][1] >= last_arrival for r in battery)


RAISES = """
import sys, time
import numpy as np
from everyo.distributed_mpi import init_mpi_process_group
group = init_mpi_process_group()
with open("/proc/self/maps") as maps:
    segments = sorted({line.split()[5] for line in maps if "/mpich_shm_" in line})
print("segments:", ",".join(segments), flush=True)
group.all_reduce_sum(np.ones(1000))  # the ranks have communicated
if group.rank == 1:
    time.sleep(0.2)
    raise ValueError("boom on rank 1")
group.barrier()          # rank 0 waits here for a rank that will never come
print("rank 0 got past the barrier")
"""


def test_an_uncaught_exception_on_one_rank_aborts_the_whole_job(tmp_path):
    # 0.1: `mpiexec -n 2 python script.py` hung forever (rank 1 waited in MPI_Finalize, rank 0 in the
    # barrier). The communicate() timeout below is only the hang detector; the abort takes well under 5 s.
    import time

    script = tmp_path / "raises.py"
    script.write_text(RAISES)
    start = time.monotonic()
    try:
        returncode, output = run_mpiexec(2, [script], timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("the MPI job hung after an exception on rank 1")
    print(f"aborted after {time.monotonic() - start:.2f} s")
    assert returncode != 0
    assert "ValueError: boom on rank 1" in output and "aborting the MPI job" in output
    assert "got past the barrier" not in output
    # MPICH's own /dev/shm/mpich_shm_* segment was unlinked once every rank had mapped it, so the
    # abort leaves it behind no more (MPICH itself unlinks it only in MPI_Finalize).
    segments = {s for line in output.splitlines() if line.startswith("segments:") for s in line[9:].strip().split(",")}
    segments.discard("")
    assert segments, output  # MPICH mapped one (two local ranks)
    assert not [s for s in segments if os.path.exists(s)], segments


if __name__ == "__main__":
    child(sys.argv[1], sys.argv[2])
