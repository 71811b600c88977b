"""A trainer that optimises its policy but never sends it is told so, once."""

from __future__ import annotations

import warnings
from typing import Any

import anyio
import pytest
import torch
from torch import nn

from asyncrl import MultiAsyncCollector, MultiSyncCollector
from asyncrl.collectors._staleness import PATIENCE, STALE_POLICY_MESSAGE

LIMIT = 120


class Greedy(nn.Module):
    """CartPole's action from a linear layer: parameters an optimiser can change."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 2)

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return self.layer(observation).argmax(-1)


async def train(collector_type: type, *, update: bool, every: int = 1
                ) -> list[warnings.WarningMessage]:
    policy = Greedy()
    optimiser = torch.optim.SGD(policy.parameters(), lr=0.1)
    with warnings.catch_warnings(record=True) as caught, anyio.fail_after(LIMIT):
        warnings.simplefilter("always")
        async with collector_type("CartPole-v1", policy, num_workers=1, frames_per_batch=16,
                                  total_frames=16 * (PATIENCE + 4)) as collector:
            async for i, batch in aenumerate(collector):
                loss = policy.layer(batch["observation"]).square().mean()
                optimiser.zero_grad()
                loss.backward()
                optimiser.step()
                if update and (i + 1) % every == 0:
                    await collector.update_policy_weights()
    return [w for w in caught if str(w.message).startswith(STALE_POLICY_MESSAGE)]


async def aenumerate(batches: Any) -> Any:
    i = 0
    async for batch in batches:
        yield i, batch
        i += 1


@pytest.mark.anyio
@pytest.mark.parametrize("collector_type", [MultiSyncCollector, MultiAsyncCollector])
async def test_optimising_without_updates_warns_exactly_once(collector_type: type) -> None:
    stale = await train(collector_type, update=False)
    assert len(stale) == 1
    assert stale[0].category is UserWarning
    text = str(stale[0].message)
    assert "update_policy_weights_()" in text and "since the start" in text
    assert f"after {PATIENCE} more batches the {collector_type.__name__}'s workers still " \
        "step policy version 0" in text
    assert "warnings.filterwarnings('ignore'" in text


@pytest.mark.anyio
@pytest.mark.parametrize("collector_type", [MultiSyncCollector, MultiAsyncCollector])
async def test_a_trainer_that_updates_gets_no_warning(collector_type: type) -> None:
    assert await train(collector_type, update=True) == []


@pytest.mark.anyio
async def test_a_trainer_that_updates_every_few_batches_gets_no_warning() -> None:
    # examples/service.py pushes every 4 batches: its own pace, not a forgotten call.
    assert await train(MultiSyncCollector, update=True, every=4) == []


def test_the_watch_retires_once_weights_were_sent() -> None:
    from asyncrl.collectors._staleness import StalePolicyWatch

    policy = Greedy()
    watch = StalePolicyWatch(policy, "MultiSyncCollector")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        watch.check(0)
        with torch.no_grad():
            policy.layer.bias.add_(1.0)
        watch.check(1)  # weights were sent after the change: this trainer updates
        for _ in range(3 * PATIENCE):
            with torch.no_grad():
                policy.layer.bias.add_(1.0)
            watch.check(1)  # at its own pace: no warning
    assert caught == []


def test_an_untrained_policy_is_not_stale() -> None:
    from asyncrl.collectors._staleness import StalePolicyWatch

    watch = StalePolicyWatch(Greedy(), "MultiSyncCollector")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3 * PATIENCE):
            watch.check(0)  # random exploration before training starts
    assert caught == []
