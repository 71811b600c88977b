"""``info_keys``: the named info entries of each step land under ``"next"``, checked.

Every kind of gymnasium env the rollout steps (a list of envs, a vector env in
SAME_STEP or NEXT_STEP mode, an EnvPool-style env) gives the same rows: the
info of the step that produced the frame, the terminal step's where an episode
ends (never the reset's, which says ``steps=-1``).
"""

from __future__ import annotations

import functools

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from gymnasium.wrappers.vector import RecordEpisodeStatistics as VectorEpisodeStatistics

from asyncrl import SpecMismatchError
from asyncrl._rollout.envs import make_env_pool
from asyncrl._rollout.infos import InfoReader, normalise_info_keys
from asyncrl._rollout.loop import Rollout
from asyncrl._rollout.options import RolloutOptions
from tests.asyncrl.rollout.fake_envpool import FakeEnvPool
from tests.asyncrl.rollout.info_envs import StepInfoEnv, StepInfoFactory

N, T = 3, 12


def env_list() -> object:
    return StepInfoFactory()


def vector(mode: AutoresetMode) -> object:
    # Under a wrapper: stepped through the vector env's own step (not unwrapped).
    return VectorEpisodeStatistics(SyncVectorEnv(
        [functools.partial(StepInfoEnv, offset=i) for i in range(N)], autoreset_mode=mode))


def envpool() -> object:
    return FakeEnvPool(StepInfoFactory(), N)


KINDS = {
    "env list": lambda: make_env_pool(env_list(), num_envs=N),
    "vector SAME_STEP": lambda: make_env_pool(vector(AutoresetMode.SAME_STEP)),
    "vector NEXT_STEP": lambda: make_env_pool(vector(AutoresetMode.NEXT_STEP)),
    "envpool": lambda: make_env_pool(envpool()),
}


def collect(kind: str, info_keys: object, batches: int = 3) -> list:
    with Rollout(KINDS[kind](), None, N * T, options=RolloutOptions(info_keys=info_keys)) as r:
        r.set_seed(0)
        return [r.collect().clone() for _ in range(batches)]


@pytest.mark.parametrize("kind", list(KINDS))
def test_each_row_carries_its_steps_info_terminal_rows_included(kind: str) -> None:
    ends = 0
    for batch in collect(kind, ["steps", "stats"]):
        t = batch["next", "observation"][..., 0]  # the step count the env reached
        assert batch["next", "steps"].dtype == torch.int64
        assert torch.equal(batch["next", "steps"], t.long())
        assert torch.equal(batch["next", "stats", "x"], torch.stack([t, -t], -1))
        ends += int(batch["next", "done"].sum())
    assert ends >= 6  # auto-resets happened inside the batches


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_tuple_key_takes_one_leaf(kind: str) -> None:
    batch = collect(kind, [("stats", "x")], batches=1)[0]
    assert set(batch["next"].keys(include_nested=True, leaves_only=True)) >= {("stats", "x")}
    assert "steps" not in batch["next"].keys()
    t = batch["next", "observation"][..., 0]
    assert torch.equal(batch["next", "stats", "x"][..., 0], t)


def test_record_episode_statistics_episode_is_nested_and_matches_the_rewards() -> None:
    def make() -> gym.Env:
        return gym.wrappers.RecordEpisodeStatistics(StepInfoEnv())

    with Rollout(make_env_pool(make, num_envs=2), None, 40,
                 options=RolloutOptions(info_keys=["episode"])) as rollout:
        batch = rollout.collect()
    done = batch["next", "done"][..., 0]
    episode = batch["next", "episode"]
    assert sorted(episode.keys()) == ["l", "r", "t"]
    assert episode["r"].dtype == torch.float64 and episode["l"].dtype == torch.int64
    t = batch["next", "observation"][..., 0]
    # The reward of step t is t: an episode of length L returns L * (L + 1) / 2.
    assert torch.equal(episode["l"][done], t[done].long())
    assert torch.equal(episode["r"][done], (t * (t + 1) / 2)[done].double())
    assert not episode["l"][~done].any()  # absent on other steps: zeros


def test_vector_episode_and_its_mask() -> None:
    venv = VectorEpisodeStatistics(SyncVectorEnv(
        [functools.partial(StepInfoEnv, offset=i) for i in range(N)],
        autoreset_mode=AutoresetMode.SAME_STEP))
    with Rollout(make_env_pool(venv), None, N * T,
                 options=RolloutOptions(info_keys=["episode", "_episode"])) as rollout:
        batch = rollout.collect()
    done = batch["next", "done"][..., 0]
    assert torch.equal(batch["next", "_episode"], done)
    t = batch["next", "observation"][..., 0]
    assert torch.equal(batch["next", "episode", "l"][done], t[done].long())
    assert torch.equal(batch["next", "episode", "r"][done], (t * (t + 1) / 2)[done].double())


def test_a_later_step_with_another_dtype_is_an_error_naming_the_key() -> None:
    def make() -> gym.Env:
        return StepInfoEnv(bad_at=6)  # the probe step is step 1: int; step 6 gives a float

    with Rollout(make_env_pool(make, num_envs=1), None, 10,
                 options=RolloutOptions(info_keys=["steps"])) as rollout:
        with pytest.raises(SpecMismatchError, match=r"info entry 'steps'.*int64 of shape \(\)"
                                                    r".*float64"):
            rollout.collect()


def test_an_entry_the_first_step_lacks_needs_its_spec() -> None:
    with pytest.raises(ValueError, match=r"'nowhere' was not in the first step's info.*give"):
        Rollout(make_env_pool(StepInfoEnv, num_envs=1), None, 4,
                options=RolloutOptions(info_keys=["nowhere"]))
    with Rollout(make_env_pool(StepInfoEnv, num_envs=1), None, 4,
                 options=RolloutOptions(info_keys={"nowhere": "float32"})) as rollout:
        batch = rollout.collect()
    assert batch["next", "nowhere"].dtype == torch.float32
    assert not batch["next", "nowhere"].any()


def test_info_keys_are_checked_when_given() -> None:
    with pytest.raises(ValueError, match="clashes with the batch's own"):
        RolloutOptions(info_keys=["reward"])
    with pytest.raises(TypeError, match="is not a key"):
        RolloutOptions(info_keys=[3])
    with pytest.raises(TypeError, match=r"info_keys\['x'\]: expected a dtype"):
        RolloutOptions(info_keys={"x": "no-such-dtype"})
    assert RolloutOptions(info_keys="episode").info_keys == ((("episode",), None),)


def test_a_torchrl_env_is_refused_naming_its_own_reader() -> None:
    from tests.asyncrl.det_envs import make_torchrl_count_env

    with pytest.raises(ValueError, match="set_info_dict_reader"):
        Rollout(make_env_pool(make_torchrl_count_env()), None, 4,
                options=RolloutOptions(info_keys=["steps"]))


def test_reading_reuses_its_buffers() -> None:
    reader = InfoReader(normalise_info_keys(["steps"]) or (), num_envs=2)
    reader.read_env(0, {"steps": 1})
    reader.learn_done()
    before = [a.__array_interface__["data"][0] for a in reader.arrays]
    for t in range(5):
        reader.read_env(0, {"steps": t})
        reader.read_vector({"steps": np.array([t, t]), "_steps": np.array([True, False])})
    assert [a.__array_interface__["data"][0] for a in reader.arrays] == before
    assert reader.arrays[0].tolist() == [4, 0]
