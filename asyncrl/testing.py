"""Test doubles for users' tests and ours (like ``trio.testing``).

Deterministic envs and policies whose every frame and weight version a test can
predict, and the checks that read them back:

* envs: ``CountingEnv``, ``IdentityEnv`` (``identity_env``), ``TinyDictEnv``,
  ``DriftingEnv``, ``failing_env_at_init``, ``failing_env_at_step``;
* policies: ``ValuePolicy`` (its action is its weight), ``ParamPolicy``;
* checks: ``frame_identity_problems``, ``version_problems``,
  ``collect_with_updates``, ``fill_parameters``, ``parameter_values``.

They live in the package (not in ``tests/``) so that spawned worker processes
and remote hosts can import them by path, e.g. ``asyncrl.testing:CountingEnv``.
(Workers simulated on the wire live in ``asyncrl._worker.simulated``; the rollout
run piece by piece, for profiles, in ``asyncrl._rollout.probe``.)
"""

from __future__ import annotations

import itertools
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

__all__ = [
    "CountingEnv",
    "DriftingEnv",
    "IdentityEnv",
    "ParamPolicy",
    "TinyDictEnv",
    "ValuePolicy",
    "collect_with_updates",
    "failing_env_at_init",
    "failing_env_at_step",
    "fill_parameters",
    "frame_identity_problems",
    "identity_env",
    "parameter_values",
    "version_problems",
]


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

    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        self._t = 0
        self._episode += 1
        return self._obs(), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
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

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        self.pos = self.np_random.uniform(-1, 1, size=2).astype(np.float32)
        self.count = 0
        return self._obs(), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
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


_ID_LIMIT = 1 << 24  # ids stay exact in float32 observations


class IdentityEnv(gym.Env):
    """Every observation is ``[pid, instance, steps]``: which process, which env, which step.

    ``pid`` is the process that steps the env, ``instance`` a random id drawn when
    the env is built, ``steps`` the number of ``step()`` calls since then (resets do
    not count and do not restart it). A frame's ``("next", "observation")`` thus
    names it uniquely, and :func:`frame_identity_problems` proves that a run lost
    or repeated none. Episodes last ``length`` steps; the action is ignored.

    >>> env = IdentityEnv(length=2)
    >>> int(env.reset()[0][2]), int(env.step(0)[0][2]), env.step(0)[2]
    (0, 1, True)
    """

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, length: int = 50, *, hang_at_step: int | None = None,
                 hang_once: str | None = None) -> None:
        import os
        import secrets

        self.length = length
        #: Fault injection: ``step()`` number ``hang_at_step`` never returns (the process
        #: and its heartbeats stay alive). With ``hang_once`` (a file path) only the first
        #: process to create that file hangs: a respawned worker steps on.
        self.hang_at_step = hang_at_step
        self.hang_once = hang_once
        self.pid = os.getpid()
        self.instance = 1 + secrets.randbelow(_ID_LIMIT - 1)
        self.observation_space = gym.spaces.Box(0.0, float(1 << 31), shape=(3,),
                                                dtype=np.float64)
        self.action_space = gym.spaces.Discrete(1 << 16)
        self.steps = 0
        self._t = 0

    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        self._t = 0
        return self._obs(), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        if self.hang_at_step is not None and self.steps + 1 == self.hang_at_step:
            self._maybe_hang()
        self.steps += 1
        self._t += 1
        return self._obs(), 1.0, self._t >= self.length, False, {}

    def _maybe_hang(self) -> None:
        import os
        import time

        if self.hang_once is not None:
            try:
                os.close(os.open(self.hang_once, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                return  # another process hung already
        while True:  # as a simulator that deadlocked: only killing the process ends it
            time.sleep(3600)

    def _obs(self) -> np.ndarray:
        return np.array([self.pid, self.instance, self.steps], dtype=np.float64)


class DriftingEnv(gym.Env):
    """A float32 ``Box(3)`` env whose observations change from step ``at_step`` on.

    ``drift``: ``"float64"`` or ``"int64"`` (the dtype changes), ``"shape"`` (4 values
    instead of 3) or ``"list"`` (a Python list of 4). Fault injection for the rollout's
    observation checks.

    >>> env = DriftingEnv(at_step=2, drift="float64")
    >>> env.reset()[0].dtype, env.step(0)[0].dtype, env.step(0)[0].dtype
    (dtype('float32'), dtype('float32'), dtype('float64'))
    """

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, at_step: int = 10, drift: str = "float64") -> None:
        self.observation_space = gym.spaces.Box(-1e6, 1e6, shape=(3,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.at_step, self.drift, self.steps = at_step, drift, 0

    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        return np.zeros(3, dtype=np.float32), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        self.steps += 1
        obs: Any = np.full(3, self.steps, dtype=np.float32)
        if self.steps >= self.at_step:
            if self.drift in ("float64", "int64"):
                obs = obs.astype(self.drift)
            elif self.drift == "shape":
                obs = np.full(4, self.steps, dtype=np.float32)
            elif self.drift == "list":
                obs = [float(self.steps)] * 4
        return obs, 1.0, False, False, {}


def identity_env(**kwargs: Any) -> IdentityEnv:
    """A top-level factory for :class:`IdentityEnv` (picklable, importable by path)."""
    return IdentityEnv(**kwargs)


def frame_identity_problems(batches: Any, *, from_start: bool = False) -> list[str]:
    """What is wrong with the frames of ``batches`` collected from :class:`IdentityEnv` envs.

    Within each (pid, instance) stream the ``steps`` of ``("next", "observation")``
    seen across all batches, in order, must be consecutive with no repeat: a gap is a
    lost frame, a repeat a duplicated one. A stream may end early (its worker died:
    its unfinished batch is dropped whole) and, with ``from_start=False``, may begin
    after step 1. Returns readable problems; empty means every frame is accounted for.

    >>> frame_identity_problems([])
    []
    """
    steps: dict[tuple[int, int], list[int]] = {}
    for batch in batches:
        ids = batch["next", "observation"].reshape(-1, batch["next", "observation"].shape[-1])
        for pid, instance, step in ids.to(torch.float64).round().long().tolist():
            steps.setdefault((pid, instance), []).append(step)
    problems = []
    for (pid, instance), seen in sorted(steps.items()):
        ordered = sorted(seen)
        name = f"env {instance} of pid {pid}"
        repeats = sorted({s for s, n in itertools.pairwise(ordered) if s == n})
        if repeats:
            problems.append(f"{name}: step(s) {_few(repeats)} collected more than once")
        gaps = [(a, b) for a, b in itertools.pairwise(ordered) if b > a + 1]
        if from_start and ordered[0] != 1:
            gaps.insert(0, (0, ordered[0]))
        if gaps:
            lost = ", ".join(f"{a + 1}..{b - 1}" for a, b in gaps[:5])
            problems.append(f"{name}: step(s) {lost} never collected "
                            f"({sum(b - a - 1 for a, b in gaps)} frames lost)")
    return problems


def _few(values: list[int]) -> str:
    return ", ".join(map(str, values[:5])) + (f" and {len(values) - 5} more"
                                              if len(values) > 5 else "")


class ValuePolicy(nn.Module):
    """Action = its single parameter, rounded: the weights that acted are visible in the batch.

    Set the parameter to a new value before each weight update and
    :func:`version_problems` checks that every frame stamped with a version was
    produced by the weights of that version.

    >>> ValuePolicy(7.0)(torch.zeros(2, 3)).tolist()
    [7, 7]
    """

    def __init__(self, value: float = 0.0) -> None:
        super().__init__()
        self.value = nn.Parameter(torch.tensor([float(value)]))

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        action = self.value.detach().round().to(torch.int64)
        return action.expand(observation.shape[:-1]).clone()


def version_problems(batches: Any, values: dict[int, float | None]) -> list[str]:
    """Frames whose action is not the :class:`ValuePolicy` value of their stamped version.

    ``values`` maps each weight version to the value the policy had when it was
    sent (``None``: any value, e.g. version 0 of a remote host's own policy).
    Returns readable problems, one per (batch, version) that is wrong.

    >>> version_problems([], {0: 0.0})
    []
    """
    problems = []
    for index, batch in enumerate(batches):
        versions = batch["collector", "policy_version"].reshape(-1).tolist()
        actions = batch["action"].reshape(-1).tolist()
        wrong: dict[int, set[int]] = {}
        for version, action in zip(versions, actions, strict=True):
            if int(version) in values and values[int(version)] is None:
                continue
            expected = values.get(int(version))
            if expected is None or round(expected) != int(action):
                wrong.setdefault(int(version), set()).add(int(action))
        for version, acted in sorted(wrong.items()):
            problems.append(
                f"batch {index}: frames stamped version {version} acted with value(s) "
                f"{sorted(acted)}, expected {values.get(version, 'no such version')}")
    return problems


async def collect_with_updates(collector: Any, policy: nn.Module, *,
                               sync: bool) -> tuple[list[Any], dict[int, float | None]]:
    """Iterate ``collector`` and push new weights after every batch; return what to check.

    Before each update the :class:`ValuePolicy` ``policy`` (the trainer's) is set to
    ``version % 7``. ``sync``: ``await collector.update_policy_weights()`` (blocking);
    else ``send_async()`` (pipelined: newest wins). Returns the batches and the
    ``{version: value}`` map for :func:`version_problems`.

    >>> async def check(collector, policy):                     # doctest: +SKIP
    ...     batches, values = await collect_with_updates(collector, policy, sync=False)
    ...     assert version_problems(batches, values) == []
    """
    sender = collector.weight_sender()
    values: dict[int, float | None] = {0: 0.0}
    batches = []
    async for batch in collector:
        batches.append(batch)
        version = sender.version + 1
        values[version] = float(version % 7)
        fill_parameters(policy, float(version % 7))
        if sync:
            await collector.update_policy_weights()
        else:
            await sender.send_async()
    return batches, values


def fill_parameters(module: nn.Module, value: float) -> None:
    """Set every parameter of ``module`` to ``value`` (weights whose version is visible).

    >>> m = nn.Linear(2, 1); fill_parameters(m, 3.0); parameter_values(m)
    {3.0}
    """
    with torch.no_grad():
        for p in module.parameters():
            p.fill_(value)


def parameter_values(module: nn.Module) -> set[float]:
    """The distinct values of ``module``'s parameters (one value after :func:`fill_parameters`)."""
    return {float(v) for p in module.parameters() for v in p.detach().reshape(-1)}
