"""What a coordinator's control message does in a worker (``asyncrl._worker.control``)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from asyncrl._protocol import Control
from asyncrl._worker.control import TOUCHES_WEIGHTS, run_control


class FakeRollout:
    """Records what the worker's rollout was asked to do."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.stepped_policy = torch.nn.Linear(2, 1)

    def set_seed(self, seed: int, static_seed: bool = False) -> int:
        self.calls.append(("set_seed", (seed, static_seed)))
        return seed + 4

    def reset(self, reset_idx: Any = None) -> None:
        self.calls.append(("reset", reset_idx))


class FakeEnvs:
    num_envs = 3


def _run(op: str, policy: Any = None, **args: Any) -> tuple[Any, FakeRollout]:
    rollout = FakeRollout()
    result = run_control(Control(op, args), rollout=rollout,  # type: ignore[arg-type]
                         policy=policy, env_pool=FakeEnvs())
    return result, rollout


def test_seed_seeds_the_rollout_and_answers_the_next_free_seed() -> None:
    result, rollout = _run("seed", seed=3, static_seed=True)
    assert result == 7
    assert rollout.calls == [("set_seed", (3, True))]


def test_reset_passes_the_envs_to_reset() -> None:
    result, rollout = _run("reset", reset_idx=[0, 2])
    assert result is None
    assert rollout.calls == [("reset", [0, 2])]


def test_state_dict_and_load_state_dict_round_trip_a_module_policy() -> None:
    policy = torch.nn.Linear(2, 1)
    state, _ = _run("state_dict", policy)
    other = torch.nn.Linear(2, 1)
    assert _run("load_state_dict", other, **state)[0] is None
    assert torch.equal(other.weight, policy.weight)


def test_a_policy_that_is_not_a_module_has_an_empty_state() -> None:
    assert _run("state_dict", policy=lambda td: td)[0] == {}


def test_getattr_reads_the_env_and_the_policy_the_rollout_steps_with() -> None:
    assert _run("getattr_env", attr="num_envs")[0] == 3
    # policy=None: the rollout's own (a RandomPolicy in the real worker)
    assert _run("getattr_policy", attr="in_features")[0] == 2


def test_an_unknown_operation_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown control operation 'teleport'.*seed"):
        _run("teleport")


def test_an_operation_before_the_rollout_exists_says_so() -> None:
    with pytest.raises(RuntimeError, match="before the worker's rollout was built"):
        run_control(Control("reset", {}), rollout=None, policy=None, env_pool=None)


def test_the_operations_that_touch_the_weights_wait_for_a_whole_model() -> None:
    assert TOUCHES_WEIGHTS == {"state_dict", "load_state_dict", "getattr_policy"}
