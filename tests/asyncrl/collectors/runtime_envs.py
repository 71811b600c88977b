"""An env class that no package registers: tests register it at run time, as a user's main()."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


class CountingEnv(gym.Env[np.ndarray, np.int64]):
    """Observes ``start`` plus the steps taken since its reset: the registration's kwargs show."""

    def __init__(self, start: float = 0.0) -> None:
        self.start = float(start)
        self.observation_space = gym.spaces.Box(-1e6, 1e6, shape=(1,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self._steps = 0

    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self._steps = 0
        return np.array([self.start], dtype=np.float32), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self._steps += 1
        return np.array([self.start + self._steps], dtype=np.float32), 1.0, False, False, {}
