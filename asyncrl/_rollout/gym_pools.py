"""The gymnasium pools: a list of envs stepped in a loop, or a ``gymnasium.vector.VectorEnv``.

Both are `asyncrl._rollout.env_pools.EnvPool` s (numpy in, numpy out, results in
the pool's own buffers); `asyncrl._rollout.envs.make_env_pool` picks one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .env_pools import EnvPool, ObsLayout, check_observation
from .env_specs import EnvSpecs, array_spec_from_space, observation_specs_from_space

__all__ = ["GymEnvListPool", "GymVectorPool"]

_ndarray = np.ndarray


class GymEnvListPool(EnvPool):
    """A list of gymnasium envs stepped in a plain loop.

    Faster than ``SyncVectorEnv`` for our use: no batching of observations
    through ``concatenate``, no info merging, no autoreset bookkeeping.
    """

    def __init__(self, envs: list[Any], owner: Any = None) -> None:
        first = envs[0]
        for env in envs[1:]:
            if env.observation_space != first.observation_space:
                raise ValueError(
                    f"all envs must share one observation space: {env.observation_space} != "
                    f"{first.observation_space}"
                )
            if env.action_space != first.action_space:
                raise ValueError(
                    f"all envs must share one action space: {env.action_space} != "
                    f"{first.action_space}"
                )
        super().__init__(
            EnvSpecs(
                observation=observation_specs_from_space(first.observation_space),
                action=array_spec_from_space(first.action_space),
                num_envs=len(envs),
            )
        )
        self._envs = envs
        self._int_actions = self.specs.action.n is not None
        self._owner = owner  # a SyncVectorEnv we took the envs from, closed with us

    @property
    def user_env(self) -> Any:
        return self._envs[0]

    @property
    def user_envs(self) -> list[Any]:
        return list(self._envs)

    def step_inplace(self, actions: np.ndarray) -> None:
        rew, term, trunc = self.reward, self.terminated, self.truncated
        # A Discrete action goes in as a Python int: gymnasium's Discrete.contains
        # checks that much faster than a numpy scalar.
        item = self._int_actions
        write = None if not self._layout.is_dict else self._layout.write_row
        buf = self._layout.arrays[0]
        # What a step's observation must be: compared by identity and one tuple
        # compare before the copy; anything else takes check_observation's slow path.
        dtype, shape, path = buf.dtype, self._layout.row_shapes[0], self._layout.paths[0]
        any_done, info_reader = False, self.info_reader
        for i, env in enumerate(self._envs):
            obs, r, te, tr, info = env.step(actions.item(i) if item else actions[i])
            if info_reader is not None:
                info_reader.read_env(i, info)
            if write is None:
                if obs.__class__ is not _ndarray or obs.dtype is not dtype \
                        or obs.shape != shape:
                    check_observation(i, path, obs, buf)
                buf[i] = obs
            else:
                write(i, obs)
            rew[i] = r
            term[i] = te
            trunc[i] = tr
            if te or tr:
                any_done = True
        self.any_done = any_done

    def _reset_all(self, seeds: Sequence[int] | None) -> None:
        for i, env in enumerate(self._envs):
            obs, _ = env.reset(seed=None if seeds is None else seeds[i])
            self._layout.write_row(i, obs)

    def _reset_rows(self, mask: np.ndarray) -> None:
        for i in np.flatnonzero(mask):
            obs, _ = self._envs[i].reset()
            self._layout.write_row(int(i), obs)

    def _close(self) -> None:
        if self._owner is not None:
            self._owner.close()
            return
        for env in self._envs:
            env.close()


class GymVectorPool(EnvPool):
    """A ``gymnasium.vector.VectorEnv``, adapted so that no frame is a reset step.

    - ``SAME_STEP`` (any VectorEnv): the env already reset a finished sub-env
      and put the terminal observation in ``info["final_obs"]``; we return the
      terminal observation and keep the reset one for ``reset_where``.
    - ``NEXT_STEP`` / ``DISABLED`` (gymnasium's Sync/AsyncVectorEnv only): we
      reset finished sub-envs at once with ``reset(options={"reset_mask": ...})``,
      which also clears their pending autoreset, so the next step is a real step.
      Other vector envs in these modes are refused: ask for ``SAME_STEP``
      (EnvPool's, which step envs by id, go to `EnvIdVectorPool` instead).
    """

    def __init__(self, venv: Any) -> None:
        from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv

        mode = venv.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP)
        mode = AutoresetMode(mode) if not isinstance(mode, AutoresetMode) else mode
        base = venv.unwrapped
        known = isinstance(base, SyncVectorEnv | AsyncVectorEnv)
        if mode != AutoresetMode.SAME_STEP and not known:
            raise ValueError(
                f"{type(base).__name__} uses autoreset mode {mode.name} and has no way to "
                "reset or step single envs, so every reset would cost a frame: build it with "
                "autoreset_mode=AutoresetMode.SAME_STEP (e.g. gym.make_vec(..., vector_kwargs="
                "{'autoreset_mode': AutoresetMode.SAME_STEP})), or give it EnvPool's "
                "step(actions, env_id=ids) / reset(env_id=ids), all_env_ids and config"
            )
        if (
            mode == AutoresetMode.NEXT_STEP
            and isinstance(base, AsyncVectorEnv)
            and not base.shared_memory
        ):
            # gymnasium's async worker clears its autoreset flag on a masked reset
            # only with shared memory; without it the next step would be a reset.
            raise ValueError(
                "AsyncVectorEnv(shared_memory=False) in NEXT_STEP mode cannot be reset per "
                "env: use shared_memory=True or autoreset_mode=AutoresetMode.SAME_STEP"
            )
        super().__init__(
            EnvSpecs(
                observation=observation_specs_from_space(venv.single_observation_space),
                action=array_spec_from_space(venv.single_action_space),
                num_envs=venv.num_envs,
            )
        )
        self._venv = venv
        self._same_step = mode == AutoresetMode.SAME_STEP
        self.supports_partial_reset = known
        # SAME_STEP: reset observations the env already produced, per finished env.
        self._auto_reset = np.zeros(self.num_envs, dtype=bool)
        self._done = np.zeros(self.num_envs, dtype=bool)
        self._reset_obs = ObsLayout(self.specs.observation, self.num_envs)

    @property
    def user_env(self) -> Any:
        return self._venv

    def step_inplace(self, actions: np.ndarray) -> None:
        obs, rew, term, trunc, info = self._venv.step(actions)
        self._layout.write_rows(slice(None), obs)
        np.copyto(self.reward, rew, casting="unsafe")
        np.copyto(self.terminated, term, casting="unsafe")
        np.copyto(self.truncated, trunc, casting="unsafe")
        np.logical_or(self.terminated, self.truncated, out=self._done)
        self.any_done = bool(self._done.any())
        if self.info_reader is not None:
            self.info_reader.read_vector(info)
            if self._same_step and self.any_done:
                self.info_reader.read_final(info, self._done)
        if self._same_step and self.any_done:
            np.copyto(self._auto_reset, self._done)
            final = info["final_obs"]
            for i in np.flatnonzero(self._done):
                self._reset_obs.copy_row_from(int(i), self._layout)
                self._layout.write_row(int(i), final[i])

    def _reset_all(self, seeds: Sequence[int] | None) -> None:
        obs, _ = self._venv.reset(seed=None if seeds is None else list(seeds))
        self._layout.write_rows(slice(None), obs)
        self._auto_reset.fill(False)

    def _reset_rows(self, mask: np.ndarray) -> None:
        auto = mask & self._auto_reset
        for i in np.flatnonzero(auto):
            self._layout.copy_row_from(int(i), self._reset_obs)
        self._auto_reset[auto] = False
        rest = mask & ~auto
        if rest.any():
            if not self.supports_partial_reset:
                raise ValueError(
                    f"{type(self._venv.unwrapped).__name__} cannot reset single envs that "
                    "did not finish (needed by max_frames_per_traj and partial resets)"
                )
            obs, _ = self._venv.reset(options={"reset_mask": rest})
            self._layout.write_rows(rest, obs)

    def _close(self) -> None:
        self._venv.close()
