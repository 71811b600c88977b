"""EnvPool stepped through its C++ binding gives the batches its public API gives.

The raw path (`asyncrl._rollout.envpool_raw`) reads EnvPool's flat state list where a
layout resolved once says. These check it against the public API on the same envs,
seeds and deterministic policy (episode ends, truncation at 200 steps, resets by id,
``max_frames_per_traj``), and that a binding whose layout does not read as EnvPool's
own converters is stepped through the public API instead, said once in a DEBUG log.
Skipped where EnvPool is absent.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

envpool = pytest.importorskip(
    "envpool", reason="envpool is not installed (pip install 'asyncrl[envpool]')")

from asyncrl._rollout.env_id_pools import EnvIdVectorPool  # noqa: E402
from asyncrl._rollout.envs import make_env_pool  # noqa: E402
from asyncrl._rollout.loop import Rollout  # noqa: E402
from asyncrl._rollout.options import RolloutOptions  # noqa: E402
from tests.asyncrl.det_envs import FRAME_KEYS, WrongWay  # noqa: E402

N, SEED = 3, 11


def swing() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 16), nn.Tanh(), nn.Linear(16, 1), nn.Tanh())


def pendulums(num_envs: int = N, seed: int = SEED) -> Any:
    return envpool.make_gymnasium("Pendulum-v1", num_envs=num_envs, seed=seed, num_threads=1)


def cartpoles(num_envs: int = N, seed: int = SEED) -> Any:
    return envpool.make_gymnasium("CartPole-v1", num_envs=num_envs, seed=seed, num_threads=1)


class Facade:
    """A real EnvPool behind a plain object: what asyncrl recognises EnvPool by."""

    metadata: dict[str, Any] = {}

    def __init__(self, venv: Any) -> None:
        self.venv = venv
        self.config = venv.config
        self.all_env_ids = venv.all_env_ids
        self.observation_space = venv.observation_space
        self.action_space = venv.action_space

    def close(self) -> None:
        self.venv.close()


class Binding(Facade):
    """A real EnvPool behind a plain object with its binding and public API (as EnvPool's
    mixin calls them: ``step`` is ``_to(_recv())`` after ``_send(_from(...))``). Subclasses
    change one thing, as a future EnvPool might."""

    @property
    def _state_keys(self) -> list[str]:
        return list(self.venv._state_keys)

    @property
    def _action_keys(self) -> list[str]:
        return list(self.venv._action_keys)

    def _send(self, action: list[Any]) -> None:
        self.venv._send(action)

    def _recv(self) -> list[Any]:
        return self.venv._recv()

    def _reset(self, ids: np.ndarray) -> None:
        self.venv._reset(ids)

    def _to(self, state: list[Any], reset: bool, info: bool) -> Any:
        return self.venv._to(state, reset, info)

    def _from(self, action: Any, env_id: Any = None) -> list[Any]:
        return self.venv._from(action, env_id)

    def step(self, action: Any, env_id: Any = None) -> Any:
        self._send(self._from(action, env_id))
        return self._to(self._recv(), False, True)

    def reset(self, env_id: Any = None) -> Any:
        self._reset(self.all_env_ids if env_id is None else env_id)
        return self._to(self._recv(), True, True)


class PublicOnly(Facade):
    """Any EnvPool-like object seen through its public API only: the reference path."""

    def step(self, action: Any, env_id: Any = None) -> Any:
        return self.venv.step(action, env_id)

    def reset(self, env_id: Any = None) -> Any:
        return self.venv.reset(env_id)


class RenamedTrunc(Binding):
    """State keys that no longer say ``trunc``."""

    @property
    def _state_keys(self) -> list[str]:
        return ["truncated" if k == "trunc" else k for k in self.venv._state_keys]


class TerminatedIsDone(Binding):
    """A converter whose ``terminated`` is ``done`` (a truncation terminates too)."""

    def _to(self, state: list[Any], reset: bool, info: bool) -> Any:
        out = super()._to(state, reset, info)
        if reset:
            return out
        obs, reward, _, trunc, infos = out
        return obs, reward, state[self._state_keys.index("done")].copy(), trunc, infos


class ScaledObservations(Binding):
    """A public API that changes the observations after ``_to`` (what ``recv`` might add)."""

    def step(self, action: Any, env_id: Any = None) -> Any:
        obs, *rest = super().step(action, env_id)
        return (obs * 2, *rest)

    def reset(self, env_id: Any = None) -> Any:
        obs, info = super().reset(env_id)
        return obs * 2, info


def batches(venv: Any, policy: nn.Module, steps: int, count: int, **options: Any) -> list:
    pool = make_env_pool(venv)
    assert isinstance(pool, EnvIdVectorPool)
    with Rollout(pool, policy, N * steps,
                 options=RolloutOptions(exploration_type=None, **options)) as rollout:
        out = [rollout.collect().clone() for _ in range(count)]
        return [pool.steps_raw, *out]


def assert_same(got: list, want: list) -> None:
    assert len(got) == len(want)
    for a, b in zip(got[1:], want[1:], strict=True):
        for key in FRAME_KEYS:
            assert torch.equal(a[key], b[key]), key


def test_real_envpool_is_stepped_raw_and_public_is_not() -> None:
    raw, public = make_env_pool(pendulums()), make_env_pool(PublicOnly(pendulums()))
    try:
        assert raw.steps_raw and not public.steps_raw
    finally:
        raw.close()
        public.close()


def test_raw_pendulum_batches_are_the_public_ones_across_truncations() -> None:
    got = batches(pendulums(), swing(), 150, 3)
    want = batches(PublicOnly(pendulums()), swing(), 150, 3)
    assert got[0] is True and want[0] is False
    assert_same(got, want)
    truncs = torch.stack([b["next", "truncated"] for b in want[1:]])
    assert truncs.sum() == 2 * N, "450 steps cross Pendulum's 200-step limit twice per env"


def test_raw_cartpole_batches_are_the_public_ones_across_episode_ends() -> None:
    got = batches(cartpoles(), WrongWay(), 40, 3)
    want = batches(PublicOnly(cartpoles()), WrongWay(), 40, 3)
    assert got[0] is True
    assert_same(got, want)
    assert torch.stack([b["next", "terminated"] for b in want[1:]]).sum() >= 3 * N


def test_raw_resets_by_id_under_max_frames_per_traj_are_the_public_ones() -> None:
    got = batches(cartpoles(), WrongWay(), 30, 2, max_frames_per_traj=4)
    want = batches(PublicOnly(cartpoles()), WrongWay(), 30, 2, max_frames_per_traj=4)
    assert got[0] is True
    assert_same(got, want)


def test_raw_path_honours_envpool_seeds() -> None:
    pool = make_env_pool(pendulums(seed=SEED))
    other = make_env_pool(pendulums(seed=SEED + 100))
    try:
        obs = pool.reset()["observation"].copy()
        want = np.stack([pendulums(1, SEED + i).reset()[0][0] for i in range(N)])
        np.testing.assert_array_equal(obs, want)  # env i seeded with seed + i, as EnvPool does
        assert pool.steps_raw
        assert not np.array_equal(other.reset()["observation"], obs)
    finally:
        pool.close()
        other.close()


def test_a_faithful_binding_is_stepped_raw() -> None:
    got = batches(Binding(cartpoles()), WrongWay(), 40, 2)
    assert got[0] is True
    assert_same(got, batches(PublicOnly(cartpoles()), WrongWay(), 40, 2))


@pytest.mark.parametrize(("odd", "said"), [
    (RenamedTrunc, "no done / trunc"),
    (TerminatedIsDone, "terminated is not done & ~trunc"),
    (ScaledObservations, "the observations are not the obs entries"),
])
def test_an_odd_layout_falls_back_to_the_public_api(odd: type, said: str,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="asyncrl._rollout"):
        got = batches(odd(pendulums()), swing(), 150, 2)
    assert got[0] is False
    # What the public API gives for that env: any raw read would differ somewhere.
    assert_same(got, batches(PublicOnly(odd(pendulums())), swing(), 150, 2))
    said_once = [r for r in caplog.records if said in r.getMessage()]
    assert len(said_once) == 1 and said_once[0].levelno == logging.DEBUG


def test_info_keys_step_through_the_public_api() -> None:
    pool = make_env_pool(pendulums())
    try:
        with Rollout(pool, swing(), N * 4,
                     options=RolloutOptions(exploration_type=None,
                                            info_keys=["elapsed_step"])) as rollout:
            batch = rollout.collect()
            assert not pool.steps_raw
        assert batch["next", "elapsed_step"][0].tolist() == [1, 2, 3, 4]
    finally:
        pool.close()
