"""Gymnasium wrappers that call a served module at every step: a reward, an observation.

Each wrapper connects its own :class:`~._client.ServedModuleClient` (one client slot)
the first time it is stepped, in the process that steps it (an env worker), from the
handle it was built with (plain data: the env factory carries it). It records the
version of the module's weights that computed each step in
``info["served_versions"][name]``; a collector's ``info_keys=[handle.info_key]``
puts it in every frame as ``("next", "served_versions", name)``, beside the reward it
explains.

>>> env = ServedReward(gym.make("CartPole-v1"), served.handle)     # doctest: +SKIP
>>> obs, reward, terminated, truncated, info = env.step(env.action_space.sample())  # doctest: +SKIP
>>> info["served_versions"]["env.transform[0]"]  # doctest: +SKIP
0
"""

from __future__ import annotations

from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np

from ._client import ServedModuleClient
from ._errors import ServedModuleError
from ._handle import ServedModuleHandle
from ._remote_client import RemoteServedClient, connect

__all__ = ["ServedObservation", "ServedReward"]

#: The inputs a reward module may take, and where each comes from in a step.
REWARD_INPUTS = ("observation", "action", "next_observation", "reward")


class _Served(gym.Wrapper[Any, Any, Any, Any]):
    """Connects lazily (in the stepping process), closes with the env.

    ``handle``: the module's handle, or its name (a remote host's env, which learns
    the route in its worker's welcome: see :mod:`._remote_client`).
    """

    def __init__(self, env: gym.Env[Any, Any], handle: ServedModuleHandle | str) -> None:
        super().__init__(env)
        self.handle = handle
        self.name = handle if isinstance(handle, str) else handle.name
        self._client: ServedModuleClient | RemoteServedClient | None = None

    @property
    def client(self) -> ServedModuleClient | RemoteServedClient:
        if self._client is None:
            client = connect(self.handle)
            try:
                self._check(client.input_names, client.output_shape)
            except BaseException:
                client.close()
                raise
            self._client = client
        return self._client

    def _check(self, inputs: tuple[str, ...], output: tuple[int, ...]) -> None:
        """Refuse a module whose inputs or output this wrapper cannot give or use."""

    def _record(self, info: dict[str, Any], version: int) -> dict[str, Any]:
        info = dict(info)
        versions = dict(info.get("served_versions", {}))
        versions[self.name] = version
        info["served_versions"] = versions
        return info

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
        super().close()


class ServedReward(_Served):
    """The step's reward, computed by a served module (a learned reward model).

    The module's inputs are named among ``"observation"`` (before the step),
    ``"action"``, ``"next_observation"`` (after it) and ``"reward"`` (the env's own):
    the names of the ServedModule's ``example``. Its output (one number) is the reward.
    On a remote host (``asyncrl worker --connect``) give the module's name instead of
    its handle: the worker's welcome says how to call it (checked at the first step).

    >>> env = ServedReward(gym.make("CartPole-v1"), served.handle)     # doctest: +SKIP
    >>> env = ServedReward(gym.make("CartPole-v1"), "env.transform[0]")  # doctest: +SKIP
    """

    def __init__(self, env: gym.Env[Any, Any], handle: ServedModuleHandle | str) -> None:
        super().__init__(env, handle)
        if not isinstance(handle, str):
            self._check(handle.input_names, tuple(handle.output[2]))
        self._last: Any = None

    def _check(self, inputs: tuple[str, ...], output: tuple[int, ...]) -> None:
        unknown = [n for n in inputs if n not in REWARD_INPUTS]
        if unknown:
            raise ServedModuleError(f"ServedReward gives a module inputs named among "
                                    f"{list(REWARD_INPUTS)}; served module {self.name!r} "
                                    f"takes {unknown}: rename its example's keys")
        size = int(np.prod(output))
        if size != 1:
            raise ServedModuleError(f"ServedReward needs one number per step; served module "
                                    f"{self.name!r} returns shape {output}")

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(**kwargs)
        self._last = obs
        return obs, info

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        if self._last is None:
            raise ServedModuleError("ServedReward.step before reset: reset the env first")
        values = {"observation": self._last, "action": action, "next_observation": obs,
                  "reward": reward}
        client = self.client
        out, version = client({n: values[n] for n in client.input_names})
        self._last = obs
        return obs, float(out.reshape(-1)[0]), terminated, truncated, self._record(info, version)


class ServedObservation(_Served):
    """The observation, mapped by a served module (a frozen or trained encoder).

    The module takes one input (the env's observation) and its output is the new
    observation; the observation space becomes an unbounded ``Box`` of its shape.

    >>> env = ServedObservation(gym.make("CartPole-v1"), encoder.handle)   # doctest: +SKIP
    >>> obs, info = env.reset()  # doctest: +SKIP
    """

    def __init__(self, env: gym.Env[Any, Any], handle: ServedModuleHandle | str) -> None:
        if isinstance(handle, str):
            raise ServedModuleError(
                f"ServedObservation({handle!r}): its observation space is the module's "
                "output, needed before a remote worker's welcome names it; give the handle "
                "(served.handle), on the trainer's host: remote hosts call a served module "
                "through ServedReward only, for now")
        if len(handle.inputs) != 1:
            raise ServedModuleError(f"ServedObservation gives a module the observation only; "
                                    f"served module {handle.name!r} takes "
                                    f"{list(handle.input_names)}")
        super().__init__(env, handle)
        _, dtype, shape = handle.output
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, shape=shape,
                                                dtype=np.dtype(dtype))

    def _encode(self, obs: Any, info: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        out, version = self.client([obs])
        return out, self._record(info, version)

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(**kwargs)
        return self._encode(obs, info)

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        out, info = self._encode(obs, info)
        return out, reward, terminated, truncated, info
