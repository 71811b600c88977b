"""examples/served_reward_model.py: each batch's rewards are those of the reward model's
version recorded in that batch, and the versions follow the updates."""

from __future__ import annotations

import anyio
import pytest

from examples.served_reward_model import parse_args, train

pytestmark = pytest.mark.anyio


async def test_each_batch_reward_matches_the_served_version_recorded_in_it() -> None:
    args = parse_args(["--workers", "2", "--envs-per-worker", "2", "--frames-per-batch", "128",
                       "--batches", "5", "--reward-every", "2", "--reward-steps", "30"])
    with anyio.fail_after(300):
        report = await train(args)
    # sync mode: a batch after an update is computed entirely with the new weights
    assert [b.served_versions for b in report.batches] == [[0], [0], [1], [1], [2]]
    assert [b.policy_version for b in report.batches] == [0, 1, 2, 3, 4]
    assert all(b.max_error < 1e-5 for b in report.batches), report.batches
    # the check can fail: the fitted model's rewards are not the initial model's
    first, fitted = report.batches[0].mean_reward, report.batches[2].mean_reward
    assert abs(first - fitted) > 0.1, (first, fitted)
    assert report.reward_versions == 2
