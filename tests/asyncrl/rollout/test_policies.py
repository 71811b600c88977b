"""RandomPolicy and PolicyAdapter: ranges, dtypes, buffer reuse, calling conventions."""

from __future__ import annotations

import doctest
from typing import Any

import numpy as np
import pytest
import torch
from gymnasium import spaces
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from tensordict.nn.probabilistic import interaction_type

import asyncrl._rollout.policies
from asyncrl._rollout.envs import ArraySpec
from asyncrl._rollout.policies import (
    ExplorationType,
    PolicyAdapter,
    RandomPolicy,
    resolve_exploration_type,
)


def _td(n: int = 64, obs_dim: int = 4) -> TensorDict:
    return TensorDict({"observation": torch.zeros(n, obs_dim)}, batch_size=[n])


# -- RandomPolicy ---------------------------------------------------------------------------


def test_discrete_uniform_range_and_dtype() -> None:
    td = RandomPolicy(spaces.Discrete(3), seed=0)(_td(3000))
    action = td["action"]
    assert action.shape == (3000,) and action.dtype == torch.int64
    counts = torch.bincount(action, minlength=3)
    assert counts.numel() == 3 and (counts > 900).all()


def test_discrete_with_negative_start() -> None:
    action = RandomPolicy(spaces.Discrete(4, start=-2), seed=1)(_td(2000))["action"]
    assert set(action.unique().tolist()) == {-2, -1, 0, 1}


def test_multidiscrete_and_multibinary() -> None:
    space = spaces.MultiDiscrete([2, 5], start=[1, -3])
    action = RandomPolicy(space, seed=0)(_td(2000))["action"]
    assert action.shape == (2000, 2)
    assert set(action[:, 0].unique().tolist()) == {1, 2}
    assert set(action[:, 1].unique().tolist()) == {-3, -2, -1, 0, 1}
    bits = RandomPolicy(spaces.MultiBinary(3), seed=0)(_td(100))["action"]
    assert bits.dtype == torch.int8 and set(bits.unique().tolist()) == {0, 1}


def test_box_bounded_per_dim() -> None:
    low, high = np.array([-1.0, 10.0], np.float32), np.array([1.0, 20.0], np.float32)
    space = spaces.Box(low, high, dtype=np.float32)
    action = RandomPolicy(space, seed=0)(_td(1000))["action"]
    assert action.dtype == torch.float32 and action.shape == (1000, 2)
    assert (action[:, 0] >= -1).all() and (action[:, 0] <= 1).all()
    assert (action[:, 1] >= 10).all() and (action[:, 1] <= 20).all()


def test_box_unbounded_and_half_bounded() -> None:
    low = np.array([-np.inf, 0.0, -1.0], dtype=np.float32)
    high = np.array([np.inf, np.inf, 1.0], dtype=np.float32)
    action = RandomPolicy(spaces.Box(low, high, dtype=np.float32), seed=0)(_td(1000))["action"]
    assert torch.isfinite(action).all()
    assert (action[:, 0] < 0).any()  # normal on the unbounded dim
    assert (action[:, 1] >= 0).all()  # clipped at its one bound
    assert (action[:, 2].abs() <= 1).all()


def test_from_array_spec_and_seeding() -> None:
    spec = ArraySpec((2,), "float32", -2.0, 2.0)
    a = RandomPolicy(spec, seed=3)(_td(5))["action"]
    b = RandomPolicy(spec, seed=3)(_td(5))["action"]
    torch.testing.assert_close(a, b)
    policy = RandomPolicy(spec, seed=3)
    policy.set_seed(3)
    torch.testing.assert_close(policy(_td(5))["action"], a)


def test_fills_existing_action_in_place() -> None:
    policy = RandomPolicy(spaces.Discrete(5), seed=0)
    td = _td(8)
    buffer = torch.full((8,), -1, dtype=torch.int64)
    td["action"] = buffer
    for _ in range(3):
        policy(td)
        assert td.get("action") is buffer
        assert ((buffer >= 0) & (buffer < 5)).all()


def test_new_tensor_when_no_action_entry() -> None:
    policy = RandomPolicy(spaces.Discrete(5), seed=0)
    first = policy(_td(4))["action"]
    second = policy(_td(4))["action"]
    assert first.data_ptr() != second.data_ptr()


def test_integer_spec_needs_bounds() -> None:
    with pytest.raises(ValueError, match="bounds"):
        RandomPolicy(ArraySpec((), "int64"))


# -- PolicyAdapter ---------------------------------------------------------------------------


def test_plain_module_gets_the_observation_tensor() -> None:
    module = torch.nn.Linear(4, 2)
    adapter = PolicyAdapter(module)
    assert adapter.takes_tensors
    td = _td(3)
    with adapter.exploration():
        out = adapter(td)
    assert out is td and td["action"].shape == (3, 2)
    assert not td["action"].requires_grad


def test_plain_module_with_several_observation_keys() -> None:
    class Two(torch.nn.Module):
        def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return a.sum(-1) + b.sum(-1)

    td = TensorDict({"a": torch.ones(2, 3), ("n", "b"): torch.ones(2, 1)}, batch_size=[2])
    adapter = PolicyAdapter(Two(), observation_keys=["a", ("n", "b")])
    assert adapter(td)["action"].tolist() == [4.0, 4.0]


def test_tensordict_module_and_callables() -> None:
    module = TensorDictModule(torch.nn.Linear(4, 3), in_keys=["observation"], out_keys=["action"])
    assert not PolicyAdapter(module).takes_tensors
    assert PolicyAdapter(module)(_td(2))["action"].shape == (2, 3)

    def in_place(td: Any) -> Any:
        td["action"] = torch.zeros(td.shape[0], dtype=torch.int64)
        td["value"] = torch.ones(td.shape[0])
        return td

    td = PolicyAdapter(in_place)(_td(2))
    assert set(td.keys()) == {"observation", "action", "value"}

    def new_td(td: Any) -> Any:
        return TensorDict({"action": torch.ones(2), "loc": torch.zeros(2, 2)}, batch_size=[2])

    td = _td(2)
    assert PolicyAdapter(new_td)(td) is td
    assert set(td.keys()) == {"observation", "action", "loc"}


def test_exploration_type_set_once_with_no_grad() -> None:
    seen = []

    def spy(td: Any) -> Any:
        seen.append((str(interaction_type()), torch.is_grad_enabled()))
        td["action"] = torch.zeros(td.shape[0])
        return td

    adapter = PolicyAdapter(spy, exploration_type="deterministic")
    with adapter.exploration():
        adapter(_td(1))
    assert seen == [(str(ExplorationType.DETERMINISTIC), False)]


def test_resolve_exploration_type() -> None:
    assert resolve_exploration_type("MODE") is ExplorationType.MODE
    assert resolve_exploration_type("random") is ExplorationType.RANDOM
    assert resolve_exploration_type(ExplorationType.MEAN) is ExplorationType.MEAN
    assert resolve_exploration_type(None) is None
    with pytest.raises(ValueError, match="exploration_type"):
        resolve_exploration_type("greedy")


def test_none_policy_is_random_and_non_callables_are_refused() -> None:
    adapter = PolicyAdapter(None, action_spec=ArraySpec((), "int64", 0.0, 1.0, 2))
    assert adapter.is_random
    with pytest.raises(ValueError, match="action_spec"):
        PolicyAdapter(None)
    with pytest.raises(TypeError, match="callable"):
        PolicyAdapter(42)  # type: ignore[arg-type]


def test_doctests() -> None:
    result = doctest.testmod(asyncrl._rollout.policies)
    assert result.failed == 0 and result.attempted > 0
