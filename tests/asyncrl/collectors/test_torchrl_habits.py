"""What a TorchRL user types on a collector works, or fails saying what to write in asyncrl."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import pytest
import torch
from tensordict.nn import TensorDictModule
from torch import nn

from asyncrl import BlockingCollector, Collector, CollectorError, MultiSyncCollector
from asyncrl.collectors._updates import WeightUpdate, weight_updates

torchrl = pytest.importorskip("torchrl", reason="the torchrl extra is not installed")
from torchrl.modules import ProbabilisticActor  # noqa: E402

LIMIT = 120


def make_actor() -> ProbabilisticActor:
    module = TensorDictModule(nn.Linear(4, 2), in_keys=["observation"], out_keys=["logits"])
    return ProbabilisticActor(module, in_keys=["logits"], out_keys=["action"],
                              distribution_class=torch.distributions.Categorical)


def in_process(**kwargs: Any) -> Collector:
    return Collector("CartPole-v1", **{"frames_per_batch": 16, "total_frames": 64, **kwargs})


def multi(**kwargs: Any) -> MultiSyncCollector:
    options = {"num_workers": 2, "frames_per_batch": 32, "total_frames": 64, **kwargs}
    return MultiSyncCollector("CartPole-v1", **options)


# -- plain iteration ---------------------------------------------------------------------------
PLAIN_HABITS: dict[str, Callable[[Any], Any]] = {
    "for": lambda c: [b for b in c],
    "next(iter())": lambda c: next(iter(c)),
    "next()": lambda c: next(c),
    "iterator()": lambda c: c.iterator(),
}


@pytest.mark.parametrize("habit", sorted(PLAIN_HABITS))
@pytest.mark.parametrize("make", [in_process, lambda: multi(start_method="spawn")],
                         ids=["Collector", "MultiSyncCollector"])
def test_plain_iteration_names_async_for_and_blocking_collector(habit: str,
                                                                make: Callable[[], Any]) -> None:
    collector = make()
    with pytest.raises(TypeError) as info:
        PLAIN_HABITS[habit](collector)
    message = str(info.value)
    assert f"async with {type(collector).__name__}(...)" in message
    assert "'async for batch in collector'" in message
    assert "BlockingCollector(" in message


@pytest.mark.anyio
@pytest.mark.parametrize("make", [in_process, lambda: multi(start_method="spawn")],
                         ids=["Collector", "MultiSyncCollector"])
async def test_async_iteration_outside_async_with_names_it(make: Callable[[], Any]) -> None:
    collector = make()
    with pytest.raises(CollectorError, match=r"not open: .*'async with"):
        async for _ in collector:
            pass
    assert collector.frames_collected == 0


# -- shutdown ----------------------------------------------------------------------------------
@pytest.mark.anyio
async def test_shutdown_is_torchrl_name_for_aclose() -> None:
    with anyio.fail_after(LIMIT):
        async with multi() as collector:
            await collector.__anext__()
            pids = collector.worker_pids
            assert pids
            await collector.shutdown()
            await collector.shutdown()  # idempotent, as aclose
            assert [b async for b in collector] == []  # closed: iteration ends
            await collector.async_shutdown()


@pytest.mark.anyio
async def test_shutdown_refuses_what_it_cannot_honour() -> None:
    with anyio.fail_after(LIMIT):
        async with in_process() as collector:
            with pytest.raises(ValueError, match="always bounded"):
                await collector.shutdown(timeout=5.0)
            with pytest.raises(ValueError, match="close_env=False"):
                await collector.shutdown(close_env=False)
            assert await collector.__anext__() is not None  # still open after refusals


# -- update_policy_weights spellings ---------------------------------------------------------
def test_weight_update_spellings() -> None:
    assert weight_updates("w") == [WeightUpdate("policy", "w", None)]
    assert weight_updates(policy_or_weights="w", worker_ids=[1]) == [
        WeightUpdate("policy", "w", [1])]
    assert weight_updates(weights="w", model_id="critic") == [WeightUpdate("critic", "w", None)]
    assert weight_updates(policy="p") == [WeightUpdate("policy", "p", None)]
    assert weight_updates() == [WeightUpdate("policy", None, None)]
    assert weight_updates({"weight": "w"}) == [WeightUpdate("policy", {"weight": "w"}, None)]
    assert weight_updates({0: "a", 2: "b"}) == [WeightUpdate("policy", "a", [0]),
                                               WeightUpdate("policy", "b", [2])]
    with pytest.raises(ValueError, match="policy_or_weights and weights"):
        weight_updates("a", weights="b")
    with pytest.raises(ValueError, match="weights_dict"):
        weight_updates(weights_dict={"policy": "a"}, model_id="policy")
    with pytest.raises(ValueError, match="worker_ids"):
        weight_updates({0: "a"}, worker_ids=[1])


@pytest.mark.anyio
async def test_update_policy_weights_takes_torchrl_keywords() -> None:
    actor = make_actor()
    with anyio.fail_after(LIMIT):
        async with multi(policy=actor, total_frames=-1) as collector:
            await collector.update_policy_weights(policy_or_weights=actor)
            await collector.update_policy_weights(weights=actor)  # asyncrl's keyword still works
            await collector.update_policy_weights_()  # TorchRL's name, awaited
            await collector.update_policy_weights(weights_dict={"policy": actor})
            assert collector.policy_version == 4
            batch = await collector.__anext__()
    assert batch["collector", "policy_version"].unique().tolist() == [4]


@pytest.mark.anyio
async def test_in_process_update_policy_weights_takes_torchrl_keywords() -> None:
    actor = make_actor()
    with anyio.fail_after(LIMIT):
        async with in_process(policy=actor) as collector:
            await collector.update_policy_weights(policy_or_weights=actor)
            await collector.update_policy_weights_(policy=actor)
            assert collector.policy_version == 2
            # any other model id is a served module's (none open here), as with
            # AsyncBatchedCollector; the policy is not touched by the refused call
            with pytest.raises(ValueError, match=r"^model_id='critic': this collector serves "
                               r"'policy', and no served module is open in this process "
                               r"under 'critic' \(open: \[\]\)"):
                await collector.update_policy_weights(weights_dict={"critic": actor,
                                                                    "policy": actor})
            assert collector.policy_version == 2


# -- the blocking facade ---------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_blocking_update_policy_weights_and_shutdown(backend: str) -> None:
    actor = make_actor()
    blocking = BlockingCollector(multi(policy=actor, total_frames=-1), backend=backend)
    with blocking as collector:
        collector.update_policy_weights_()  # TorchRL's blocking call
        collector.update_policy_weights_(policy_or_weights=actor)
        assert collector.policy_version == 2
        batch = next(iter(collector))
        assert batch["collector", "policy_version"].unique().tolist() == [2]
        collector.shutdown()
        collector.shutdown()  # idempotent
        assert collector.collector._closed


# -- accepted TorchRL arguments, in a run ------------------------------------------------------
@pytest.mark.anyio
async def test_return_same_td_yields_the_rollout_buffers() -> None:
    with anyio.fail_after(LIMIT):
        async with in_process(return_same_td=True, track_policy_version=True,
                              track_traj_ids=True, use_buffers=True) as same:
            first, second = [b async for b in same][:2]
        async with in_process() as copies:
            third, fourth = [b async for b in copies][:2]
    # TorchRL's meaning: one tensordict's storage, rewritten by each batch
    assert first["observation"].data_ptr() == second["observation"].data_ptr()
    assert third["observation"].data_ptr() != fourth["observation"].data_ptr()
    assert ("collector", "policy_version") in first.keys(True)
    assert ("collector", "traj_ids") in first.keys(True)
