"""An env and a plain policy that show every rollout option in a batch (an import path
for ``asyncrl worker --env / --policy``; tests/multihost/test_rollout_options.py).

- ``CountEnv``: observation ``{"count": [t], "other": [-1]}``, ``t`` the step in the
  episode; it never ends on its own (only ``max_frames_per_traj`` cuts it); its info
  says ``{"t": t}`` (``info_keys``).
- ``Probe``: a plain module without ``forward``: ``act(count) -> (10 * count, action,
  mode)``, where ``mode`` is 1 under ``ExplorationType.MODE`` and 0 otherwise. It
  takes one argument: called with both observations (no ``policy_in_keys``), without
  ``policy_method`` or ``policy_out_keys``, the rollout fails.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from tensordict.nn import InteractionType
from tensordict.nn.probabilistic import interaction_type

#: The options a trainer gives (every travelling one set away from its default).
OPTIONS: dict[str, Any] = {
    "max_frames_per_traj": 5, "set_truncated": True, "reset_at_each_iter": True,
    "exploration_type": "mode", "policy_in_keys": ["count"],
    "policy_out_keys": ["seen", "action", "mode"], "policy_method": "act", "info_keys": ["t"],
}


class CountEnv(gym.Env):
    metadata: dict[str, Any] = {}

    def __init__(self) -> None:
        box = gym.spaces.Box(-1e6, 1e6, (1,), np.float32)
        self.observation_space = gym.spaces.Dict({"count": box, "other": box})
        self.action_space = gym.spaces.Discrete(2)
        self._t = 0

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        self._t = 0
        return self._obs(), {"t": 0}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        self._t += 1
        return self._obs(), 1.0, False, False, {"t": self._t}

    def _obs(self) -> dict[str, np.ndarray]:
        return {"count": np.array([self._t], np.float32), "other": np.array([-1.0], np.float32)}


class Probe(torch.nn.Module):
    def act(self, count: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        n = count.shape[0]
        mode = float(interaction_type() == InteractionType.MODE)
        return count * 10, torch.zeros(n, dtype=torch.int64), torch.full((n, 1), mode)


def make_env() -> CountEnv:
    return CountEnv()


def make_policy() -> Probe:
    return Probe()
