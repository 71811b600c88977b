"""getattr_env / getattr_policy reach the user's env and policy, and what comes back."""

from __future__ import annotations

import enum

import anyio
import gymnasium as gym
import numpy as np
import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule

from asyncrl import Collector, MultiSyncCollector
from asyncrl._rollout.envs import make_env_pool
from asyncrl._rollout.policies import PolicyAdapter
from asyncrl._rollout.reach import env_attr, policy_attr, wire_value

torchrl = pytest.importorskip("torchrl", reason="the torchrl extra is not installed")
from torchrl.envs import GymEnv, StepCounter, TransformedEnv  # noqa: E402
from torchrl.modules import ProbabilisticActor  # noqa: E402

pytestmark = pytest.mark.anyio
LIMIT = 120

NOT_SENDABLE = (
    "which cannot be sent back from a worker process: replies carry plain values (numbers, "
    "strings, lists, str-keyed dicts), tensors, numpy arrays and TensorDicts only (asyncrl "
    "never pickles). Ask for a plain part of it with a dotted name (e.g. "
    "'action_spec.shape'), or build the env or policy in the trainer to inspect the object "
    "itself")


class Scaled(gym.Wrapper):
    """A user's gymnasium wrapper with an attribute of its own."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.scale = 3


def wrapped_cartpole() -> gym.Env:
    return Scaled(gym.make("CartPole-v1"))


def torchrl_cartpole() -> TransformedEnv:
    return TransformedEnv(GymEnv("CartPole-v1", categorical_action_encoding=True),
                          StepCounter(max_steps=7))


def actor() -> ProbabilisticActor:
    net = TensorDictModule(torch.nn.Linear(4, 2), in_keys=["observation"], out_keys=["logits"])
    return ProbabilisticActor(net, in_keys=["logits"], out_keys=["action"],
                              distribution_class=torch.distributions.Categorical,
                              return_log_prob=True)


# -- the lookups -----------------------------------------------------------------------------------
def test_env_attr_goes_through_gymnasium_wrappers_then_the_pool() -> None:
    with make_env_pool(wrapped_cartpole, num_envs=2) as pool:
        assert env_attr(pool, "scale") == 3  # the user's wrapper
        assert env_attr(pool, "x_threshold") == 2.4  # the env inside TimeLimit etc.
        assert env_attr(pool, "spec.max_episode_steps") == 500
        assert env_attr(pool, "num_envs") == 2  # asyncrl's pool: how many envs it steps
        with pytest.raises(AttributeError) as info:
            env_attr(pool, "nope")
    assert str(info.value) == ("the env (Scaled -> TimeLimit -> OrderEnforcing -> "
                               "PassiveEnvChecker -> CartPoleEnv) has no attribute 'nope'")


def test_env_attr_goes_through_torchrl_transforms() -> None:
    with make_env_pool(torchrl_cartpole) as pool:
        assert type(env_attr(pool, "action_spec")).__name__ == "Categorical"
        assert env_attr(pool, "action_spec.shape") == torch.Size([])
        assert env_attr(pool, "transform").max_steps == 7
        assert env_attr(pool, "batch_size") == torch.Size([])
        with pytest.raises(AttributeError) as info:
            env_attr(pool, "action_spec.nope")
    assert str(info.value) == "action_spec (Categorical) has no attribute 'nope'"


def test_policy_attr_reaches_a_probabilistic_actors_modules_and_through_the_adapter() -> None:
    policy = actor()
    assert policy_attr(policy, "return_log_prob") is True
    assert policy_attr(PolicyAdapter(policy), "return_log_prob") is True
    assert policy_attr(policy, "training") is True  # the actor's own first
    with pytest.raises(AttributeError) as info:
        policy_attr(policy, "nope")
    assert str(info.value) == ("the policy (ProbabilisticActor) and its sub-modules have no "
                               "attribute 'nope'")


def test_names_are_attribute_names() -> None:
    with pytest.raises(ValueError) as info:
        policy_attr(actor(), "__class__.__init__()")
    assert str(info.value) == ("expected an attribute name, maybe dotted ('action_spec.shape'), "
                               "got '__class__.__init__()'")


class Colour(enum.Enum):
    RED = "red"


def test_wire_values() -> None:
    t = torch.ones(2, requires_grad=True)
    assert wire_value(torch.Size([2, 3]), what="x") == [2, 3]
    assert wire_value((1, "a", None, 2.5), what="x") == [1, "a", None, 2.5]
    assert wire_value({"k": np.float32(1.5)}, what="x") == {"k": 1.5}
    assert wire_value(torch.float32, what="x") == "torch.float32"
    assert wire_value(torch.device("cpu"), what="x") == "cpu"
    assert wire_value(Colour.RED, what="x") == "red"
    assert not wire_value(t, what="x").requires_grad
    td = TensorDict({"a": torch.zeros(2)}, batch_size=[2])
    assert wire_value(td, what="x") is td
    with pytest.raises(TypeError) as info:
        wire_value({"spec": object()}, what="the env's 'thing'")
    assert str(info.value) == f"the env's 'thing' is a builtins.object, {NOT_SENDABLE}"


# -- through the collectors -------------------------------------------------------------
async def test_multi_collector_reaches_a_torchrl_env_and_actor() -> None:
    with anyio.fail_after(LIMIT):
        async with MultiSyncCollector(torchrl_cartpole, actor(), num_workers=1,
                                      frames_per_batch=8, total_frames=8) as c:
            assert await c.getattr_env("action_spec.shape") == []
            assert await c.getattr_env("action_spec.dtype") == "torch.int64"
            assert await c.getattr_env("transform.max_steps") == 7
            assert await c.getattr_policy("return_log_prob") is True
            with pytest.raises(TypeError) as info:
                await c.getattr_env("action_spec")
            with pytest.raises(AttributeError) as missing:
                await c.getattr_policy("nope")
    assert str(info.value) == ("the env's 'action_spec' is a "
                               f"torchrl.data.tensor_specs.Categorical, {NOT_SENDABLE}")
    assert str(missing.value) == ("the policy (ProbabilisticActor) and its sub-modules have no "
                                  "attribute 'nope'")


async def test_multi_collector_reaches_a_gymnasium_wrapper_and_the_random_policy() -> None:
    with anyio.fail_after(LIMIT):
        async with MultiSyncCollector(wrapped_cartpole, num_workers=1, envs_per_worker=2,
                                      frames_per_batch=8, total_frames=8) as c:
            assert await c.getattr_env("scale") == 3
            assert await c.getattr_env("x_threshold") == 2.4
            assert await c.getattr_env("num_envs") == 2
            # policy=None: the rollout's RandomPolicy, whose spec is plain data inside
            assert await c.getattr_policy("spec.n") == 2


async def test_in_process_collector_has_the_same_reach_and_returns_objects() -> None:
    policy = actor()
    with anyio.fail_after(LIMIT):
        async with Collector(torchrl_cartpole, policy, frames_per_batch=8,
                             total_frames=8) as c:
            spec = await c.getattr_env("action_spec")
            assert type(spec).__name__ == "Categorical" and spec.space.n == 2
            assert await c.getattr_env("transform.max_steps") == 7
            assert await c.getattr_policy("return_log_prob") is True
            with pytest.raises(AttributeError, match="has no attribute 'nope'"):
                await c.getattr_env("nope")
