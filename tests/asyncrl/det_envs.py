"""Deterministic envs and policies for comparing batches with TorchRL's, field by field.

Module-level (picklable by both asyncrl's and TorchRL's worker processes).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

#: Episode lengths cycle through these (varied, so that trajectories need padding).
LENGTHS = (3, 5, 2, 4)


class CountEnv(gym.Env):
    """Observation ``[t, episode]``; episode ``k`` lasts ``LENGTHS[k % 4]`` steps (terminated).

    The reward is ``10 * episode + t + action``: every frame is recognisable.
    """

    metadata: dict[str, Any] = {}

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Box(-1e6, 1e6, (2,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self._episode = -1
        self._t = 0

    def _obs(self) -> np.ndarray:
        return np.array([self._t, self._episode], dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        self._episode += 1
        self._t = 0
        return self._obs(), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        reward = 10.0 * self._episode + self._t + int(action)
        self._t += 1
        terminated = self._t >= LENGTHS[self._episode % len(LENGTHS)]
        return self._obs(), reward, terminated, False, {}


def make_count_env() -> CountEnv:
    return CountEnv()


def make_torchrl_count_env() -> Any:
    from torchrl.envs import GymWrapper

    return GymWrapper(CountEnv(), categorical_action_encoding=True)


class FirstBit(nn.Module):
    """A deterministic policy: action = episode index parity (obs[..., 1] % 2)."""

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return (observation[..., 1].long() % 2)


class WrongWay(nn.Module):
    """CartPole pushed the way the pole leans away from: episodes of ~10 steps, deterministic."""

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return (obs[..., 2] < 0).long()


#: The keys two batches of one env are compared on, frame for frame.
FRAME_KEYS = ["observation", "action", ("next", "observation"), ("next", "reward"),
              ("next", "done"), ("next", "terminated"), ("next", "truncated"), "done",
              ("collector", "traj_ids")]


def make_policy() -> Any:
    from tensordict.nn import TensorDictModule

    return TensorDictModule(FirstBit(), in_keys=["observation"], out_keys=["action"])
