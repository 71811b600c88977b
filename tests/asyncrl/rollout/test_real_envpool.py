"""The real EnvPool behind asyncrl's pool, rollout and collectors (skipped where it is absent).

`fake_envpool.py` keeps CI's coverage of the logic; these check that EnvPool itself
behaves as the fake says: rows in the order ``info["env_id"]`` names, NEXT_STEP resets
taken by id and never written as frames, async mode refused, seeds as EnvPool's.
"""

from __future__ import annotations

import functools

import anyio
import numpy as np
import pytest
import torch
from torch import nn

envpool = pytest.importorskip(
    "envpool", reason="envpool is not installed (pip install 'asyncrl[envpool]')")

from asyncrl import Collector, MultiSyncCollector  # noqa: E402
from asyncrl._rollout.env_id_pools import EnvIdVectorPool  # noqa: E402
from asyncrl._rollout.envs import make_env_pool  # noqa: E402
from asyncrl._rollout.loop import Rollout  # noqa: E402
from asyncrl._rollout.options import RolloutOptions  # noqa: E402

N, T, SEED, LIMIT = 3, 40, 5, 120


class WrongWay(nn.Module):
    """CartPole pushed the way the pole leans away from: episodes of ~10 steps, deterministic."""

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return (obs[..., 2] < 0).long()


def cartpoles(num_envs: int = N, **kwargs: object) -> object:
    return envpool.make_gymnasium("CartPole-v1", num_envs=num_envs, seed=SEED, **kwargs)


def reference(i: int, steps: int) -> dict[str, list]:
    """Env ``i`` alone (EnvPool seeds env i of a pool with ``seed + i``), its reset steps
    taken and dropped by hand: the frames a SAME_STEP env would give."""
    env = envpool.make_gymnasium("CartPole-v1", num_envs=1, seed=SEED + i)
    obs = env.reset()[0]
    out: dict[str, list] = {"obs": [], "action": [], "next": [], "reward": [], "done": []}
    for _ in range(steps):
        action = WrongWay()(torch.from_numpy(obs)).numpy()
        nxt, reward, term, trunc, _ = env.step(action)
        for key, value in zip(out, (obs[0], action[0], nxt[0], reward[0], term[0] | trunc[0]),
                              strict=True):
            out[key].append(value)
        obs = env.step(np.zeros(1, np.int64))[0] if term[0] or trunc[0] else nxt
    return out


def test_envpool_is_stepped_by_id_and_its_rows_land_in_env_order() -> None:
    pool = make_env_pool(cartpoles())
    try:
        assert isinstance(pool, EnvIdVectorPool)
        obs = pool.reset()["observation"].copy()
        want = np.stack([
            envpool.make_gymnasium("CartPole-v1", num_envs=1, seed=SEED + i).reset()[0][0]
            for i in range(N)])
        # Each row its own env's (EnvPool 0.8.4 under numpy 2 gave env 0's first value in
        # every cell: this catches it).
        np.testing.assert_array_equal(obs, want)
        assert len({row.tobytes() for row in obs}) == N
    finally:
        pool.close()


def test_rollout_on_envpool_gives_the_frames_of_each_env_alone() -> None:
    with Rollout(make_env_pool(cartpoles()), WrongWay(), N * T,
                 options=RolloutOptions(exploration_type=None)) as rollout:
        batch = rollout.collect()
    for i in range(N):
        want = reference(i, T)
        assert batch["observation"][i].numpy().tolist() == np.stack(want["obs"]).tolist()
        assert batch["action"][i].tolist() == [int(a) for a in want["action"]]
        assert batch["next", "observation"][i].numpy().tolist() == \
            np.stack(want["next"]).tolist()
        assert batch["next", "done"][i, :, 0].tolist() == [bool(d) for d in want["done"]]
    # CartPole pays 1 per step: a reset step written as a frame would pay 0.
    assert batch["next", "reward"].eq(1.0).all()
    assert batch["next", "done"].sum() >= 3, "the comparison must cross several episode ends"


def test_envpool_async_mode_is_refused_naming_batch_size() -> None:
    with pytest.raises(ValueError, match=r"async mode \(batch_size=2 < num_envs=4\)"):
        make_env_pool(cartpoles(4, batch_size=2))


def test_envpool_pendulum_spec_and_step() -> None:
    pool = make_env_pool(envpool.make_gymnasium("Pendulum-v1", num_envs=4, seed=0))
    try:
        assert pool.specs.action.shape == (1,) and pool.specs.action.dtype == "float32"
        pool.reset()
        obs, reward, term, trunc = pool.step(np.zeros((4, 1), np.float32))
        assert obs["observation"].shape == (4, 3) and reward.dtype == np.float32
        assert not term.any() and not trunc.any()
    finally:
        pool.close()


@pytest.mark.anyio
async def test_collector_on_envpool_matches_each_env_alone() -> None:
    collector = Collector(functools.partial(cartpoles), WrongWay(), frames_per_batch=N * T,
                          total_frames=N * T, exploration_type=None)
    with anyio.fail_after(LIMIT):
        async with collector:
            (batch,) = [b.clone() async for b in collector]
    assert tuple(batch.shape) == (N, T)
    for i in range(N):
        assert batch["action"][i].tolist() == [int(a) for a in reference(i, T)["action"]]
    assert batch["next", "reward"].eq(1.0).all()


@pytest.mark.anyio
async def test_multi_sync_collector_workers_step_envpool() -> None:
    collector = MultiSyncCollector([functools.partial(cartpoles)] * 2, WrongWay(), num_workers=2,
                                   frames_per_batch=2 * N * 8, total_frames=2 * N * 8 * 2,
                                   exploration_type=None)
    with anyio.fail_after(LIMIT):
        async with collector:
            batches = [b.clone() async for b in collector]
    assert [tuple(b.shape) for b in batches] == [(2, N, 8)] * 2
    assert all(b["next", "reward"].eq(1.0).all() for b in batches)
    # Both workers made the same EnvPool (same seed): the same frames, worker ids apart.
    first = batches[0]
    assert torch.equal(first["observation"][0], first["observation"][1])
    assert first["collector", "worker_id"][:, 0, 0].tolist() == [0, 1]
