"""AsyncBatchedCollector: exact batches, policy outputs, versions, trajectories, facade."""

from __future__ import annotations

import functools
import time
from typing import Any

import anyio
import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch import nn

from asyncrl import AsyncBatchedCollector, BlockingCollector
from asyncrl.testing import CountingEnv, ValuePolicy, fill_parameters, version_problems
from tests.asyncrl.counting_frames import check_counting_frames

pytestmark = pytest.mark.anyio
LIMIT = 90
counting3 = functools.partial(CountingEnv, length=3)


async def test_batches_hold_exactly_the_frames_the_envs_made() -> None:
    with anyio.fail_after(LIMIT):
        async with AsyncBatchedCollector(counting3, num_envs=4, envs_per_worker=2,
                                         policy=ValuePolicy(1.0), frames_per_batch=12,
                                         total_frames=48) as collector:
            batches = [b async for b in collector]
    assert [b.batch_size for b in batches] == [torch.Size([12])] * 4
    frames = torch.cat(batches, 0)
    keys = set(frames.keys(include_nested=True, leaves_only=True))
    assert keys == {"observation", "action", "done", "terminated", "truncated",
                    ("next", "observation"), ("next", "reward"), ("next", "done"),
                    ("next", "terminated"), ("next", "truncated"),
                    ("collector", "traj_ids"), ("collector", "policy_version"),
                    ("collector", "worker_id")}
    assert (frames["collector", "policy_version"] == 0).all()
    check_counting_frames(frames, length=3, action=1)
    # chunks arrive in order: every worker present gave its envs' first steps (a reset)
    for worker in frames["collector", "worker_id"].unique().tolist():
        for env in range(2):
            first = frames[frames["collector", "traj_ids"] == (worker << 32) + env]
            assert first["observation"][0].tolist() == [0.0, 0.0]


class ScoredPolicy(nn.Module):
    def forward(self, observation: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        action = torch.ones(observation.shape[:-1], dtype=torch.int64)
        return action, observation.sum(-1, keepdim=True) * 10


async def test_every_policy_output_lands_in_the_batch() -> None:
    policy = TensorDictModule(ScoredPolicy(), in_keys=["observation"],
                              out_keys=["action", "score"])
    with anyio.fail_after(LIMIT):
        async with AsyncBatchedCollector([counting3] * 3, policy=policy, frames_per_batch=9,
                                         total_frames=18) as collector:
            frames = torch.cat([b async for b in collector], 0)
    assert frames.numel() == 18
    assert torch.equal(frames["score"], frames["observation"].sum(-1, keepdim=True) * 10)
    check_counting_frames(frames, length=3, action=1)


async def test_each_frame_carries_the_version_that_chose_its_action() -> None:
    policy = ValuePolicy(0.0)
    values: dict[int, float | None] = {0: 0.0}
    batches = []
    seen: set[int] = set()
    with anyio.fail_after(LIMIT):
        async with AsyncBatchedCollector(counting3, num_envs=4, policy=policy,
                                         frames_per_batch=8, total_frames=-1) as collector:
            # At least 8 batches, and on until the frames crossed 3 versions: the credits
            # let about two batches of older frames come first, more on a loaded machine.
            async for batch in collector:
                batches.append(batch)
                seen.update(batch["collector", "policy_version"].tolist())
                if len(batches) >= 8 and len(seen) >= 3:
                    break
                version = collector.policy_version + 1
                fill_parameters(policy, float(version))
                values[version] = float(version)
                await collector.update_policy_weights()
                assert collector.policy_version == version  # acked: in use from now on
    assert version_problems(batches, values) == []
    frames = torch.cat(batches, 0)
    assert len(seen) >= 3, seen  # the run really crossed several versions
    for tid in frames["collector", "traj_ids"].unique().tolist():  # versions never go back
        v = frames["collector", "policy_version"][frames["collector", "traj_ids"] == tid]
        assert (v[1:] >= v[:-1]).all()


class SlowValuePolicy(nn.Module):
    """Records the value it saw at the start and the end of each call."""

    calls: list[tuple[float, float]] = []

    def __init__(self) -> None:
        super().__init__()
        self.value = nn.Parameter(torch.tensor([0.0]))

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        before = float(self.value)
        time.sleep(0.01)  # a long call: updates arrive while it runs
        after = float(self.value)
        SlowValuePolicy.calls.append((before, after))
        return torch.full(observation.shape[:-1], round(before), dtype=torch.int64)


async def test_a_weight_update_never_lands_inside_a_policy_call() -> None:
    SlowValuePolicy.calls = []
    values: dict[int, float | None] = {0: 0.0}
    batches = []
    with anyio.fail_after(LIMIT):
        async with AsyncBatchedCollector(counting3, num_envs=4, policy=SlowValuePolicy(),
                                         frames_per_batch=8, total_frames=96) as collector:

            async def update_often() -> None:
                kinds = ["state_dict", "tensordict", "module"]
                for i in range(1, 40):
                    weights: Any = {"value": torch.tensor([float(i)])}
                    if kinds[i % 3] == "tensordict":
                        weights = TensorDict(weights, [])
                    elif kinds[i % 3] == "module":
                        module = SlowValuePolicy()
                        fill_parameters(module, float(i))
                        weights = module
                    await collector.update_policy_weights(weights)
                    values[collector.policy_version] = float(i)
                    await anyio.sleep(0.005)

            async with anyio.create_task_group() as tg:
                tg.start_soon(update_often)
                async for batch in collector:
                    batches.append(batch)
                tg.cancel_scope.cancel()
    assert SlowValuePolicy.calls and all(b == a for b, a in SlowValuePolicy.calls)
    assert version_problems(batches, values) == []
    assert len({b for b, _ in SlowValuePolicy.calls}) > 1  # updates did land between calls


async def test_completed_trajectories_are_yielded_whole() -> None:
    with anyio.fail_after(LIMIT):
        async with AsyncBatchedCollector(counting3, num_envs=2, policy=ValuePolicy(1.0),
                                         frames_per_batch=3, total_frames=30,
                                         yield_completed_trajectories=True) as collector:
            trajectories = [t async for t in collector]
    assert sum(t.numel() for t in trajectories) == 30
    for t in trajectories:
        assert t["observation"][:, 0].tolist() == [0.0, 1.0, 2.0]
        assert t["next", "done"].squeeze(-1).tolist() == [False, False, True]
        assert t["collector", "traj_ids"].unique().numel() == 1


def test_blocking_facade_iterates_and_updates() -> None:
    policy = ValuePolicy(1.0)
    with BlockingCollector(AsyncBatchedCollector(counting3, num_envs=2, policy=policy,
                                                 frames_per_batch=6, total_frames=18)) as c:
        sizes = []
        for batch in c:
            sizes.append(batch.numel())
            c.update_policy_weights()
        assert c.policy_version == 3
    assert sizes == [6, 6, 6]


async def test_policy_factory_serves_its_own_policy() -> None:
    with anyio.fail_after(LIMIT):
        async with AsyncBatchedCollector(counting3, num_envs=2,
                                         policy_factory=functools.partial(ValuePolicy, 1.0),
                                         frames_per_batch=6, total_frames=6) as collector:
            frames = torch.cat([b async for b in collector], 0)
            await collector.update_policy_weights({"value": torch.tensor([0.0])})
            assert collector.policy_version == 1
            with pytest.raises(Exception, match="pass weights="):
                await collector.update_policy_weights()
    check_counting_frames(frames, length=3, action=1)


async def test_split_trajs_pads_whole_trajectories_and_random_policy_works() -> None:
    with anyio.fail_after(LIMIT):
        async with AsyncBatchedCollector(counting3, num_envs=3, policy=None, split_trajs=True,
                                         frames_per_batch=18, total_frames=18) as collector:
            [batch] = [b async for b in collector]
    mask = batch["collector", "mask"]
    assert batch.batch_size[1] == 3 and int(mask.sum()) == 18
    for row in range(batch.shape[0]):  # each row one trajectory, steps in order
        steps = batch["observation"][row, :, 0][mask[row]].tolist()
        assert steps == list(range(int(steps[0]), int(steps[0]) + len(steps)))
    assert set(batch["action"][mask].tolist()) <= {0, 1}


class ModeReportingPolicy(nn.Module):
    """Action 0 under a deterministic exploration type, 1 otherwise."""

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        from tensordict.nn import InteractionType
        from tensordict.nn.probabilistic import interaction_type

        value = 0 if interaction_type() == InteractionType.DETERMINISTIC else 1
        return torch.full(observation.shape[:-1], value, dtype=torch.int64)


@pytest.mark.parametrize(("exploration_type", "action"), [("deterministic", 0), ("random", 1)])
async def test_the_policy_runs_under_the_exploration_type(exploration_type, action) -> None:
    with anyio.fail_after(LIMIT):
        async with AsyncBatchedCollector(counting3, num_envs=2, policy=ModeReportingPolicy(),
                                         exploration_type=exploration_type, device="cpu",
                                         frames_per_batch=6, total_frames=6) as collector:
            frames = torch.cat([b async for b in collector], 0)
    check_counting_frames(frames, length=3, action=action)


class ListBuffer:
    def __init__(self) -> None:
        self.batches: list[TensorDict] = []

    def extend(self, td: TensorDict) -> None:
        self.batches.append(td)


async def test_a_replay_buffer_is_filled_by_iteration_and_by_start() -> None:
    buffer = ListBuffer()
    with anyio.fail_after(LIMIT):
        async with AsyncBatchedCollector(counting3, num_envs=2, policy=ValuePolicy(1.0),
                                         replay_buffer=buffer, frames_per_batch=6,
                                         total_frames=12) as collector:
            assert [b async for b in collector] == [None, None]  # TorchRL's meaning
    assert [b.numel() for b in buffer.batches] == [6, 6]
    background = ListBuffer()
    with anyio.fail_after(LIMIT):
        async with AsyncBatchedCollector(counting3, num_envs=2, policy=ValuePolicy(1.0),
                                         replay_buffer=background, frames_per_batch=6,
                                         total_frames=18) as collector:
            collector.start()
            while sum(b.numel() for b in background.batches) < 18:
                await anyio.sleep(0.05)
    check_counting_frames(torch.cat(buffer.batches, 0), length=3, action=1)
    check_counting_frames(torch.cat(background.batches, 0), length=3, action=1)
