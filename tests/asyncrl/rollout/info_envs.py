"""Envs whose info tells what happened, for the ``info_keys`` tests.

Module-level, so worker processes can unpickle their factories.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

#: Episode lengths, one per episode in turn: ends fall at different steps per env.
LENGTHS = (3, 5, 2, 4)


class StepInfoEnv(gym.Env):
    """Observation ``[t]``; info ``{"steps": t, "stats": {"x": [t, -t]}}`` after step t.

    The reset's info says ``steps=-1``: a batch row that shows -1 took the reset's
    info instead of the step's. ``bad_at`` (a step count) makes ``steps`` a float
    there, for the spec checks.
    """

    metadata: dict[str, Any] = {}

    def __init__(self, offset: int = 0, bad_at: int | None = None) -> None:
        self.observation_space = gym.spaces.Box(-1e6, 1e6, (1,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self._episode = offset - 1
        self._t = 0
        self._total = 0
        self._bad_at = bad_at

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        self._episode += 1
        self._t = 0
        return np.array([0.0], dtype=np.float32), {"steps": -1}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        self._t += 1
        self._total += 1
        steps: Any = self._t
        if self._bad_at is not None and self._total >= self._bad_at:
            steps = float(self._t) + 0.5
        info = {"steps": steps, "stats": {"x": np.array([self._t, -self._t], np.float32)}}
        terminated = self._t >= LENGTHS[self._episode % len(LENGTHS)]
        return np.array([self._t], dtype=np.float32), float(self._t), terminated, False, info


class StepInfoFactory:
    """Env i of a worker gets offset i (its episode lengths start elsewhere in LENGTHS)."""

    def __init__(self) -> None:
        self._made = 0

    def __call__(self) -> StepInfoEnv:
        self._made += 1
        return StepInfoEnv(offset=self._made - 1)


def make_step_info_env() -> StepInfoEnv:
    return StepInfoEnv()


def make_bad_step_info_env() -> StepInfoEnv:
    """A StepInfoEnv whose ``steps`` turns float from its 6th step (a remote host's env:
    an import path takes no arguments)."""
    return StepInfoEnv(bad_at=6)


def make_torchrl_step_info_env() -> Any:
    """A StepInfoEnv under TorchRL's GymWrapper: the layout of a StepInfoEnv (observation
    float32[1], action int64), but a TorchRL env, which reads its own info (``info_keys``
    is refused on it)."""
    from torchrl.envs import GymWrapper

    return GymWrapper(StepInfoEnv(), categorical_action_encoding=True)
