"""Plain torch policies: tuple and dict outputs, agent methods, errors that name the fix.

``policy_in_keys``, ``policy_out_keys`` and ``policy_method`` on every collector:
a CleanRL-style agent (no ``forward``; ``get_action_and_value`` returning a
tuple) steps in-process and in worker processes, its outputs under the keys
named, on both anyio backends.
"""

from __future__ import annotations

import functools

import anyio
import gymnasium as gym
import numpy as np
import pytest
import torch
from tensordict.nn import TensorDictModule
from torch import nn

from asyncrl import Collector, MultiAsyncCollector, MultiSyncCollector
from asyncrl._rollout.envs import make_env_pool
from asyncrl._rollout.loop import Rollout
from asyncrl._rollout.options import RolloutOptions
from tests.asyncrl.det_envs import FirstBit, make_count_env

LIMIT = 90
OUT_KEYS = ("action", "sample_log_prob", "entropy", "state_value")


class Agent(nn.Module):
    """CleanRL's shape of agent, deterministic: no forward, get_action_and_value -> 4 outputs.

    On CountEnv (observation ``[t, episode]``): action = episode parity, log-prob = -t,
    entropy = episode, value = 2 * t (shape ``[N, 1]``, as CleanRL's critic).
    """

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(2.0))

    def get_value(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x[..., :1]

    def get_action_and_value(self, x: torch.Tensor, action: torch.Tensor | None = None
                             ) -> tuple[torch.Tensor, ...]:
        if action is None:
            action = x[..., 1].long() % 2
        return action, -x[..., 0], x[..., 1], self.get_value(x)


class TupleNet(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x[..., 1].long() % 2, x[..., 0] * 10


class DictNet(nn.Module):
    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"action": x[..., 1].long() % 2, "logits": x * 3}


def check_agent_batch(batch) -> None:
    t, episode = batch["observation"][..., 0], batch["observation"][..., 1]
    assert torch.equal(batch["action"], episode.long() % 2)
    assert torch.equal(batch["sample_log_prob"], -t)
    assert torch.equal(batch["entropy"], episode)
    assert torch.equal(batch["state_value"], 2 * t.unsqueeze(-1))
    assert batch["state_value"].shape[-1] == 1


def rollout_batch(policy: object, **options: object):
    with Rollout(make_env_pool(make_count_env, num_envs=2), policy, 2 * 6,
                 options=RolloutOptions(**options)) as rollout:
        return rollout.collect().clone()


# -- the rollout: outputs land under the keys named -------------------------------------

def test_agent_method_tuple_lands_under_out_keys() -> None:
    batch = rollout_batch(Agent(), policy_method="get_action_and_value",
                          policy_out_keys=OUT_KEYS)
    check_agent_batch(batch)


def test_forward_tuple_and_in_keys() -> None:
    batch = rollout_batch(TupleNet(), policy_in_keys=["observation"],
                          policy_out_keys=["action", ("extra", "scaled")])
    assert torch.equal(batch["extra", "scaled"], batch["observation"][..., 0] * 10)
    assert torch.equal(batch["action"], batch["observation"][..., 1].long() % 2)


def test_dict_output_every_entry_or_only_those_named() -> None:
    every = rollout_batch(DictNet())
    assert torch.equal(every["logits"], every["observation"] * 3)
    named = rollout_batch(DictNet(), policy_out_keys=("action",))
    assert "logits" not in named.keys()
    assert torch.equal(named["action"], named["observation"][..., 1].long() % 2)


class TwoViews(gym.Env):
    """A Dict observation: ``"pos"`` (2,) and ``"vel"`` (3,), both counting steps."""

    def __init__(self) -> None:
        box = functools.partial(gym.spaces.Box, -1e6, 1e6, dtype=np.float32)
        self.observation_space = gym.spaces.Dict({"pos": box((2,)), "vel": box((3,))})
        self.action_space = gym.spaces.Discrete(2)
        self._t = 0

    def _obs(self) -> dict:
        return {"pos": np.full(2, self._t, np.float32), "vel": np.full(3, -self._t, np.float32)}

    def reset(self, *, seed=None, options=None):
        self._t = 0
        return self._obs(), {}

    def step(self, action):
        self._t += 1
        return self._obs(), 0.0, self._t >= 4, False, {}


class VelocityOnly(nn.Module):
    def forward(self, vel: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        assert vel.shape[-1] == 3  # only the key named was given
        return (vel[..., 0] < -1).long(), vel.sum(-1)


def test_in_keys_pick_the_observations_given() -> None:
    with Rollout(make_env_pool(TwoViews, num_envs=2), VelocityOnly(), 2 * 5,
                 options=RolloutOptions(policy_in_keys=["vel"],
                                        policy_out_keys=("action", "speed"))) as rollout:
        batch = rollout.collect()
    assert torch.equal(batch["speed"], batch["vel"].sum(-1))
    assert torch.equal(batch["action"], (batch["vel"][..., 0] < -1).long())


def test_a_plain_function_with_keys() -> None:
    def act(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x[..., 1].long() % 2, x[..., 0]

    batch = rollout_batch(act, policy_out_keys=("action", "t"))
    assert torch.equal(batch["t"], batch["observation"][..., 0])


def test_a_plain_module_without_options_behaves_as_before() -> None:
    batch = rollout_batch(FirstBit())
    assert torch.equal(batch["action"], batch["observation"][..., 1].long() % 2)


# -- errors at construction (or the first, dry call) that name the fix -------------------

def test_agent_without_forward_is_refused_naming_policy_method() -> None:
    with pytest.raises(TypeError, match=r"Agent has no forward\(\).*get_action_and_value.*"
                                        r"policy_method="):
        Collector(make_count_env, Agent(), frames_per_batch=4)
    with pytest.raises(TypeError, match="policy_method="):
        MultiSyncCollector(make_count_env, Agent(), num_workers=1, frames_per_batch=4)


def test_unknown_method_names_the_agents_methods() -> None:
    with pytest.raises(ValueError, match=r"'get_action'.*get_action_and_value, get_value"):
        Collector(make_count_env, Agent(), policy_method="get_action", frames_per_batch=4)


def test_options_for_a_tensordict_module_are_refused() -> None:
    module = TensorDictModule(FirstBit(), in_keys=["observation"], out_keys=["action"])
    with pytest.raises(TypeError, match="policy_out_keys describe how to call a plain module"):
        Collector(make_count_env, module, policy_out_keys=("action",), frames_per_batch=4)


@pytest.mark.parametrize(("keys", "error", "match"), [
    (("value",), ValueError, "has no 'action'"),
    (("action", "action"), ValueError, "names a key twice"),
    ((1,), TypeError, "is not a key"),
    ((), TypeError, "non-empty"),
])
def test_bad_out_keys_are_refused(keys: tuple, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        MultiAsyncCollector(make_count_env, TupleNet(), policy_out_keys=keys, num_workers=1,
                            frames_per_batch=4)


def test_bad_method_name_is_refused() -> None:
    with pytest.raises(TypeError, match="policy_method must be the name of a method"):
        Collector(make_count_env, Agent(), policy_method=3, frames_per_batch=4)


def test_tuple_without_out_keys_names_policy_out_keys() -> None:
    with pytest.raises(TypeError, match=r"tuple of 2 outputs: name them.*policy_out_keys="):
        rollout_batch(TupleNet())


def test_length_mismatch_says_both_counts() -> None:
    with pytest.raises(ValueError, match=r"returned 4 outputs but policy_out_keys names 2"):
        rollout_batch(Agent(), policy_method="get_action_and_value",
                      policy_out_keys=("action", "value"))


def test_in_keys_the_env_lacks_are_refused() -> None:
    with pytest.raises(ValueError, match=r"policy_in_keys names \['pixels'\]"):
        rollout_batch(TupleNet(), policy_in_keys=("pixels",), policy_out_keys=("action", "v"))


# -- collectors, both anyio backends -----------------------------------------------------

async def agent_batches(collector) -> list:
    with anyio.fail_after(LIMIT):
        async with collector:
            return [b.clone() async for b in collector]


@pytest.mark.anyio
async def test_collector_with_an_agent_method() -> None:
    agent = Agent()
    collector = Collector(make_count_env, agent, policy_method="get_action_and_value",
                          policy_out_keys=OUT_KEYS, frames_per_batch=6, total_frames=12)
    batches = await agent_batches(collector)
    assert len(batches) == 2
    for batch in batches:
        check_agent_batch(batch)


@pytest.mark.anyio
async def test_multi_sync_collector_agent_in_workers_and_weights() -> None:
    agent = Agent()
    collector = MultiSyncCollector(make_count_env, agent, num_workers=2,
                                   policy_method="get_action_and_value",
                                   policy_out_keys=OUT_KEYS, frames_per_batch=12,
                                   total_frames=24)
    with anyio.fail_after(LIMIT):
        async with collector:
            batches = []
            async for batch in collector:
                batches.append(batch.clone())
                if len(batches) == 1:  # the agent's weights reach the workers' copies
                    with torch.no_grad():
                        agent.scale.fill_(3.0)
                    await collector.update_policy_weights()
    assert [tuple(b.shape) for b in batches] == [(2, 6)] * 2
    check_agent_batch(batches[0])
    t = batches[1]["observation"][..., 0]
    assert torch.equal(batches[1]["state_value"], 3 * t.unsqueeze(-1))


@pytest.mark.anyio
async def test_multi_async_collector_tuple_forward() -> None:
    collector = MultiAsyncCollector(make_count_env, TupleNet(), num_workers=1,
                                    policy_out_keys=("action", "scaled"), frames_per_batch=4,
                                    total_frames=8)
    batches = await agent_batches(collector)
    for batch in batches:
        assert torch.equal(batch["scaled"], batch["observation"][..., 0] * 10)


@pytest.mark.anyio
async def test_collector_tuple_without_out_keys_fails_at_open() -> None:
    collector = Collector(make_count_env, TupleNet(), frames_per_batch=4)
    with anyio.fail_after(LIMIT), pytest.raises(TypeError, match="policy_out_keys="):
        async with collector:
            pass
