"""``set_seed`` makes two runs with a stochastic policy identical, as TorchRL's does.

The envs were always seeded; the policy's sampling draws from the process's
global torch RNG, which ``set_seed`` now seeds too (in each worker, with the
seed that worker is given). The runs below leave the RNGs in different states
before ``set_seed``, so they repeat only because of it.
"""

from __future__ import annotations

from typing import Any

import anyio
import numpy as np
import pytest
import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModule
from torch import nn

from asyncrl import Collector, MultiSyncCollector

torchrl = pytest.importorskip("torchrl", reason="the torchrl extra is not installed")
from torchrl.modules import ProbabilisticActor  # noqa: E402

pytestmark = pytest.mark.anyio
LIMIT = 120
KEYS = ["observation", "action", ("next", "observation"), ("next", "reward"),
        ("next", "done")]


def make_actor() -> ProbabilisticActor:
    """A policy that samples its actions (Categorical over CartPole's two actions)."""
    torch.manual_seed(0)  # the same weights in every run
    module = TensorDictModule(nn.Linear(4, 2), in_keys=["observation"], out_keys=["logits"])
    return ProbabilisticActor(module, in_keys=["logits"], out_keys=["action"],
                              distribution_class=torch.distributions.Categorical)


def same(a: TensorDictBase, b: TensorDictBase) -> bool:
    return all(torch.equal(a[key], b[key]) for key in KEYS)


async def in_process_batch(seed: int, *, warm_up: bool) -> TensorDictBase:
    async with Collector("CartPole-v1", make_actor(), frames_per_batch=64,
                         total_frames=-1) as collector:
        if warm_up:  # the first run draws from the RNG before seeding
            await collector.__anext__()
        torch.manual_seed(1234 if warm_up else 99)  # whatever the trainer did before
        await collector.set_seed(seed)
        return await collector.__anext__()


async def test_in_process_runs_with_the_same_seed_are_identical() -> None:
    with anyio.fail_after(LIMIT):
        first = await in_process_batch(7, warm_up=True)
        second = await in_process_batch(7, warm_up=False)
        other = await in_process_batch(8, warm_up=False)
    assert same(first, second)
    assert not same(first, other)  # the seed matters: this comparison can fail


async def multi_batch(seed: int, *, warm_up: bool) -> TensorDictBase:
    async with MultiSyncCollector("CartPole-v1", make_actor(), num_workers=2,
                                  frames_per_batch=64, total_frames=-1) as collector:
        if warm_up:  # the workers' RNGs advance with a first batch
            await collector.__anext__()
        next_seed = await collector.set_seed(seed)
        assert next_seed == seed + 2  # TorchRL's chaining: one seed per env, across workers
        return await collector.__anext__()


async def test_multi_process_sync_runs_with_the_same_seed_are_identical() -> None:
    with anyio.fail_after(LIMIT):
        first = await multi_batch(3, warm_up=True)
        second = await multi_batch(3, warm_up=False)
    assert same(first, second)
    # Each worker draws its own noise: the two workers' actions are not one sequence twice.
    assert not torch.equal(first["action"][0], first["action"][1])


def normalized_pendulum() -> Any:
    """Pendulum with running observation statistics and the raw episode return in its
    infos; its generator is seeded as it is made, so the reset a collector makes before
    ``set_seed`` is the same in every run (as examples/cleanrl_ppo.py's ``make_envs``).
    A continuous action: two unseeded draws never give the same next observation."""
    import gymnasium as gym

    env = gym.wrappers.NormalizeObservation(
        gym.wrappers.RecordEpisodeStatistics(gym.make("Pendulum-v1")))
    env.unwrapped.np_random = np.random.default_rng(11)
    return env


async def info_keys_batch() -> TensorDictBase:
    async with Collector(normalized_pendulum, None, frames_per_batch=64, total_frames=-1,
                         info_keys=["episode"]) as collector:
        await collector.set_seed(5)  # seeds the collector's random policy too
        return await collector.__anext__()


async def test_the_info_keys_probe_step_repeats_so_seeded_runs_do_too() -> None:
    # info_keys learns the info leaves' specs from one step of random actions, before
    # set_seed; that step's observation stays in NormalizeObservation's statistics, so
    # with actions from the system's entropy two runs with the same seeds differed
    # (infos.PROBE_SEED: fixed)
    with anyio.fail_after(LIMIT):
        first, second = await info_keys_batch(), await info_keys_batch()
    assert same(first, second)


async def test_seeding_the_workers_leaves_the_trainer_rng_alone() -> None:
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    with anyio.fail_after(LIMIT):
        async with MultiSyncCollector("CartPole-v1", make_actor(), num_workers=1,
                                      frames_per_batch=16, total_frames=16) as collector:
            torch.manual_seed(5)
            await collector.set_seed(0)
            assert torch.equal(torch.rand(3), expected)


def test_seed_global_rngs_accepts_any_int() -> None:
    from asyncrl._rollout.seeding import seed_global_rngs

    seed_global_rngs(-1)  # numpy wants 0..2**32-1: taken modulo
    a: Any = np.random.rand()
    seed_global_rngs((1 << 32) - 1)
    assert np.random.rand() == a
