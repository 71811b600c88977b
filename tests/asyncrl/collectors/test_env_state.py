"""Env state as plain data (``asyncrl._rollout.env_state``) and merged running statistics
(``asyncrl.collectors._env_statistics``), without a collector."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.wrappers import NormalizeObservation, NormalizeReward
from gymnasium.wrappers import vector as vector_wrappers
from gymnasium.wrappers.utils import RunningMeanStd

from asyncrl._protocol import Control
from asyncrl._rollout.env_state import load_env_state, plain_stats, read_env_state
from asyncrl._worker.control import run_control
from asyncrl.collectors._env_statistics import EnvStatistics, Moments
from transports import decode, encode


def _stepped(env: Any, steps: int = 20, seed: int = 0) -> Any:
    env.reset(seed=seed)
    env.action_space.seed(seed)
    for _ in range(steps):
        env.step(env.action_space.sample())
    return env


def _pendulum() -> Any:
    return NormalizeReward(NormalizeObservation(gym.make("Pendulum-v1")))


def test_normalization_wrappers_state_is_found_down_the_chain_and_round_trips() -> None:
    env = _stepped(_pendulum())
    state = read_env_state([env])
    assert sorted(state["env0"]) == ["0.NormalizeReward", "1.NormalizeObservation"]
    reward = state["env0"]["0.NormalizeReward"]
    assert sorted(reward) == ["discounted_reward", "return_rms"]
    obs = state["env0"]["1.NormalizeObservation"]["obs_rms"]
    assert obs["count"] == pytest.approx(21 + 1e-4)  # the reset and 20 steps
    np.testing.assert_array_equal(obs["mean"], env.get_wrapper_attr("obs_rms").mean)
    # it crosses the wire as msgpack and raw frames (no pickle)
    back = decode(encode(state))
    fresh = _pendulum()
    load_env_state([fresh], back)
    np.testing.assert_array_equal(fresh.get_wrapper_attr("obs_rms").var, obs["var"])
    assert fresh.get_wrapper_attr("obs_rms").count == obs["count"]
    assert fresh.return_rms.count == reward["return_rms"]["count"]
    np.testing.assert_array_equal(fresh.discounted_reward, reward["discounted_reward"])


def test_vector_wrappers_and_the_sub_envs_of_a_sync_vector_env_are_walked() -> None:
    venv = vector_wrappers.NormalizeReward(vector_wrappers.NormalizeObservation(
        gym.make_vec("Pendulum-v1", num_envs=2, vectorization_mode="sync")))
    _stepped(venv, steps=5)
    state = read_env_state([venv])["env0"]
    assert sorted(state) == ["0.NormalizeReward", "1.NormalizeObservation"]
    assert sorted(state["0.NormalizeReward"]) == ["accumulated_reward", "return_rms"]
    assert state["1.NormalizeObservation"]["obs_rms"]["count"] == pytest.approx(12 + 1e-4)
    inner = gym.vector.SyncVectorEnv(
        [lambda: NormalizeObservation(gym.make("Pendulum-v1"))] * 2)
    _stepped(inner, steps=3)
    keys = sorted(read_env_state([inner])["env0"])
    assert keys == ["0.SyncVectorEnv/0/0.NormalizeObservation",
                    "0.SyncVectorEnv/1/0.NormalizeObservation"]


class Scaler(gym.ObservationWrapper[Any, Any, Any]):
    """A wrapper with its own state_dict() / load_state_dict(): the generic hook."""

    def __init__(self, env: Any) -> None:
        super().__init__(env)
        self.scale = 1.0

    def observation(self, observation: Any) -> Any:
        return observation * self.scale

    def state_dict(self) -> dict[str, Any]:
        return {"scale": self.scale, "stats": RunningMeanStd(shape=(2,))}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scale = state["scale"]


def test_an_env_that_defines_state_dict_has_it_used() -> None:
    env = Scaler(gym.make("Pendulum-v1"))
    env.scale = 3.0
    state = read_env_state([env])["env0"]["0.Scaler"]
    assert state["state_dict"]["scale"] == 3.0
    assert sorted(state["state_dict"]["stats"]) == ["count", "mean", "var"]  # made plain
    other = Scaler(gym.make("Pendulum-v1"))
    load_env_state([other], {"env0": {"0.Scaler": {"state_dict": {"scale": 3.0}}}})
    assert other.scale == 3.0


def test_a_state_that_does_not_fit_is_refused_before_anything_is_written() -> None:
    env = _pendulum()
    before = env.get_wrapper_attr("obs_rms").mean.copy()
    good = {"mean": np.ones(3), "var": np.ones(3), "count": 5.0}
    with pytest.raises(ValueError, match=r"env0 has no wrapper '0.TimeLimit'.*"
                                         r"0.NormalizeReward, 1.NormalizeObservation"):
        load_env_state([env], {"env0": {"1.NormalizeObservation": {"obs_rms": good},
                                        "0.TimeLimit": {}}})
    with pytest.raises(ValueError, match=r"obs_rms.mean must be numbers of shape \(3,\), "
                                         r"got float64 of shape \(2,\)"):
        load_env_state([env], {"env0": {"1.NormalizeObservation": {
            "obs_rms": {**good, "mean": np.ones(2)}}}})
    with pytest.raises(ValueError, match=r"keys are 'env0'..'env0'.*got 'env1'"):
        load_env_state([env], {"env1": {}})
    for bad in ({"mean": np.array([np.nan, 0.0, 0.0])}, {"var": np.array([1.0, -1.0, 1.0])},
                {"count": float("inf")}):
        with pytest.raises(ValueError, match=r"obs_rms must be finite, with a variance >= 0"):
            load_env_state([env], {"env0": {"1.NormalizeObservation": {
                "obs_rms": {**good, **bad}}}})
    np.testing.assert_array_equal(env.get_wrapper_attr("obs_rms").mean, before)


def test_getattr_env_in_a_worker_sends_running_statistics_as_a_dict() -> None:
    env = _stepped(_pendulum(), steps=3)
    answer = run_control(Control("getattr_env", {"attr": "obs_rms"}),
                         rollout=object(), policy=None, env_pool=env)  # type: ignore[arg-type]
    assert sorted(answer) == ["count", "mean", "var"]
    assert answer["count"] == pytest.approx(4 + 1e-4)
    assert plain_stats([env.get_wrapper_attr("obs_rms")])[0]["count"] == answer["count"]


def test_chan_merge_and_its_inverse_are_exact() -> None:
    rng = np.random.default_rng(0)
    parts = [rng.normal(loc, 2.0, size=(n, 3)) for loc, n in [(0.0, 7), (5.0, 11), (-3.0, 4)]]
    moments = [Moments(p.mean(0), p.var(0), float(len(p))) for p in parts]
    merged = moments[0] + moments[1] + moments[2]
    every = np.concatenate(parts)
    np.testing.assert_allclose(merged.mean, every.mean(0), rtol=1e-12)
    np.testing.assert_allclose(merged.var, every.var(0), rtol=1e-12)
    rest = merged - moments[0]
    np.testing.assert_allclose(rest.var, np.concatenate(parts[1:]).var(0), rtol=1e-10)


def _rms(observations: np.ndarray, base: dict[str, Any] | None = None) -> RunningMeanStd:
    rms = RunningMeanStd(shape=(2,), dtype=np.float64)
    if base is not None:
        rms.mean, rms.var, rms.count = base["mean"].copy(), base["var"].copy(), base["count"]
    rms.count = 0.0 if base is None else rms.count  # no prior: exact numbers
    rms.update(observations)
    return rms


def _state(rms: RunningMeanStd) -> dict[str, Any]:
    return {"env0": {"0.NormalizeObservation": {"obs_rms": plain_stats(rms)}}}


def test_a_second_merge_counts_only_what_each_worker_saw_since_the_first() -> None:
    rng = np.random.default_rng(1)
    first = [rng.normal(i, 1.0, (9, 2)) for i in range(2)]
    second = [rng.normal(3 * i, 2.0, (5, 2)) for i in range(2)]
    keeper = EnvStatistics()
    states = {peer: (i, _state(_rms(first[i]))) for i, peer in enumerate([b"a", b"b"])}
    merged, updates, _ = keeper.merge(states)
    keeper.merged(merged, states)
    back = updates[b"a"]["env0"]["0.NormalizeObservation"]["obs_rms"]
    states = {peer: (i, _state(_rms(second[i], back))) for i, peer in enumerate([b"a", b"b"])}
    merged, _, _ = keeper.merge(states)
    every = np.concatenate(first + second)
    np.testing.assert_allclose(merged.mean, every.mean(0), rtol=1e-12)
    np.testing.assert_allclose(merged.var, every.var(0), rtol=1e-12)
    assert merged.count == len(every)
    # a replacement given worker 1's carried state counts from the merge too
    assert keeper.carry(1, b"c") is not None
