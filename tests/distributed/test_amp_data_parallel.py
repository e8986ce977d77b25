"""Data-parallel GradScaler: one rank's inf gradient makes every rank skip the
same step, so their scales and weights stay identical (needs everyo-amp)."""

import amp_workers
import numpy as np
import pytest

from everyo.distributed import spawn

STEPS = 7


@pytest.mark.usefixtures("no_leftovers")
@pytest.mark.parametrize("world_size", [2, 3])
def test_every_rank_takes_the_same_skip_decision(world_size):
    rng = np.random.default_rng(0)
    inputs = rng.standard_normal((96, 16)).astype(np.float32)
    targets = np.sin(inputs[:, :1]).astype(np.float32)
    results = spawn(amp_workers.scaler_worker, world_size, args=(inputs, targets, STEPS), timeout=120)
    history, weights = results[0]
    applied = [a for a, _ in history]
    assert applied == [i != amp_workers.POISONED_STEP for i in range(STEPS)]  # rank 0's finite step skipped too
    for other_history, other_weights in results[1:]:
        assert other_history == history
        for a, b in zip(weights, other_weights):
            assert a.tobytes() == b.tobytes()
    # One process on the whole batch, with the same step poisoned, takes the same decisions
    # and reaches the same weights up to float16 rounding of differently sized matmuls.
    reference_history, reference = amp_workers.train(inputs, targets, STEPS)
    assert reference_history == history
    moved = max(
        float(np.abs(ref - start.data).max()) for ref, start in zip(reference, amp_workers.build_model().parameters())
    )
    assert moved > 1e-2
    for a, ref in zip(weights, reference):
        np.testing.assert_allclose(a, ref, rtol=0, atol=1e-4)
