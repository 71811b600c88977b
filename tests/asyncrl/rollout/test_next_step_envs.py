"""NEXT_STEP vector envs (EnvPool, gymnasium's own) give the batches a SAME_STEP env gives.

The reset step a NEXT_STEP env owes after an episode ends is never a frame:
the same envs, seeds and deterministic policy give identical observations,
actions, rewards, done flags and trajectory ids in either mode.
"""

from __future__ import annotations

import functools

import anyio
import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from gymnasium.wrappers.vector import RecordEpisodeStatistics

from asyncrl import Collector, MultiSyncCollector
from asyncrl._rollout.env_id_pools import EnvIdVectorPool
from asyncrl._rollout.envs import make_env_pool
from asyncrl._rollout.gym_pools import GymVectorPool
from asyncrl._rollout.loop import Rollout
from asyncrl._rollout.options import RolloutOptions
from tests.asyncrl.det_envs import FRAME_KEYS, CountEnv, FirstBit, WrongWay
from tests.asyncrl.rollout.fake_envpool import FakeEnvPool, make_count_envpool

N, T, BATCHES = 3, 20, 3


def cartpole() -> gym.Env:
    return gym.make("CartPole-v1")


def gym_vector(mode: AutoresetMode) -> gym.vector.VectorEnv:
    """A SyncVectorEnv under a wrapper: stepped through its step (not unwrapped into envs)."""
    return RecordEpisodeStatistics(SyncVectorEnv([cartpole] * N, autoreset_mode=mode))


def collect(venv: object, *, seed: bool, batches: int = BATCHES, **options: object) -> list:
    with Rollout(make_env_pool(venv), WrongWay(), N * T,
                 options=RolloutOptions(exploration_type=None, **options)) as rollout:
        if seed:  # a gymnasium vector env is seeded by reset; EnvPool's seed is fixed at make
            rollout.set_seed(0)
        kinds = type(rollout.env_pool)
        return [kinds, *[rollout.collect().clone() for _ in range(batches)]]


def assert_same_batches(got: list, want: list) -> None:
    assert len(got) == len(want)
    for a, b in zip(got[1:], want[1:], strict=True):
        for key in FRAME_KEYS:
            assert torch.equal(a[key], b[key]), key
    ends = torch.stack([b["next", "done"] for b in want[1:]]).sum()
    assert ends >= 3, "the comparison must cross several episode ends"


def test_gymnasium_next_step_gives_the_same_step_batches() -> None:
    same = collect(gym_vector(AutoresetMode.SAME_STEP), seed=True)
    nxt = collect(gym_vector(AutoresetMode.NEXT_STEP), seed=True)
    assert same[0] is GymVectorPool and nxt[0] is GymVectorPool
    assert_same_batches(nxt, same)


@pytest.mark.parametrize("reverse_rows", [False, True])
def test_envpool_like_gives_the_same_step_batches(reverse_rows: bool) -> None:
    same = collect(gym_vector(AutoresetMode.SAME_STEP), seed=True)
    fake = FakeEnvPool(cartpole, N, seed=0, reverse_rows=reverse_rows)
    pool = collect(fake, seed=False)
    assert pool[0] is EnvIdVectorPool
    assert_same_batches(pool, same)
    assert fake.closed


def check_count_frames(batch) -> None:
    """CountEnv's reward is 10 * episode + t + action: a reset step would break it."""
    t, episode = batch["observation"][..., 0], batch["observation"][..., 1]
    want = 10 * episode + t + batch["action"].float()
    assert torch.equal(batch["next", "reward"][..., 0], want)


def test_envpool_like_reset_step_moves_only_the_finished_envs() -> None:
    fake = make_count_envpool(3)  # episodes of 3, 5, 2, 4 steps in every env
    with Rollout(make_env_pool(fake), FirstBit(), 3 * 4) as rollout:
        batch = rollout.collect()
    # 4 frames, and after the third the reset step all three envs owed, asked by id
    assert [kind for kind, _ in fake.calls] == ["reset", *["step"] * 3, "step_ids", "step"]
    assert batch["observation"][..., 0].tolist() == [[0, 1, 2, 0]] * 3
    check_count_frames(batch)


def test_envpool_like_reset_step_is_taken_per_env() -> None:
    # Episodes that end at different steps: only the finished envs take the reset step.
    fake = FakeEnvPool(CountEnv, 2)
    fake._envs[1]._episode = 0  # env 1 starts at episode 1 (5 steps), env 0 at episode 0 (3)
    with Rollout(make_env_pool(fake), FirstBit(), 2 * 8) as rollout:
        batch = rollout.collect()
    partial = [ids for kind, ids in fake.calls if kind == "step_ids"]
    assert partial == [[0], [1], [1], [0]]  # env 0 after 3 and 3+5 steps, env 1 after 5, 5+2
    assert [ids for kind, ids in fake.calls if kind == "step"] == [[0, 1]] * 8
    obs = batch["observation"][..., 0].tolist()
    assert obs == [[0, 1, 2, 0, 1, 2, 3, 4], [0, 1, 2, 3, 4, 0, 1, 0]]
    check_count_frames(batch)
    traj = batch["collector", "traj_ids"]
    assert traj[0].unique_consecutive().numel() == 2 and traj[1].unique_consecutive().numel() == 3
    assert not set(traj[0].tolist()) & set(traj[1].tolist())


def test_envpool_like_max_frames_per_traj_resets_by_id() -> None:
    fake = FakeEnvPool(CountEnv, 2)
    options = RolloutOptions(max_frames_per_traj=2)
    with Rollout(make_env_pool(fake), FirstBit(), 2 * 6, options=options) as rollout:
        batch = rollout.collect()
    check_count_frames(batch)
    assert ("reset", [0, 1]) in fake.calls[1:]  # truncated envs reset by id, not stepped
    assert batch["observation"][..., 0].tolist() == [[0, 1, 0, 1, 0, 1]] * 2
    assert batch["next", "truncated"][..., 0].tolist() == [[False, True] * 3] * 2


def test_envpool_async_mode_is_refused_naming_batch_size() -> None:
    fake = FakeEnvPool(CountEnv, 4, batch_size=2)
    with pytest.raises(ValueError, match=r"batch_size=2 < num_envs=4"):
        make_env_pool(fake)


def test_envpool_spec_mismatch_names_the_key() -> None:
    class Wide(CountEnv):
        def _obs(self) -> np.ndarray:
            return np.zeros(3, dtype=np.float32)

    from asyncrl import SpecMismatchError

    with pytest.raises(SpecMismatchError, match="observation"):
        make_env_pool(FakeEnvPool(Wide, 2)).reset()


def test_vector_env_without_partial_steps_is_refused_with_the_ways_out() -> None:
    class Opaque(gym.vector.VectorEnv):
        metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP}

        def __init__(self) -> None:
            self.num_envs = 2
            self.single_observation_space = gym.spaces.Box(-1, 1, (2,))
            self.single_action_space = gym.spaces.Discrete(2)

    with pytest.raises(ValueError, match=r"SAME_STEP.*env_id"):
        make_env_pool(Opaque())


# -- collectors, both anyio backends ----------------------------------------------------

LIMIT = 90


def same_step_cartpoles() -> gym.vector.VectorEnv:
    return gym_vector(AutoresetMode.SAME_STEP)


fake_cartpoles = functools.partial(FakeEnvPool, cartpole, N, seed=0)


async def batches_of(collector: Collector | MultiSyncCollector, seed: int | None = None
                     ) -> list:
    with anyio.fail_after(LIMIT):
        async with collector:
            if seed is not None:
                await collector.set_seed(seed)
            return [b.clone() async for b in collector]


@pytest.mark.anyio
async def test_collector_with_envpool_like_env_matches_same_step() -> None:
    kwargs = {"frames_per_batch": N * T, "total_frames": N * T * BATCHES,
              "exploration_type": None}
    want = await batches_of(Collector(same_step_cartpoles, WrongWay(), **kwargs), seed=0)
    got = await batches_of(Collector(fake_cartpoles, WrongWay(), **kwargs))
    assert_same_batches([None, *got], [None, *want])


@pytest.mark.anyio
async def test_multi_sync_collector_with_envpool_like_env() -> None:
    collector = MultiSyncCollector(make_count_envpool, num_workers=1, frames_per_batch=3 * 4,
                                   total_frames=3 * 4 * 2)
    batches = await batches_of(collector)
    assert [tuple(b.shape) for b in batches] == [(1, 3, 4)] * 2
    obs = torch.cat([b["observation"][0, ..., 0] for b in batches], dim=-1)
    # episodes of 3, 5, 2, ... steps; no reset step anywhere in the frames
    assert obs.tolist() == [[0, 1, 2, 0, 1, 2, 3, 4]] * 3
