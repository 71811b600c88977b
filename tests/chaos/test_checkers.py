"""The chaos suite's own checkers catch what they claim to (no processes: fast)."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from asyncrl.testing import IdentityEnv, ValuePolicy, frame_identity_problems, version_problems

pytestmark = pytest.mark.chaos


def frames(pid: int, instance: int, steps: list[int], versions: list[int] | None = None,
           actions: list[int] | None = None) -> TensorDict:
    n = len(steps)
    ids = torch.tensor([[pid, instance, s] for s in steps], dtype=torch.float64)
    versions = versions or [0] * n
    return TensorDict({
        "next": {"observation": ids},
        "action": torch.tensor(actions or versions),
        "collector": {"policy_version": torch.tensor(versions)},
    }, batch_size=[n])


def test_consecutive_streams_across_batches_pass() -> None:
    batches = [frames(1, 7, [1, 2, 3]), frames(2, 8, [1, 2]), frames(1, 7, [4, 5])]
    assert frame_identity_problems(batches, from_start=True) == []


def test_a_lost_and_a_duplicated_frame_are_named() -> None:
    batches = [frames(1, 7, [1, 2, 3]), frames(1, 7, [3, 4, 7])]
    problems = frame_identity_problems(batches)
    assert problems == ["env 7 of pid 1: step(s) 3 collected more than once",
                        "env 7 of pid 1: step(s) 5..6 never collected (2 frames lost)"]


def test_a_stream_that_does_not_start_at_one_is_a_loss_only_from_start() -> None:
    batches = [frames(1, 7, [3, 4])]
    assert frame_identity_problems(batches) == []
    assert frame_identity_problems(batches, from_start=True) == [
        "env 7 of pid 1: step(s) 1..2 never collected (2 frames lost)"]


def test_versions_must_match_the_weights_that_acted() -> None:
    good = frames(1, 7, [1, 2], versions=[0, 1], actions=[10, 11])
    stale = frames(1, 7, [3, 4], versions=[2, 2], actions=[11, 11])
    assert version_problems([good, stale], {0: 10.0, 1: 11.0, 2: 12.0}) == [
        "batch 1: frames stamped version 2 acted with value(s) [11], expected 12.0"]
    assert version_problems([stale], {2: None}) == []


def test_identity_env_and_value_policy_reveal_themselves() -> None:
    env = IdentityEnv(length=2)
    obs, _ = env.reset()
    assert obs.tolist() == [env.pid, env.instance, 0]
    assert [env.step(0)[0][2] for _ in range(3)] == [1, 2, 3]  # resets do not restart it
    assert ValuePolicy(3.4)(torch.zeros(2, 3)).tolist() == [3, 3]
