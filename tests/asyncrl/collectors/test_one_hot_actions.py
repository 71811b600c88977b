"""TorchRL's default one-hot actions (GymEnv of a discrete gym env) go through as one-hot."""

from __future__ import annotations

import anyio
import numpy as np
import pytest
import torch
from tensordict.nn import TensorDictModule

from asyncrl import Collector, MultiSyncCollector, RandomPolicy
from asyncrl._rollout.env_specs import ArraySpec
from asyncrl._rollout.envs import make_env_pool

torchrl = pytest.importorskip("torchrl", reason="the torchrl extra is not installed")
from torchrl.collectors import Collector as TorchRLCollector  # noqa: E402
from torchrl.envs import GymEnv  # noqa: E402
from torchrl.modules import OneHotCategorical, ProbabilisticActor  # noqa: E402

pytestmark = pytest.mark.anyio
LIMIT = 120


def cartpole() -> GymEnv:
    return GymEnv("CartPole-v1")  # actions: OneHot(2), TorchRL's default


def one_hot_actor() -> ProbabilisticActor:
    net = TensorDictModule(torch.nn.Linear(4, 2), in_keys=["observation"], out_keys=["logits"])
    return ProbabilisticActor(net, in_keys=["logits"], out_keys=["action"],
                              distribution_class=OneHotCategorical, return_log_prob=True)


def assert_one_hot(action: torch.Tensor) -> None:
    assert bool(((action == 0) | (action == 1)).all())
    assert bool((action.sum(-1) == 1).all())


def test_the_pool_describes_a_one_hot_action() -> None:
    with make_env_pool(cartpole) as pool:
        assert pool.specs.action == ArraySpec((2,), "int64", 0.0, 1.0, None, one_hot=True)


def test_one_hot_specs_travel_and_are_checked() -> None:
    spec = ArraySpec((3,), "int64", 0.0, 1.0, one_hot=True)
    assert spec.to_dict()["one_hot"] is True
    assert ArraySpec.from_dict(spec.to_dict()) == spec
    assert "one_hot" not in ArraySpec((), "int64", 0.0, 1.0, 2).to_dict()
    with pytest.raises(ValueError) as info:
        ArraySpec.from_dict({**spec.to_dict(), "shape": []})
    assert str(info.value) == ("spec.one_hot: expected a bool (True only with a last dim of "
                               "categories), got True for shape []")
    with pytest.raises(ValueError, match=r"spec\.one_hot: expected a bool"):
        ArraySpec.from_dict({**spec.to_dict(), "one_hot": 1})


def test_random_policy_samples_one_hot_actions_reproducibly() -> None:
    spec = ArraySpec((3,), "int64", 0.0, 1.0, one_hot=True)
    first, second = np.empty((300, 4, 3), np.int64), np.empty((300, 4, 3), np.int64)
    a, b = RandomPolicy(spec, seed=1), RandomPolicy(spec, seed=1)
    for i in range(300):
        a.sample_into(first[i])
        b.sample_into(second[i])
    assert_one_hot(torch.from_numpy(first))
    assert (first == second).all()
    counts = first.reshape(-1, 3).sum(0)
    assert counts.min() > 300  # every category drawn (1200 draws, 400 expected each)


async def test_layout_matches_torchrls_collector() -> None:
    torchrl_collector = TorchRLCollector(cartpole, None, frames_per_batch=16, total_frames=16)
    try:
        reference = next(iter(torchrl_collector))
    finally:
        torchrl_collector.shutdown()
    with anyio.fail_after(LIMIT):
        async with Collector(cartpole, frames_per_batch=16, total_frames=16) as c:
            [ours] = [b async for b in c]
    assert ours["action"].shape == reference["action"].shape == (16, 2)
    assert ours["action"].dtype == reference["action"].dtype == torch.int64
    assert_one_hot(ours["action"])
    assert_one_hot(reference["action"])


async def test_a_one_hot_actor_in_workers() -> None:
    with anyio.fail_after(LIMIT):
        async with MultiSyncCollector(cartpole, one_hot_actor(), num_workers=2,
                                      frames_per_batch=32, total_frames=32) as c:
            [batch] = [b async for b in c]
    assert batch["action"].shape == (2, 16, 2) and batch["action"].dtype == torch.int64
    assert_one_hot(batch["action"])
    # the behaviour policy's log-probs belong to the one-hot actions stored beside them
    dist = OneHotCategorical(logits=batch["logits"])
    assert torch.allclose(dist.log_prob(batch["action"]), batch["action_log_prob"], atol=1e-5)
