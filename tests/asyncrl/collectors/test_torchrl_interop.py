"""Batches feed TorchRL's GAE, ClipPPOLoss and ReplayBuffer unchanged (torchrl extra)."""

from __future__ import annotations

import anyio
import pytest
import torch
from tensordict.nn import TensorDictModule
from torch import nn

from asyncrl import MultiAsyncCollector, MultiSyncCollector

torchrl = pytest.importorskip("torchrl", reason="the torchrl extra is not installed")
from torchrl.data import LazyTensorStorage, ReplayBuffer  # noqa: E402
from torchrl.modules import ProbabilisticActor, ValueOperator  # noqa: E402
from torchrl.objectives import ClipPPOLoss  # noqa: E402
from torchrl.objectives.value import GAE  # noqa: E402

pytestmark = pytest.mark.anyio
LIMIT = 120


def make_actor() -> ProbabilisticActor:
    net = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 2))
    module = TensorDictModule(net, in_keys=["observation"], out_keys=["logits"])
    return ProbabilisticActor(module, in_keys=["logits"], out_keys=["action"],
                              distribution_class=torch.distributions.Categorical,
                              return_log_prob=True)


async def test_probabilistic_actor_batch_goes_through_gae_and_clip_ppo() -> None:
    torch.manual_seed(0)
    actor = make_actor()
    critic = ValueOperator(nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1)),
                           in_keys=["observation"])
    with anyio.fail_after(LIMIT):
        async with MultiSyncCollector("CartPole-v1", actor, num_workers=2,
                                      frames_per_batch=64, total_frames=128) as collector:
            batches = [b async for b in collector]
            await collector.update_policy_weights()
    batch = batches[0]
    log_prob_keys = [k for k in batch.keys() if "log_prob" in str(k)]
    assert log_prob_keys, f"no log-prob written by the actor; keys: {list(batch.keys())}"
    assert "logits" in batch.keys() and batch["logits"].shape == (2, 32, 2)
    # the behaviour policy's log-probs match the logits and actions stored beside them
    dist = torch.distributions.Categorical(logits=batch["logits"])
    assert torch.allclose(dist.log_prob(batch["action"]), batch[log_prob_keys[0]], atol=1e-5)

    gae = GAE(gamma=0.99, lmbda=0.95, value_network=critic)
    with torch.no_grad():
        gae(batch)
    assert batch["advantage"].shape == (2, 32, 1)
    loss = ClipPPOLoss(actor, critic)
    loss.set_keys(sample_log_prob=log_prob_keys[0])
    losses = loss(batch.reshape(-1))
    total = sum(v for k, v in losses.items() if k.startswith("loss_"))
    total.backward()
    assert all(p.grad is not None for p in actor.parameters())


async def test_replay_buffer_is_a_sink_for_start() -> None:
    buffer = ReplayBuffer(storage=LazyTensorStorage(10_000))
    with anyio.fail_after(LIMIT):
        async with MultiAsyncCollector("CartPole-v1", num_workers=2, frames_per_batch=50,
                                       total_frames=500, replay_buffer=buffer,
                                       postproc=lambda td: td.reshape(-1)) as collector:
            collector.start()
            while len(buffer) < 500:
                await anyio.sleep(0.02)
    assert len(buffer) == 500
    sample = buffer.sample(32)
    assert sample["next", "reward"].shape == (32, 1)
