"""Small deterministic envs and policies for tests, examples and simulations.

They live in the package (not in ``tests/``) so that spawned worker processes
and remote hosts can import them by path, e.g. ``asyncrl.testing:CountingEnv``.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn


class CountingEnv(gym.Env):
    """Observation ``[step_in_episode, episode_index]``; reward 1; episodes of ``length`` steps.

    Every value is predictable, so a test can check a batch frame by frame.

    >>> env = CountingEnv(length=3)
    >>> env.reset(seed=0)[0].tolist()
    [0.0, 0.0]
    """

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, length: int = 5, fail_at_step: int | None = None) -> None:
        self.length = length
        self.fail_at_step = fail_at_step
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, shape=(2,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self._t = 0
        self._episode = -1
        self._total_steps = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple:
        super().reset(seed=seed)
        self._t = 0
        self._episode += 1
        return self._obs(), {}

    def step(self, action: Any) -> tuple:
        self._total_steps += 1
        if self.fail_at_step is not None and self._total_steps >= self.fail_at_step:
            raise RuntimeError(f"CountingEnv failed on purpose at step {self._total_steps}")
        self._t += 1
        terminated = self._t >= self.length
        return self._obs(), 1.0, terminated, False, {}

    def _obs(self) -> np.ndarray:
        return np.array([self._t, self._episode], dtype=np.float32)


class TinyDictEnv(gym.Env):
    """Dict observations (one nested), Box action; terminates after ``horizon`` steps.

    >>> env = TinyDictEnv()
    >>> sorted(env.reset(seed=0)[0])
    ['count', 'extra', 'pos']
    """

    def __init__(self, horizon: int = 3) -> None:
        self.horizon = horizon
        self.observation_space = gym.spaces.Dict(
            {
                "pos": gym.spaces.Box(-10.0, 10.0, (2,), np.float32),
                "count": gym.spaces.Discrete(horizon + 1),
                "extra": gym.spaces.Dict({"flags": gym.spaces.MultiBinary(3)}),
            }
        )
        self.action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)

    def _obs(self) -> dict[str, Any]:
        flags = np.array([self.count % 2, 1, 0], dtype=np.int8)
        return {"pos": self.pos.copy(), "count": self.count, "extra": {"flags": flags}}

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        self.pos = self.np_random.uniform(-1, 1, size=2).astype(np.float32)
        self.count = 0
        return self._obs(), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        self.pos = (self.pos + np.asarray(action, dtype=np.float32)).astype(np.float32)
        self.count += 1
        return self._obs(), float(self.pos.sum()), self.count >= self.horizon, False, {}


def failing_env_at_init() -> gym.Env:
    """An env factory that raises while the worker starts."""
    raise ValueError("this env cannot be built (on purpose)")


def failing_env_at_step(step: int = 3) -> gym.Env:
    """An env that raises ``RuntimeError`` at its ``step``-th step."""
    return CountingEnv(length=100, fail_at_step=step)


class ParamPolicy(nn.Module):
    """Action = 1 if the single parameter is positive, else 0: weights are visible in actions.

    >>> policy = ParamPolicy(1.0)
    >>> policy(torch.zeros(3, 2)).tolist()
    [1, 1, 1]
    """

    def __init__(self, value: float = 1.0) -> None:
        super().__init__()
        self.value = nn.Parameter(torch.tensor([float(value)]))

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        positive = (self.value > 0).to(torch.int64)
        return positive.expand(observation.shape[:-1]).clone()
