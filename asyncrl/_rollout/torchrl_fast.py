"""The fast path for a TorchRL env that is a gymnasium env plus pure transforms.

``TransformedEnv(GymEnv(...), Compose(DoubleToFloat(), StepCounter(), RewardSum()))``
(TorchRL's tutorials, the ported PPO script) spends most of a step in the
TensorDict machinery around a gymnasium ``step`` that itself takes a few
microseconds. When the whole env is of a known, pure kind, `TorchRLGymFastPool`
steps the gymnasium env that TorchRL wraps directly, into the pool's
preallocated buffers, and applies the transforms' step arithmetic in place:

- ``DoubleToFloat``: the float64 -> float32 cast, which the buffers' dtypes
  (the transformed env's specs) already do; float64 base actions get the
  float32 action cast back, as the transform's inverse does;
- ``StepCounter``: ``step_count + 1``, and with ``max_steps``
  ``truncated |= step_count >= max_steps``;
- ``RewardSum``: ``episode_reward + reward`` in float32.

Resets, seeding and closing still go through the TorchRL env (they are rare and
keep TorchRL's exact seeding, including its ``torch.manual_seed``), so a
trajectory is identical, key by key and value by value, to the generic
`TorchRLPool`'s (``tests/asyncrl/rollout/test_torchrl_fast_path.py``). Anything outside
the known set, a subclass of a known class included, keeps the generic path;
`fast_path_refusal` says why. ``pool.fast_path`` is True on this pool, and the
choice is logged at DEBUG on the ``asyncrl`` logger.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from .torchrl_pools import TorchRLPool

__all__ = ["TorchRLGymFastPool", "fast_path_refusal", "torchrl_env_pool"]

_log = logging.getLogger("asyncrl")


def _transforms(env: Any) -> list[Any]:
    """The flat list of transforms of a TransformedEnv (Compose unrolled)."""
    from torchrl.envs import Compose, TransformedEnv

    if type(env) is not TransformedEnv:
        return []
    out: list[Any] = []
    stack = [env.transform]
    while stack:
        t = stack.pop(0)
        if type(t) is Compose:
            stack[:0] = list(t.transforms)
        else:
            out.append(t)
    return out


def _base(env: Any) -> Any:
    from torchrl.envs import TransformedEnv

    return env.base_env if type(env) is TransformedEnv else env


def _gym_env(base: Any) -> Any:
    """The gymnasium env a GymEnv/GymWrapper wraps (TorchRL keeps it in ``_env``, with no
    public accessor; its docs read it the same way)."""
    return base._env  # noqa: SLF001


def _base_refusal(base: Any) -> str | None:
    import gymnasium as gym
    import torch
    from torchrl.data import Bounded, Categorical, Unbounded
    from torchrl.envs.libs.gym import GymEnv, GymWrapper

    if type(base) not in (GymEnv, GymWrapper):
        return f"the base env is a {type(base).__name__}, not a GymEnv/GymWrapper"
    if tuple(base.batch_size) != ():
        return f"the base env has batch_size {list(base.batch_size)}"
    if base.device is not None and base.device.type != "cpu":
        return f"the base env is on {base.device}"
    wrapped = _gym_env(base)
    if getattr(base, "_is_batched", False) or not isinstance(wrapped, gym.Env):
        return "the wrapped env is not a single gymnasium.Env"
    if base.wrapper_frame_skip != 1 or base.info_dict_reader or base.from_pixels:
        return "the base env uses frame_skip, info_dict_reader or from_pixels"
    if not getattr(base, "_convert_actions_to_numpy", True):
        return "the base env does not convert actions to numpy"
    if not isinstance(wrapped.observation_space, gym.spaces.Box):
        return "the observation space is not a Box"
    obs_spec = base.full_observation_spec
    if list(obs_spec.keys(True, True)) != ["observation"]:
        return f"observation keys {list(obs_spec.keys(True, True))} (expected ['observation'])"
    if tuple(obs_spec["observation"].shape) != tuple(wrapped.observation_space.shape):
        return "the observation spec and space shapes differ"
    if base.reward_keys != ["reward"] or base.full_reward_spec["reward"].dtype != torch.float32:
        return "the reward is not one float32 'reward' entry"
    if base.action_keys != ["action"]:
        return f"action keys {base.action_keys} (expected ['action'])"
    action_spec = base.full_action_spec["action"]
    space = wrapped.action_space
    if isinstance(action_spec, Bounded | Unbounded) and isinstance(space, gym.spaces.Box):
        return None
    if isinstance(action_spec, Categorical) and isinstance(space, gym.spaces.Discrete):
        return None
    return f"a {type(action_spec).__name__} action spec for a {type(space).__name__} space"


def _transform_refusal(t: Any, env: Any) -> str | None:
    from torchrl.envs import DoubleToFloat, RewardSum, StepCounter

    if type(t) is DoubleToFloat:
        return None  # the buffers' dtypes are the transformed specs': the cast is theirs
    if type(t) is StepCounter:
        if (
            t.step_count_keys != [t.step_count_key]
            or not isinstance(t.step_count_key, str)
            or t.truncated_keys != ["truncated"]
            or not t.update_done
        ):
            return "a StepCounter with non-default keys"
        return None
    if type(t) is RewardSum:
        out = list(t.out_keys)
        if list(t.in_keys) != ["reward"] or len(out) != 1 or not isinstance(out[0], str):
            return "a RewardSum with non-default keys"
        if env.full_observation_spec[out[0]].dtype != env.full_reward_spec["reward"].dtype:
            return "a RewardSum whose sum has another dtype than the reward"
        return None
    return f"the transform {type(t).__name__} (known: DoubleToFloat, StepCounter, RewardSum)"


def fast_path_refusal(env: Any) -> str | None:
    """None when `TorchRLGymFastPool` can step ``env`` exactly; else why it cannot."""
    transforms = _transforms(env)
    why = _base_refusal(_base(env))
    if why is not None:
        return why
    for t in transforms:
        why = _transform_refusal(t, env)
        if why is not None:
            return why
    from torchrl.envs import RewardSum, StepCounter

    keys = {"observation"}
    for kind in (StepCounter, RewardSum):
        made = [t for t in transforms if type(t) is kind]
        if len(made) > 1:
            return f"{len(made)} {kind.__name__} transforms"
        for t in made:
            keys.add(t.step_count_key if kind is StepCounter else t.out_keys[0])
    obs_keys = [k for k in env.full_observation_spec.keys(True, True)]
    if set(obs_keys) != keys:
        return f"observation keys {sorted(map(str, obs_keys))} (expected {sorted(keys)})"
    return None


class TorchRLGymFastPool(TorchRLPool):
    """A `TorchRLPool` whose ``step`` skips TorchRL for a known-pure env (see the module doc).

    Same specs, keys, dtypes, values and seeding as `TorchRLPool` on the same
    env; only the per-step work differs. Built by `make_env_pool` when
    `fast_path_refusal` returns None.

    >>> from torchrl.envs import Compose, RewardSum, StepCounter, TransformedEnv
    >>> from torchrl.envs.libs.gym import GymEnv
    >>> env = TransformedEnv(GymEnv("Pendulum-v1"), Compose(StepCounter(), RewardSum()))
    >>> pool = TorchRLGymFastPool(env)
    >>> pool.fast_path, sorted(pool.obs)
    (True, ['episode_reward', 'observation', 'step_count'])
    >>> pool.close()
    """

    #: True: steps bypass TorchRL (the generic `TorchRLPool` says False).
    fast_path = True

    def __init__(self, env: Any) -> None:
        why = fast_path_refusal(env)
        if why is not None:
            raise ValueError(f"no fast path for this TorchRL env: {why}")
        super().__init__(env)
        from torchrl.envs import RewardSum, StepCounter

        transforms = _transforms(env)
        base = _base(env)
        self._gym = _gym_env(base)
        arrays = dict(zip(self._obs_keys, self._layout.arrays, strict=True))
        self._obs_buf = arrays["observation"]
        self._step_count: np.ndarray | None = None
        self._max_steps: int | None = None
        self._episode_reward: np.ndarray | None = None
        for t in transforms:
            if type(t) is StepCounter:
                self._step_count = arrays[t.step_count_key].reshape(-1)
                self._max_steps = t.max_steps
            elif type(t) is RewardSum:
                self._episode_reward = arrays[t.out_keys[0]].reshape(-1)
        # The action as TorchRL hands it to gymnasium: the base spec's dtype
        # (DoubleToFloat's inverse casts float32 actions back to float64).
        base_spec = base.full_action_spec["action"]
        self._discrete = self.specs.action.n is not None
        np_dtype = np.empty(0, dtype=str(base_spec.dtype).removeprefix("torch.")).dtype
        self._gym_action = np.zeros(tuple(base_spec.shape), dtype=np_dtype)
        _log.debug("asyncrl: TorchRL env %s stepped on the fast path", type(self._gym).__name__)

    def step_inplace(self, actions: np.ndarray) -> None:
        if self._discrete:
            action: Any = actions.item(0)
        else:
            np.copyto(self._gym_action, actions.reshape(self._gym_action.shape), casting="unsafe")
            action = self._gym_action
        obs, r, te, tr, _ = self._gym.step(action)
        self._obs_buf[0] = obs
        self.reward[0] = r
        self.terminated[0] = te
        if self._step_count is not None:
            self._step_count += 1
            if self._max_steps is not None and self._step_count[0] >= self._max_steps:
                tr = True
        self.truncated[0] = tr
        if self._episode_reward is not None:
            self._episode_reward += self.reward
        self.any_done = bool(te or tr)


def torchrl_env_pool(env: Any) -> TorchRLPool:
    """The fastest exact pool for a TorchRL env: the fast path when it applies."""
    try:
        why = fast_path_refusal(env)
    except Exception as exc:  # an env we cannot inspect is stepped as before, never refused
        why = f"inspecting the env failed: {type(exc).__name__}: {exc}"
    if why is None:
        return TorchRLGymFastPool(env)
    _log.debug("asyncrl: TorchRL env stepped through TorchRL (no fast path: %s)", why)
    return TorchRLPool(env)
