"""The shared-memory group's collectives against a NumPy reference (one spawn, three ranks)."""

import warnings

import numpy as np
import pytest
import shm_workers
from shm_workers import DTYPES, SIZES, rank_data

from everyo.distributed import available_cores, spawn

pytestmark = pytest.mark.usefixtures("no_leftovers")
WORLD = 3


@pytest.fixture(scope="module")
def battery():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = spawn(shm_workers.collectives_battery, WORLD, timeout=120)
    oversubscribed = [w for w in caught if "time-share" in str(w.message)]
    assert bool(oversubscribed) == (available_cores() < WORLD)
    return results


def reference(dtype, size, mean):
    return shm_workers.rank_order_reference(dtype, size, mean, WORLD)


def test_results_come_back_by_rank(battery):
    assert [r["rank"] for r in battery] == list(range(WORLD))
    assert all(r["world_size"] == WORLD for r in battery)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("size", SIZES)
def test_sum_mean_broadcast_match_numpy_and_agree_bitwise(battery, dtype, size):
    for result in battery:
        got = result["sum"][dtype, size]
        assert got.dtype == np.dtype(dtype) and got.shape == (size,)
        np.testing.assert_array_equal(got, reference(dtype, size, mean=False))
        if np.dtype(dtype).kind == "f":
            mean = result["mean"][dtype, size]
            assert mean.dtype == np.dtype(dtype)
            np.testing.assert_array_equal(mean, reference(dtype, size, mean=True))
        root = size % WORLD
        np.testing.assert_array_equal(result["bcast"][dtype, size], rank_data(root, dtype, size))
    # Bit-identical across ranks (compare raw bytes: NaN-safe, -0.0-safe).
    for key in ("sum", "mean", "bcast"):
        if (dtype, size) in battery[0][key]:
            first = battery[0][key][dtype, size].tobytes()
            assert all(r[key][dtype, size].tobytes() == first for r in battery)


def test_reduction_accumulates_in_float64(battery):
    # Ranks hold 1, 2**k, -2**k: accumulating in the input dtype would round
    # 1 + 2**k to 2**k and return 0; float64 keeps the 1.
    for result in battery:
        assert result["cancel32"].dtype == np.float32 and result["cancel32"] == 1.0
        assert result["cancel16"].dtype == np.float16 and result["cancel16"] == 1.0


def test_shape_is_kept(battery):
    expected = np.arange(12, dtype=np.float32).reshape(3, 4) * sum(range(1, WORLD + 1))
    for result in battery:
        np.testing.assert_array_equal(result["matrix_sum"], expected)


def test_other_inputs(battery):
    factor = sum(range(1, WORLD + 1))
    for result in battery:
        assert result["big_endian"].dtype == np.float32 and result["big_endian"].dtype.isnative
        np.testing.assert_array_equal(result["big_endian"], np.arange(4) * factor)
        np.testing.assert_array_equal(result["tensor"], np.full(3, np.mean(range(WORLD)), np.float32))
        assert result["list"].dtype == np.float64 and result["list"].tolist() == [WORLD, 2.0 * WORLD]
        assert result["scalar"].shape == () and result["scalar"] == 2.5


def test_broadcast_of_bool(battery):
    expected = np.array([True, False]) ^ True  # rank 1's array
    for result in battery:
        np.testing.assert_array_equal(result["bool_bcast"], expected)


def test_refused_calls_raise_clear_errors_and_leave_the_group_usable(battery):
    for result in battery:
        errors = result["errors"]
        assert "integer dtype int64 would truncate the mean" in errors["int_mean"]
        assert "dtype bool is not supported" in errors["bool_sum"]
        assert f"root {WORLD} is not a rank of this group" in errors["bad_root"]
        assert all(e.startswith("EveryODistributedError") for e in errors.values())
        assert result["after"].tolist() == [sum(range(WORLD))]


def test_barrier_waits_for_the_slowest_rank(battery):
    last_arrival = max(r["barrier"][0] for r in battery)
    assert all(r["barrier"][1] >= last_arrival for r in battery)


def test_average_gradients_handles_missing_gradients_consistently():
    grads = spawn(shm_workers.average_gradients_none, 2, timeout=60)
    for rank_grads in grads:
        np.testing.assert_array_equal(rank_grads[0], np.full((2, 3), 1.5, np.float32))
        # Missing on rank 0 counts as zero there: (0 + 4) / 2 on both ranks.
        np.testing.assert_array_equal(rank_grads[1], np.full((2, 3), 2.0, np.float32))
        assert rank_grads[0].dtype == np.float32 and rank_grads[1].dtype == np.float32
        assert rank_grads[2] is None
