"""``info_keys=`` on the collectors: the rollout's info entries reach the trainer's batches,
and ``statistics()`` reports RecordEpisodeStatistics' raw returns."""

from __future__ import annotations

import anyio
import gymnasium as gym
import pytest
import torch

from asyncrl import AsyncBatchedCollector, Collector, MultiAsyncCollector, MultiSyncCollector
from tests.asyncrl.rollout.info_envs import StepInfoFactory, make_step_info_env

LIMIT = 120


def check_rows(batch: torch.Tensor) -> int:
    """The batch's info equals the env's step count row by row; the episode ends seen."""
    t = batch["next", "observation"][..., 0]
    assert torch.equal(batch["next", "steps"], t.long())
    assert torch.equal(batch["next", "stats", "x"], torch.stack([t, -t], -1))
    return int(batch["next", "done"].sum())


async def batches_of(collector: object) -> list:
    with anyio.fail_after(LIMIT):
        async with collector:  # type: ignore[attr-defined]
            return [b.clone() async for b in collector]  # type: ignore[attr-defined]


@pytest.mark.anyio
async def test_collector_batches_carry_the_info_terminal_rows_included() -> None:
    batches = await batches_of(Collector(StepInfoFactory(), frames_per_batch=24,
                                         envs_per_worker=2, total_frames=72,
                                         info_keys=["steps", "stats"]))
    assert len(batches) == 3
    assert sum(check_rows(b) for b in batches) >= 6


@pytest.mark.anyio
@pytest.mark.parametrize("collector_type", [MultiSyncCollector, MultiAsyncCollector])
async def test_worker_processes_send_the_info(collector_type: type) -> None:
    batches = await batches_of(collector_type(
        make_step_info_env, num_workers=2, envs_per_worker=2, frames_per_batch=24,
        total_frames=48, info_keys=["steps", "stats"]))
    assert batches
    assert sum(check_rows(b) for b in batches) >= 4


@pytest.mark.anyio
async def test_central_inference_env_workers_send_the_info() -> None:
    # (tests/asyncrl/inference/test_batched_info_keys.py: episode, specs, errors, hosts)
    batches = await batches_of(AsyncBatchedCollector(
        make_step_info_env, num_envs=2, frames_per_batch=24, total_frames=48,
        info_keys=["steps", "stats"]))
    assert len(batches) == 2
    assert sum(check_rows(b) for b in batches) >= 4


def normalized_pendulum() -> gym.Env:
    # CleanRL's order: statistics recorded before the rewards are normalised.
    env = gym.wrappers.RecordEpisodeStatistics(gym.make("Pendulum-v1"))
    return gym.wrappers.NormalizeReward(env)


@pytest.mark.anyio
async def test_episode_returns_are_the_raw_ones_under_normalize_reward() -> None:
    async def mean_return(**kwargs: object) -> float:
        with anyio.fail_after(LIMIT):
            async with Collector(normalized_pendulum, frames_per_batch=400, envs_per_worker=2,
                                 total_frames=800, **kwargs) as collector:
                await collector.set_seed(0)
                async for _ in collector:
                    pass
                stats = collector.statistics()
        assert stats.episodes == 4  # 2 envs x 400 steps, episodes of 200
        assert stats.episode_return_mean is not None
        return stats.episode_return_mean

    raw = await mean_return(info_keys=["episode"])
    normalized = await mean_return()
    assert raw < -300  # Pendulum's random-policy returns: about -1000 .. -1500
    assert normalized > raw / 10  # the normalised rewards sum to something ~100x smaller


def test_the_trainer_checks_each_workers_info_entries() -> None:
    from tensordict import TensorDict

    from asyncrl import CollectorError
    from asyncrl._rollout.infos import normalise_info_keys
    from asyncrl.collectors._assemble import InfoCheck

    def share(dtype: torch.dtype) -> TensorDict:
        return TensorDict({("next", "episode", "r"): torch.zeros(2, 3, dtype=dtype)}, [2, 3])

    check = InfoCheck(normalise_info_keys(["episode"]))
    check.check("worker 0", share(torch.float64))
    check.check("worker 1", share(torch.float64))
    with pytest.raises(CollectorError, match=r"worker 2's batch has \('next', 'episode', 'r'\) "
                                             r"as torch.float32 .* first batch had torch.float64"):
        check.check("worker 2", share(torch.float32))
    with pytest.raises(CollectorError, match=r"worker 3's batch lacks \('next', 'episode'\).*"
                                             "welcome told it to read"):
        check.check("worker 3", TensorDict({}, [2, 3]))
