"""Envs and modules for the served-module tests (module level: picklable into workers)."""

from __future__ import annotations

import os
import time
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from asyncrl.served import ServedModuleHandle, ServedObservation, ServedReward


class StepEnv(gym.Env):  # type: ignore[type-arg]
    """Observation ``[t, 0, 0]``; the env's own reward is always -1; 8 steps an episode."""

    metadata: dict[str, Any] = {}

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Box(-1e6, 1e6, (3,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self._t = 0

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        self._t = 0
        return np.array([0, 0, 0], np.float32), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        self._t += 1
        return np.array([self._t, 0, 0], np.float32), -1.0, False, self._t >= 8, {}


def rewarded_env(handle: ServedModuleHandle) -> gym.Env:  # type: ignore[type-arg]
    """A StepEnv whose reward comes from the served module."""
    return ServedReward(StepEnv(), handle)


def encoded_env(handle: ServedModuleHandle) -> gym.Env:  # type: ignore[type-arg]
    return ServedObservation(StepEnv(), handle)


class Scale(nn.Module):
    """``reward = scale * next_observation[0]``: the scale says which weights computed it."""

    def __init__(self, scale: float = 1.0) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.tensor([scale]))

    def forward(self, next_observation: torch.Tensor) -> torch.Tensor:
        return next_observation[:, :1] * self.scale


def checked_versions(batch: Any, name: str = "env.transform[0]") -> torch.Tensor:
    """The served version each frame of ``batch`` records, asserting that its reward was
    computed by that version (the tests set version v's scale to v + 1)."""
    version = batch["next", "served_versions", name]
    t = batch["next", "observation"][..., 0]
    assert torch.equal(batch["next", "reward"].squeeze(-1), t * (version + 1))
    return version


class Raises(nn.Module):
    """Fine on the example (a batch of 1 at construction); raises on a marked observation."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(1))

    def forward(self, next_observation: torch.Tensor) -> torch.Tensor:
        if bool((next_observation[:, 0] >= 3).any()):
            raise ValueError("reward model: observation out of range")
        return next_observation[:, :1] * self.w


class Slow(nn.Module):
    """Sleeps ``delay`` seconds per call once its weight is set to a positive value."""

    def __init__(self) -> None:
        super().__init__()
        self.delay = nn.Parameter(torch.zeros(1))

    def forward(self, next_observation: torch.Tensor) -> torch.Tensor:
        if float(self.delay) > 0:
            time.sleep(float(self.delay))
        return next_observation[:, :1]


def torchrl_env(handle: ServedModuleHandle) -> Any:
    """StepEnv as a TorchRL GymWrapper, its reward from the served module (a transform)."""
    from torchrl.envs import GymWrapper, TransformedEnv

    from asyncrl.served import ServedModuleTransform

    return TransformedEnv(GymWrapper(StepEnv()), ServedModuleTransform(handle))


class HomeOnly(Scale):
    """A Scale that cannot be unpickled outside the process that made it."""

    def __init__(self) -> None:
        super().__init__()
        self.home = os.getpid()

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        if self.home != os.getpid():
            raise RuntimeError("HomeOnly cannot be built in another process")


#: The model id the remote-host tests serve under (a remote host's env names it).
REMOTE_NAME = "env.transform[0]"


def remote_rewarded_env() -> gym.Env:  # type: ignore[type-arg]
    """A remote host's env (``asyncrl worker --env ...:remote_rewarded_env``): it names the
    module, and its worker's welcome says how to call it."""
    return ServedReward(StepEnv(), REMOTE_NAME)


async def served_refusal(events: Any) -> Any:
    """The next ``"refused"`` event of a collector's ``events`` about a served call."""
    async for event in events:
        if event.kind == "refused" and event.reason.startswith("served_call refused"):
            return event
    raise AssertionError("the collector's events ended without a served_call refusal")
