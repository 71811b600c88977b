"""``worker_num_splits``: an env worker steps one split of its envs while the policy serves another.

Sample Factory's double buffering (its ``worker_num_splits``): a worker's envs
step in equal splits, each asking on a block slot of its own, so the env worker
and the inference loop overlap instead of taking turns. What must not change:
every frame in order, versions exact per frame, traj ids and worker ids.
"""

from __future__ import annotations

import functools
import os
import time
from pathlib import Path
from typing import Any

import anyio
import gymnasium as gym
import numpy as np
import pytest
import torch
from tensordict.nn import TensorDictModule
from torch import nn

from asyncrl import AsyncBatchedCollector
from asyncrl._inference.env_stepper import EnvStepper, EnvWorkerConfig
from asyncrl._inference.outputs import OutputLayout
from asyncrl._inference.worker_blocks import make_blocks
from asyncrl._rollout.traj_ids import TrajectoryIds
from asyncrl.testing import CountingEnv, ValuePolicy
from tests.asyncrl.counting_frames import check_counting_frames
from tests.asyncrl.inference.test_doorbells import collect_updating

pytestmark = pytest.mark.anyio
LIMIT = 90
BACKENDS = ["thread", "process"]
counting3 = functools.partial(CountingEnv, length=3)
#: Seconds a side of the rendezvous waits for the other before it fails the run.
RENDEZVOUS = 20.0


@pytest.mark.parametrize("server_backend", BACKENDS)
async def test_splits_keep_every_frame_in_order_and_versions_exact(server_backend) -> None:
    batches, _, sizes = await collect_updating(
        num_envs=8, envs_per_worker=4, worker_num_splits=2, frames_per_batch=16,
        total_frames=192, server_backend=server_backend)  # (versions checked there)
    frames = torch.cat(batches, 0)
    assert frames.numel() == 192
    assert len(set(frames["collector", "policy_version"].tolist())) >= 3
    check_counting_frames(frames, length=3, action=None)
    # two workers of four envs (which of them came first is the machine's business),
    # each asking in splits of two rows: calls of 2, 4, 6 or 8
    assert set(frames["collector", "worker_id"].tolist()) <= {0, 1}
    assert sizes and all(size in (2, 4, 6, 8) for size in sizes), sizes


class RendezvousEnv(gym.Env):
    """Counts its steps; split "b" meets the policy's call for split "a" (files in ``where``).

    From its second step to its fourth, env "b" marks ``b{t}`` (t: its step count
    before the step) and waits for ``a{t + 1}``, which the policy marks while it
    serves env "a"'s request of step ``t + 1`` (:class:`MeetsB`). Both sides wait
    at most ``RENDEZVOUS`` s: only a worker that steps "b" while the policy serves
    "a" lets them meet.
    """

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, role: str, where: str) -> None:
        self.role, self.where, self._t = role, Path(where), 0
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, shape=(2,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        self._t = 0
        return self._obs(), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        if self.role == "b" and 1 <= self._t <= 3:
            meet(self.where, mine=f"b{self._t}", theirs=f"a{self._t + 1}")
        self._t += 1
        return self._obs(), 1.0, False, False, {}

    def _obs(self) -> np.ndarray:
        return np.array([self._t, 0 if self.role == "a" else 1], dtype=np.float32)


def meet(where: str | Path, *, mine: str, theirs: str) -> None:
    """Mark ``mine``, then wait (bounded) for ``theirs``."""
    Path(where, mine).touch()
    deadline = time.monotonic() + RENDEZVOUS
    while not Path(where, theirs).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{mine} waited {RENDEZVOUS} s for {theirs}: the worker did not "
                               "step one split while the policy served the other")
        time.sleep(0.001)


class MeetsB(nn.Module):
    """Action 0; while it serves env "a" at step 2..4 it meets env "b"'s step (RendezvousEnv)."""

    def __init__(self, where: str) -> None:
        super().__init__()
        self.where = where

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        for step, role in observation.tolist():
            if role == 0 and 2 <= step <= 4:
                meet(self.where, mine=f"a{int(step)}", theirs=f"b{int(step) - 1}")
        return torch.zeros(observation.shape[:-1], dtype=torch.int64)


@pytest.mark.parametrize("server_backend", BACKENDS)
async def test_a_worker_steps_one_split_while_the_policy_serves_the_other(
        server_backend, tmp_path) -> None:
    where = str(tmp_path)
    envs = [functools.partial(RendezvousEnv, "a", where),
            functools.partial(RendezvousEnv, "b", where)]
    policy = TensorDictModule(MeetsB(where), in_keys=["observation"], out_keys=["action"])
    with anyio.fail_after(LIMIT):
        # one request per call (max_batch_size=1): "a" and "b" are never served together
        async with AsyncBatchedCollector(envs, envs_per_worker=2, worker_num_splits=2,
                                         policy=policy, max_batch_size=1, frames_per_batch=16,
                                         total_frames=32,
                                         server_backend=server_backend) as collector:
            frames = torch.cat([b async for b in collector], 0)
    assert sorted(os.listdir(where)) == ["a2", "a3", "a4", "b1", "b2", "b3"]
    steps = {role: frames["observation"][frames["observation"][:, 1] == role][:, 0].tolist()
             for role in (0, 1)}
    assert steps[0][:8] == steps[1][:8] == [float(t) for t in range(8)]


def test_worker_num_splits_must_split_every_worker_equally() -> None:
    def make(**kwargs: Any) -> AsyncBatchedCollector:
        return AsyncBatchedCollector(counting3, policy=ValuePolicy(0.0), frames_per_batch=8,
                                     **kwargs)

    with pytest.raises(ValueError, match=r"worker_num_splits=2 steps each env worker's envs in "
                       r"2 equal splits, and envs_per_worker=3 do not split so: give "
                       r"envs_per_worker and num_envs multiples of 2"):
        make(num_envs=6, envs_per_worker=3, worker_num_splits=2)
    with pytest.raises(ValueError, match=r"and the last worker's 1 envs \(num_envs=5\) do not "
                       r"split so"):
        make(num_envs=5, envs_per_worker=4, worker_num_splits=2)
    with pytest.raises(ValueError, match=r"num_envs=0 starts none: a remote env host steps its "
                       r"envs in one request; leave worker_num_splits=1"):
        make(num_envs=0, remote_workers=1, listen="tcp://127.0.0.1:0", worker_num_splits=2)
    with pytest.raises(ValueError, match="worker_num_splits"):
        make(num_envs=4, envs_per_worker=4, worker_num_splits=0)
    with pytest.raises(ValueError, match=r"max_batch_size=1 is smaller than one request of 2 "
                       r"envs \(envs_per_worker=4, worker_num_splits=2\)"):
        make(num_envs=4, envs_per_worker=4, worker_num_splits=2, max_batch_size=1)
    # a request is a split: max_batch_size may be as small as one split
    assert make(num_envs=4, envs_per_worker=4, worker_num_splits=2,
                max_batch_size=2).batching.splits == 2


def test_an_env_worker_and_its_blocks_must_agree_on_the_splits() -> None:
    obs = {("observation",): torch.zeros(1, 2)}
    blocks = make_blocks([4], obs, OutputLayout(action=(torch.int64, ())), splits=2)[0]
    try:
        assert (blocks.splits, blocks.obs.layout["o0"][1], blocks.act.layout["action"][1]) == (
            2, (2, 2), (2,))
        config = EnvWorkerConfig(slot=0, factories=[counting3] * 4, create_env_kwargs={},
                                 obs_block=blocks.obs.name, act_block=blocks.act.name,
                                 obs_paths=[("observation",)], extra_paths=[], chunk_steps=4)
        with pytest.raises(ValueError, match="this worker steps its envs in 1 splits, the "
                           "server's blocks have 2: give both the same splits"):
            EnvStepper(config)
        stepper = EnvStepper(EnvWorkerConfig(**{**config.__dict__, "splits": 2}))
        assert [p.num_envs for p in stepper.pools] == [2, 2]
        stepper.close()
        with pytest.raises(ValueError, match="4 envs do not split in 3 equal parts"):
            EnvStepper(EnvWorkerConfig(**{**config.__dict__, "splits": 3}))
    finally:
        blocks.close()
    with pytest.raises(ValueError, match="3 envs do not split in 2 equal parts"):
        make_blocks([3], obs, OutputLayout(action=(torch.int64, ())), splits=2)


def test_a_split_renews_the_trajectory_ids_of_its_own_envs() -> None:
    ids = TrajectoryIds(4, tag=1)
    ids.renew(np.array([False, True]), first=2)
    assert [int(i) - (1 << 32) for i in ids.current] == [0, 1, 2, 4]
