"""The helpers of tests and benchmarks, on their own (no Hub): asyncrl.testing's doubles,
the simulated workers' pieces (asyncrl._worker.simulated) and RolloutProbe (asyncrl._rollout.probe).
"""

from __future__ import annotations

import doctest
import types

import pytest
import torch

import asyncrl.testing
import transports
from asyncrl._rollout import probe
from asyncrl._rollout.env_specs import EnvSpecs
from asyncrl._rollout.probe import RolloutProbe
from asyncrl._worker import simulated
from asyncrl._worker.simulated import make_share, make_specs
from asyncrl.testing import CountingEnv


def test_asyncrl_testing_exports_the_users_test_doubles_only() -> None:
    names = set(asyncrl.testing.__all__)
    assert all(hasattr(asyncrl.testing, name) for name in names)
    assert {"CountingEnv", "IdentityEnv", "ValuePolicy", "version_problems"} <= names
    assert not names & {"sim_worker", "make_share", "make_specs", "SimRecord", "RolloutProbe"}


@pytest.mark.parametrize("module", [asyncrl.testing, simulated, probe], ids=lambda m: m.__name__)
def test_doctests(module: types.ModuleType) -> None:
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0


def test_make_specs_is_a_cartpole_like_spec_in_wire_form() -> None:
    specs = EnvSpecs.from_dict(make_specs(3))
    assert specs.observation["observation"].shape == (3,)
    assert (specs.action.n, specs.num_envs) == (2, 1)


def test_make_share_has_torchrl_layout_and_stamps() -> None:
    share = make_share(5, 2, worker_id=3, seq=9, policy_version=4)
    assert share.batch_size == torch.Size([1, 5])
    assert share["observation"].shape == (1, 5, 2)
    assert torch.equal(share["next", "observation"], share["observation"] + 1)
    assert share["collector", "worker_id"].tolist() == [[3] * 5]
    assert share["collector", "traj_ids"].tolist() == [[9] * 5]
    assert share["collector", "policy_version"].tolist() == [[4] * 5]


def test_rollout_probe_collects_a_worker_batch_and_encodes_its_message() -> None:
    with RolloutProbe(CountingEnv, None, frames_per_batch=8, envs_per_worker=2) as probe:
        assert probe.steps == 4
        batch = probe.collect()
        assert batch.batch_size == torch.Size([2, 4])
        # CountingEnv: step in episode 1..4 in ("next", "observation")[..., 0].
        assert batch["next", "observation"][0, :, 0].tolist() == [1.0, 2.0, 3.0, 4.0]
        body = transports.decode(probe.credit())
        assert body["request"] == 1
        assert body["frames"].batch_size == torch.Size([2, 4])
        assert body["frames"]["next", "observation"][0, :, 0].tolist() == [5.0, 1.0, 2.0, 3.0]


def test_rollout_probe_times_env_and_policy_apart_and_closes_once() -> None:
    probe = RolloutProbe("CartPole-v1", None, frames_per_batch=4)
    assert probe.time_env() > 0.0
    assert probe.time_policy() >= 0.0
    probe.close()
    probe.close()
