"""A small stand-in for EnvPool's gymnasium interface (EnvPool is not installed here).

What asyncrl relies on, as EnvPool does it: ``config`` (``num_envs``,
``batch_size``), ``all_env_ids``, per-env ``observation_space`` /
``action_space``, NEXT_STEP autoreset (the step after an env finished resets
it, ignores its action, returns reward 0), ``step(actions, env_id=ids)`` and
``reset(env_id=ids)`` on a subset, ``info["env_id"]`` naming each row, seeds
fixed at construction (env i's first reset uses ``seed + i``; ``reset`` takes no
seed). Module-level, so worker processes can unpickle its factories.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np


class FakeEnvPool:
    """``num_envs`` gymnasium envs behind EnvPool's sync (or async) interface."""

    metadata: dict[str, Any] = {"autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP}

    def __init__(self, make_env: Callable[[], gym.Env], num_envs: int, *, seed: int = 0,
                 batch_size: int | None = None, reverse_rows: bool = False) -> None:
        self._envs = [make_env() for _ in range(num_envs)]
        self.config = {"num_envs": num_envs, "batch_size": batch_size or num_envs}
        self.all_env_ids = np.arange(num_envs, dtype=np.int32)
        self.observation_space = self._envs[0].observation_space
        self.action_space = self._envs[0].action_space
        self._seeds: list[int | None] = [seed + i for i in range(num_envs)]
        self._needs_reset = np.zeros(num_envs, dtype=bool)
        self._reverse = reverse_rows  # answer rows in reverse env order (EnvPool may reorder)
        #: Each call, for the tests: ("step" | "step_ids" | "reset", ids); step_ids: a subset
        #: was asked for (env_id given).
        self.calls: list[tuple[str, list[int]]] = []
        self.closed = False

    def _order(self, env_id: Any) -> list[int]:
        ids = list(range(len(self._envs))) if env_id is None else [int(i) for i in env_id]
        return ids[::-1] if self._reverse else ids

    def _reset_env(self, i: int) -> Any:
        obs, _ = self._envs[i].reset(seed=self._seeds[i])
        self._seeds[i] = None  # seeded once, as EnvPool's seed at make time
        self._needs_reset[i] = False
        return obs

    def reset(self, env_id: Any = None) -> tuple[Any, dict[str, Any]]:
        ids = self._order(env_id)
        self.calls.append(("reset", sorted(ids)))
        obs = np.stack([self._reset_env(i) for i in ids])
        return obs, {"env_id": np.asarray(ids, dtype=np.int32)}

    def step(self, actions: Any, env_id: Any = None) -> tuple[Any, ...]:
        given = list(range(len(self._envs))) if env_id is None else [int(i) for i in env_id]
        ids = self._order(env_id)
        self.calls.append(("step" if env_id is None else "step_ids", sorted(ids)))
        obs, rew, term, trunc, infos = [], [], [], [], []
        for i in ids:
            if self._needs_reset[i]:  # NEXT_STEP: this step is the reset, its action ignored
                obs.append(self._reset_env(i))
                infos.append({})
                rew.append(0.0)
                term.append(False)
                trunc.append(False)
                continue
            action = np.asarray(actions)[given.index(i)]
            o, r, te, tr, env_info = self._envs[i].step(
                action.item() if action.ndim == 0 else action)
            infos.append(env_info)
            self._needs_reset[i] = te or tr
            obs.append(o)
            rew.append(r)
            term.append(te)
            trunc.append(tr)
        info = {**_stack_infos(infos), "env_id": np.asarray(ids, dtype=np.int32)}
        return (np.stack(obs), np.asarray(rew, dtype=np.float64), np.asarray(term),
                np.asarray(trunc), info)

    def close(self) -> None:
        self.closed = True
        for env in self._envs:
            env.close()


def _stack_infos(infos: list[dict[str, Any]]) -> dict[str, Any]:
    """The rows' env infos as EnvPool gives them: one array per key (zeros where absent)."""
    out: dict[str, Any] = {}
    for key in {k for info in infos for k in info}:
        values = [info.get(key) for info in infos]
        given = next(v for v in values if v is not None)
        if isinstance(given, dict):
            out[key] = _stack_infos([v if isinstance(v, dict) else {} for v in values])
        else:
            out[key] = np.stack([np.zeros_like(np.asarray(given)) if v is None else np.asarray(v)
                                 for v in values])
    return out


def make_count_envpool(num_envs: int = 3) -> FakeEnvPool:
    """A FakeEnvPool of the suite's deterministic counting envs (episodes of 3, 5, 2, 4)."""
    from tests.asyncrl.det_envs import CountEnv

    return FakeEnvPool(CountEnv, num_envs)
