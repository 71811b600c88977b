"""Wrapper state through the collectors: getattr_env per worker, state_dict with the env's
running statistics, statistics merged across workers, and the state a replacement gets.

The env's observation at step t of an episode is ``offset + t * [1, 2]`` and it keeps
every observation it returned in ``seen``: the test knows exactly what each worker's
``NormalizeObservation`` saw. Merged statistics are compared with numpy's mean and
variance of all of them combined with gymnasium's prior (each ``RunningMeanStd``
starts from a count of 1e-4, mean 0, variance 1: once per env), to float32 precision
(the wrapper's running sums are float32).
"""

from __future__ import annotations

import itertools
import os
import signal
from typing import Any

import anyio
import gymnasium as gym
import numpy as np
import pytest
from gymnasium.wrappers import NormalizeObservation

from asyncrl import Collector, MultiAsyncCollector, MultiSyncCollector

pytestmark = pytest.mark.anyio

LIMIT = 120  # generous: 2 shared cores, worker processes spawned per test
RTOL = 2e-6  # the wrapper's float32 running sums
PRIOR = 1e-4  # gymnasium's RunningMeanStd starts from this count, mean 0, variance 1


class OffsetEnv(gym.Env[np.ndarray, np.ndarray]):
    """Observation ``offset + t * [1, 2]`` at step t; ``seen``: every observation returned."""

    def __init__(self, offset: float = 0.0, length: int = 7) -> None:
        self.observation_space = gym.spaces.Box(-1e6, 1e6, (2,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.offset, self.length, self.t = offset, length, 0
        self.seen: list[np.ndarray] = []

    def _obs(self) -> np.ndarray:
        obs = (self.offset + self.t * np.array([1.0, 2.0])).astype(np.float32)
        self.seen.append(obs)
        return obs

    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self.t += 1
        return self._obs(), 1.0, False, self.t >= self.length, {}


def normalized(offset: float = 0.0, frozen: bool = False) -> gym.Env[Any, Any]:
    env = NormalizeObservation(OffsetEnv(offset))
    env.update_running_mean = not frozen
    return env


def normalized_vector(offset: float = 0.0) -> Any:
    """gymnasium's vector wrappers around a SyncVectorEnv of two envs."""
    from gymnasium.wrappers import vector as vector_wrappers

    venv = gym.vector.SyncVectorEnv([lambda: OffsetEnv(offset), lambda: OffsetEnv(offset + 1)])
    return vector_wrappers.NormalizeReward(vector_wrappers.NormalizeObservation(venv))


_offsets = itertools.count(0, 10)


def normalized_next_offset() -> gym.Env[Any, Any]:
    """In one process: each env another offset (0, 10, 20...)."""
    return normalized(float(next(_offsets)))


TWO_WORKERS: dict[str, Any] = {
    "create_env_fn": normalized, "num_workers": 2, "frames_per_batch": 8,
    "create_env_kwargs": [{"offset": 0.0}, {"offset": 10.0}],
}


def _expected(seen: list[Any], envs: int) -> tuple[np.ndarray, np.ndarray, float]:
    """numpy's mean and variance of ``seen`` and ``envs`` priors, by the textbook formula."""
    obs = np.stack([np.asarray(o, dtype=np.float64) for o in seen])
    n, prior = len(obs), PRIOR * envs
    count = n + prior
    mean = obs.sum(axis=0) / count  # the prior's mean is 0
    # E[x^2] - mean^2 over observations and the prior (variance 1 around 0)
    var = ((obs ** 2).sum(axis=0) + prior * 1.0) / count - mean ** 2
    np.testing.assert_allclose(obs.mean(axis=0), mean, rtol=prior)  # (what the prior moves)
    return mean, var, count


def _assert_stats(stats: dict[str, Any], seen: list[Any], envs: int = 1) -> None:
    mean, var, count = _expected(seen, envs)
    np.testing.assert_allclose(stats["mean"], mean, rtol=RTOL)
    np.testing.assert_allclose(stats["var"], var, rtol=RTOL)
    assert stats["count"] == pytest.approx(count, rel=1e-9)


async def test_getattr_env_answers_from_the_first_worker_or_from_each_named() -> None:
    with anyio.fail_after(LIMIT):
        async with MultiSyncCollector(**TWO_WORKERS, total_frames=16) as c:
            async for _ in c:
                pass
            assert await c.getattr_env("offset") == 0.0  # TorchRL: the first worker's
            assert await c.getattr_env("offset", worker_ids=[1, 0]) == [10.0, 0.0]
            first = await c.getattr_env("obs_rms")  # a RunningMeanStd, as a dict
            both = await c.getattr_env("obs_rms", worker_ids=[0, 1])
            seen = await c.getattr_env("seen", worker_ids=[0, 1])
            with pytest.raises(TypeError, match=r"the env's 'np_random' is a numpy.random"):
                await c.getattr_env("np_random")
            with pytest.raises(ValueError, match=r"no live worker \[5\].*are \[0, 1\]"):
                await c.getattr_env("offset", worker_ids=[0, 5])
    assert sorted(first) == ["count", "mean", "var"]
    np.testing.assert_array_equal(first["mean"], both[0]["mean"])
    for stats, worker_seen in zip(both, seen, strict=True):
        _assert_stats(stats, worker_seen)


@pytest.mark.parametrize("collector_cls", [MultiSyncCollector, MultiAsyncCollector])
async def test_merged_statistics_are_those_of_every_observation_any_worker_saw(
        collector_cls: Any) -> None:
    with anyio.fail_after(LIMIT):
        async with collector_cls(**TWO_WORKERS, total_frames=32) as c:
            batches = 0
            async for _ in c:
                batches += 1
                if batches == 2:  # sync: workers wait between rounds; async: see below
                    if collector_cls is MultiSyncCollector:
                        first = await c.sync_env_statistics()
                        first_seen = await c.getattr_env("seen", worker_ids=[0, 1])
            # the budget is spent: every worker is idle, nothing steps meanwhile
            merged = await c.sync_env_statistics()
            seen = await c.getattr_env("seen", worker_ids=[0, 1])
            after = await c.getattr_env("obs_rms", worker_ids=[0, 1])
            state = await c.state_dict()
    _assert_stats(merged, seen[0] + seen[1], envs=2)
    assert seen[0][0].tolist() != seen[1][0].tolist()  # the workers saw different data
    for stats in after:  # every worker now normalises with the merge
        np.testing.assert_allclose(stats["mean"], merged["mean"], rtol=1e-6)
        np.testing.assert_allclose(stats["var"], merged["var"], rtol=1e-6)
    if collector_cls is MultiSyncCollector:  # a second merge counts nothing twice
        _assert_stats(first, first_seen[0] + first_seen[1], envs=2)
    assert sorted(state) == ["worker0", "worker1"]
    for worker in state.values():
        stats = worker["env_state_dict"]["env0"]["0.NormalizeObservation"]["obs_rms"]
        np.testing.assert_allclose(stats["mean"], merged["mean"], rtol=1e-6)


async def test_state_dict_round_trips_each_workers_env_statistics() -> None:
    with anyio.fail_after(LIMIT):
        async with MultiAsyncCollector(**TWO_WORKERS, total_frames=16) as c:
            async for _ in c:
                pass
            state = await c.state_dict()
            one = state["worker1"]["env_state_dict"]["env0"]["0.NormalizeObservation"]
            one["obs_rms"] = {"mean": np.array([5.0, 6.0]), "var": np.array([4.0, 9.0]),
                              "count": 42.0}
            await c.load_state_dict(state)
            back = await c.getattr_env("obs_rms", worker_ids=[1])
            wrong = {"worker0": {"env_state_dict": {"env0": {"0.TimeLimit": {}}}},
                     "worker1": {}}
            with pytest.raises(Exception, match=r"env0 has no wrapper '0.TimeLimit'.*"
                                                r"0.NormalizeObservation"):
                await c.load_state_dict(wrong)
    assert back[0]["mean"].tolist() == [5.0, 6.0]
    assert back[0]["var"].tolist() == [4.0, 9.0]
    assert back[0]["count"] == 42.0


async def test_a_restarted_worker_normalises_its_first_batch_with_the_carried_statistics(
) -> None:
    carried = {"mean": np.array([5.0, 5.0]), "var": np.array([4.0, 4.0]), "count": 100.0}
    fresh = {"mean": np.zeros(2), "var": np.ones(2), "count": 1e-4}
    with anyio.fail_after(LIMIT):
        async with MultiSyncCollector(
                normalized, num_workers=2, frames_per_batch=8, total_frames=24,
                create_env_kwargs={"frozen": True},  # the statistics stay as loaded
                on_worker_loss="restart") as c:
            await c.load_state_dict({
                f"worker{i}": {"env_state_dict": {"env0": {"0.NormalizeObservation": {
                    "obs_rms": stats}}}} for i, stats in enumerate([fresh, carried])})
            await c.reset()
            before = await c.__anext__()
            old = c.worker_pids
            os.kill(old[1], signal.SIGKILL)
            replaced = await c.__anext__()  # the round waits for the replacement's share
            new = c.worker_pids
    assert new[1] != old[1]
    raw = np.array([[t, 2 * t] for t in range(4)], dtype=np.float32)  # its first episode
    expected = (raw - 5.0) / np.sqrt(4.0 + 1e-8)
    np.testing.assert_allclose(before["observation"][1].numpy(), expected, rtol=1e-6)
    np.testing.assert_allclose(replaced["observation"][1].numpy(), expected, rtol=1e-6)


async def test_the_in_process_collector_reads_loads_and_merges_its_envs_statistics() -> None:
    with anyio.fail_after(LIMIT):
        async with Collector(normalized_next_offset, envs_per_worker=2, frames_per_batch=12,
                             total_frames=24) as c:
            async for _ in c:
                pass
            envs = c.rollout.env_pool.user_envs if c.rollout is not None else []
            seen = [o for env in envs for o in env.get_wrapper_attr("seen")]
            assert (await c.getattr_env("offset", worker_ids=[0])) == [envs[0].unwrapped.offset]
            merged = await c.sync_env_statistics()
            state = c.state_dict()["env_state_dict"]
            with pytest.raises(ValueError, match="in-process Collector is worker 0 alone"):
                await c.getattr_env("offset", worker_ids=[1])
    _assert_stats(merged, seen, envs=2)
    assert sorted(state) == ["env0", "env1"]
    for env in state.values():
        np.testing.assert_allclose(env["0.NormalizeObservation"]["obs_rms"]["var"],
                                   merged["var"], rtol=1e-6)


def test_async_batched_collector_refuses_env_state_naming_the_collectors_that_have_it() -> None:
    from asyncrl import AsyncBatchedCollector, CollectorError

    c = AsyncBatchedCollector(normalized, num_envs=1, frames_per_batch=16)
    for call in (c.state_dict, c.sync_env_statistics, lambda: c.getattr_env("obs_rms"),
                 lambda: c.load_state_dict({})):
        with pytest.raises(CollectorError, match=r"AsyncBatchedCollector has no .*: its envs "
                                                 r"step in env-stepper processes.*"
                                                 r"MultiSyncCollector / MultiAsyncCollector"):
            call()


async def test_vector_wrappers_statistics_are_read_merged_and_written_back() -> None:
    with anyio.fail_after(LIMIT):
        async with MultiSyncCollector(
                normalized_vector, num_workers=2, frames_per_batch=16, total_frames=32,
                create_env_kwargs=[{"offset": 0.0}, {"offset": 10.0}]) as c:
            async for _ in c:
                pass
            before = await c.getattr_env("obs_rms", worker_ids=[0, 1])
            state = await c.state_dict()
            merged = await c.sync_env_statistics()
            after = await c.getattr_env("obs_rms", worker_ids=[1])
    assert sorted(state["worker0"]["env_state_dict"]["env0"]) == [
        "0.NormalizeReward", "1.NormalizeObservation"]
    counts = [b["count"] for b in before]
    assert merged["count"] == pytest.approx(sum(counts), rel=1e-12)
    weighted = sum(b["mean"].astype(np.float64) * n for b, n in zip(before, counts, strict=True))
    np.testing.assert_allclose(merged["mean"], weighted / sum(counts), rtol=1e-6)
    np.testing.assert_allclose(after[0]["var"], merged["var"], rtol=1e-6)
