"""TorchRL's weight-sync scheme objects become asyncrl's, or are refused naming the replacement."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
import torch
from tensordict.nn import TensorDictModule
from torch import nn

from asyncrl import MultiSyncCollector
from asyncrl.weights import (
    NoWeightSyncScheme,
    SharedMemWeightSyncScheme,
    WeightSyncError,
    ZmqWeightSyncScheme,
)
from asyncrl.weights import RayWeightSyncScheme as AsyncRLRayScheme
from asyncrl.weights._torchrl import as_weight_sync_schemes

torchrl = pytest.importorskip("torchrl", reason="the torchrl extra is not installed")
from torchrl.collectors import MultiProcessedWeightUpdater  # noqa: E402
from torchrl.modules import ProbabilisticActor  # noqa: E402
from torchrl.weight_update import MultiProcessWeightSyncScheme as TorchRLMultiProcess  # noqa: E402
from torchrl.weight_update import NoWeightSyncScheme as TorchRLNo  # noqa: E402
from torchrl.weight_update import RayWeightSyncScheme, RPCWeightSyncScheme  # noqa: E402
from torchrl.weight_update import SharedMemWeightSyncScheme as TorchRLSharedMem  # noqa: E402

LIMIT = 120
# TorchRL warns when its own scheme objects are made with strategy="state_dict".
pytestmark = pytest.mark.filterwarnings("ignore:state_dict strategy is experimental")


@pytest.mark.parametrize(("torchrl_scheme", "expected"), [
    (TorchRLMultiProcess(), ZmqWeightSyncScheme),
    (TorchRLSharedMem(), SharedMemWeightSyncScheme),
    (TorchRLNo(), NoWeightSyncScheme),
    (RayWeightSyncScheme(), AsyncRLRayScheme),
])
@pytest.mark.parametrize("strategy", ["tensordict", "state_dict"])
def test_torchrl_schemes_translate_with_their_strategy(torchrl_scheme: Any, expected: type,
                                                       strategy: str) -> None:
    torchrl_scheme = type(torchrl_scheme)(strategy=strategy)
    scheme = as_weight_sync_schemes({"policy": torchrl_scheme})["policy"]
    assert type(scheme) is expected
    assert scheme.strategy.extract_as == strategy


@pytest.mark.parametrize(("torchrl_scheme", "replacement"), [
    (TorchRLMultiProcess(sync=False), "weight_sender().send_async"),
    (TorchRLSharedMem(sync=False), "weight_sender().send_async"),
    (TorchRLSharedMem(per_worker_weights=True), "worker_ids=[i]"),
    (RPCWeightSyncScheme(), "ZmqWeightSyncScheme() already reaches workers on other hosts"),
    (RayWeightSyncScheme(backend="nccl"), "DistributedWeightSyncScheme(backend='nccl')"),
])
def test_torchrl_schemes_without_a_counterpart_are_refused(torchrl_scheme: Any,
                                                           replacement: str) -> None:
    with pytest.raises(TypeError, match=r"weight_sync_schemes\['policy'\]") as info:
        as_weight_sync_schemes({"policy": torchrl_scheme})
    assert replacement in str(info.value)


def test_a_subclass_of_a_torchrl_scheme_is_refused() -> None:
    class Mine(TorchRLMultiProcess):
        pass

    with pytest.raises(TypeError, match=r"subclass asyncrl\.weights\.ZmqWeightSyncScheme"):
        as_weight_sync_schemes({"policy": Mine()})


def test_what_is_not_a_scheme_is_refused() -> None:
    with pytest.raises(TypeError, match="must be a weight-sync scheme"):
        as_weight_sync_schemes({"policy": "zmq"})
    with pytest.raises(TypeError, match="must be a dict"):
        as_weight_sync_schemes([ZmqWeightSyncScheme()])  # type: ignore[arg-type]


def test_weight_updater_is_refused_naming_schemes() -> None:
    updater = MultiProcessedWeightUpdater(get_server_weights=None, policy_weights={})
    with pytest.raises(TypeError, match=r"weight_sync_schemes=\{'policy': "
                                        r"ZmqWeightSyncScheme\(\)\}"):
        MultiSyncCollector("CartPole-v1", num_workers=2, frames_per_batch=64,
                           weight_updater=updater)


def make_policy() -> ProbabilisticActor:
    module = TensorDictModule(nn.Linear(4, 2), in_keys=["observation"], out_keys=["logits"])
    return ProbabilisticActor(module, in_keys=["logits"], out_keys=["action"],
                              distribution_class=torch.distributions.Categorical)


@pytest.mark.anyio
@pytest.mark.parametrize("torchrl_scheme", [TorchRLMultiProcess, TorchRLSharedMem])
async def test_a_translated_scheme_carries_weights_to_the_workers(torchrl_scheme: type) -> None:
    policy = make_policy()
    with anyio.fail_after(LIMIT):
        async with MultiSyncCollector(
                "CartPole-v1", policy, num_workers=2, frames_per_batch=32, total_frames=-1,
                weight_sync_schemes={"policy": torchrl_scheme(strategy="state_dict")},
        ) as collector:
            assert isinstance(collector.weight_sync_schemes["policy"],
                              (ZmqWeightSyncScheme, SharedMemWeightSyncScheme))
            with torch.no_grad():
                for parameter in policy.parameters():
                    parameter.fill_(0.25)
            await collector.update_policy_weights(policy_or_weights=policy)  # TorchRL's keyword
            state = await collector.state_dict()
            batch = await collector.__anext__()
    for worker in ("worker0", "worker1"):
        weights = dict(state[worker]["policy_state_dict"])
        assert weights, state
        assert all(bool((torch.as_tensor(w) == 0.25).all()) for w in weights.values())
    # sync mode: the batch after the update was collected with it, by every worker
    assert batch["collector", "policy_version"].unique().tolist() == [1]


@pytest.mark.anyio
async def test_a_translated_no_sync_scheme_refuses_updates() -> None:
    with anyio.fail_after(LIMIT):
        async with MultiSyncCollector("CartPole-v1", make_policy(), num_workers=1,
                                      frames_per_batch=16, total_frames=16,
                                      weight_sync_schemes={"policy": TorchRLNo()}) as collector:
            with pytest.raises(WeightSyncError, match="NoWeightSyncScheme"):
                await collector.update_policy_weights()
