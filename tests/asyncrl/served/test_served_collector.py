"""A served module called by the envs of every local worker, updated by model id."""

from __future__ import annotations

import functools

import anyio
import pytest
import torch

from asyncrl import MultiSyncCollector
from asyncrl.served import ServedModule, ServedModuleScheme

from .served_envs import Scale, StepEnv, checked_versions, rewarded_env

pytestmark = pytest.mark.anyio

NAME = "env.transform[0]"
VERSIONS = ("next", "served_versions", NAME)


def served_scale(scale: float = 1.0, **kwargs: object) -> ServedModule:
    return ServedModule(Scale(scale), name=NAME, example={"next_observation": torch.zeros(3)},
                        **kwargs)  # type: ignore[arg-type]


async def test_every_frame_records_the_version_that_computed_its_reward() -> None:
    with anyio.fail_after(120):
        async with served_scale(clients=8) as served:
            async with MultiSyncCollector(
                    functools.partial(rewarded_env, served.handle), num_workers=2,
                    envs_per_worker=2, frames_per_batch=64, total_frames=64 * 4,
                    info_keys=[served.handle.info_key],
                    weight_sync_schemes={NAME: ServedModuleScheme(served)}) as collector:
                seen = []
                async for batch in collector:
                    version = checked_versions(batch)
                    seen.append(int(version.max()))
                    new = {"scale": torch.tensor([float(collector.weight_sender(NAME).version
                                                        + 2)])}
                    await collector.update_policy_weights(new, model_id=NAME)
                assert seen == [0, 1, 2, 3]  # sync mode: each batch after the update
                assert served.version == 4
                assert served.statistics().observations >= 64 * 4


async def test_torchrl_spelling_and_weights_dict_reach_the_served_module() -> None:
    with anyio.fail_after(120):
        async with served_scale() as served:
            async with MultiSyncCollector(
                    functools.partial(rewarded_env, served.handle), num_workers=1,
                    frames_per_batch=16, total_frames=32,
                    weight_sync_schemes={NAME: ServedModuleScheme()}) as collector:
                await collector.update_policy_weights(weights_dict={NAME: Scale(5.0)})
                assert served.version == 1
                assert collector.weight_sender(NAME).version == 1
                async for batch in collector:
                    t = batch["next", "observation"][..., 0]
                    assert torch.equal(batch["next", "reward"].squeeze(-1), 5 * t)
                    break
                with pytest.raises(ValueError, match="served once for every worker"):
                    await collector.update_policy_weights(Scale(1.0), model_id=NAME,
                                                          worker_ids=[0])


async def test_torch_free_env_workers_of_central_inference_call_it_too() -> None:
    # AsyncBatchedCollector's env workers import no torch: the client needs numpy only.
    from asyncrl import AsyncBatchedCollector

    with anyio.fail_after(120):
        async with served_scale(2.0) as served:
            async with AsyncBatchedCollector(functools.partial(rewarded_env, served.handle),
                                             num_envs=2, frames_per_batch=32,
                                             total_frames=64) as collector:
                async for batch in collector:
                    t = batch["next", "observation"][..., 0]
                    assert torch.equal(batch["next", "reward"].squeeze(-1), 2 * t)
            assert served.statistics().observations >= 64


async def test_async_batches_mixing_versions_record_each_frames_own() -> None:
    from asyncrl import MultiAsyncCollector

    with anyio.fail_after(120):
        async with served_scale(clients=4) as served:
            async with MultiAsyncCollector(
                    functools.partial(rewarded_env, served.handle), num_workers=2,
                    envs_per_worker=2, frames_per_batch=32, total_frames=32 * 8,
                    info_keys=[served.handle.info_key],
                    weight_sync_schemes={NAME: ServedModuleScheme(served)}) as collector:
                seen: set[int] = set()
                async for batch in collector:
                    version = checked_versions(batch)
                    seen.update(version.unique().tolist())
                    await collector.update_policy_weights(
                        {"scale": torch.tensor([float(served.version + 2)])}, model_id=NAME)
                assert len(seen) > 2 and max(seen) <= served.version


async def test_async_batched_collector_updates_a_served_module_by_model_id() -> None:
    from asyncrl import AsyncBatchedCollector

    with anyio.fail_after(120):
        async with served_scale(2.0) as served:
            async with AsyncBatchedCollector(functools.partial(rewarded_env, served.handle),
                                             num_envs=2, frames_per_batch=32,
                                             total_frames=-1) as collector:
                await collector.update_policy_weights({"scale": torch.tensor([5.0])},
                                                      model_id=NAME)
                assert served.version == 1  # returned once the next call uses it
                await collector.update_policy_weights(weights_dict={NAME: Scale(7.0)})
                assert served.version == 2
                assert collector.policy_version == 0  # the policy was not touched
                async for batch in collector:
                    t = batch["next", "observation"][..., 0]
                    if torch.equal(batch["next", "reward"].squeeze(-1), 7 * t):
                        break  # every frame computed by version 2 (earlier ones drain first)
                with pytest.raises(ValueError, match=r"no served module is open in this "
                                                     r"process under 'env.transform\[9\]' "
                                                     r"\(open: \['env.transform\[0\]'\]\)"):
                    await collector.update_policy_weights(Scale(1.0), model_id="env.transform[9]")
                with pytest.raises(ValueError, match="served once for every worker"):
                    await collector.update_policy_weights(Scale(1.0), model_id=NAME,
                                                          worker_ids=[0])
                with pytest.raises(TypeError, match="model_id= or weights_dict="):
                    await collector.update_policy_weights(model_id=NAME,
                                                          weights_dict={NAME: Scale(1.0)})
                assert served.version == 2


async def test_in_process_collector_updates_a_served_module_by_model_id() -> None:
    from asyncrl import Collector

    with anyio.fail_after(120):
        async with served_scale() as served:
            async with Collector(functools.partial(rewarded_env, served.handle), None,
                                 frames_per_batch=16, total_frames=16 * 4,
                                 info_keys=[served.handle.info_key]) as collector:
                seen = []
                async for batch in collector:
                    version = checked_versions(batch)
                    seen.append(version.unique().tolist())
                    if len(seen) == 1:
                        await collector.update_policy_weights(Scale(2.0), model_id=NAME)
                    elif len(seen) == 2:
                        await collector.update_policy_weights(weights_dict={NAME: Scale(3.0)})
                    else:  # TorchRL's spelling, a state dict
                        await collector.update_policy_weights(
                            weights={"scale": torch.tensor([4.0])}, model_id=NAME)
                # between batches, an update is in use by the next batch's first frame
                assert seen == [[0], [1], [2], [3]]
                assert served.version == 4
                assert collector.policy_version == 0  # the policy was not touched


async def test_in_process_collector_refuses_what_the_batched_collector_refuses() -> None:
    from asyncrl import Collector

    with anyio.fail_after(120):
        async with served_scale() as served:
            async with Collector(functools.partial(rewarded_env, served.handle), None,
                                 frames_per_batch=16, total_frames=-1) as collector:
                with pytest.raises(ValueError, match=r"^model_id='env.transform\[9\]': this "
                                   r"collector serves 'policy', and no served module is open "
                                   r"in this process under 'env.transform\[9\]' \(open: "
                                   r"\['env.transform\[0\]'\]\); open ServedModule\(\.\.\., "
                                   r"name='env.transform\[9\]'\) before updating it by model "
                                   r"id$"):
                    await collector.update_policy_weights(Scale(1.0), model_id="env.transform[9]")
                with pytest.raises(ValueError, match=r"^model 'env.transform\[0\]' is served "
                                   r"once for every worker: leave worker_ids out \(there is "
                                   r"one copy to update\)$"):
                    await collector.update_policy_weights(Scale(1.0), model_id=NAME,
                                                          worker_ids=[0])
                with pytest.raises(TypeError, match=r"^update_policy_weights: give model_id= "
                                   r"or weights_dict=, not both$"):
                    await collector.update_policy_weights(model_id=NAME,
                                                          weights_dict={NAME: Scale(1.0)})
                with pytest.raises(TypeError, match=r"names its models itself; do not also "
                                   r"pass policy_or_weights$"):
                    await collector.update_policy_weights(Scale(1.0),
                                                          weights_dict={NAME: Scale(1.0)})
                # a weights_dict naming a closed module updates none of its models
                with pytest.raises(ValueError, match=r"no served module is open"):
                    await collector.update_policy_weights(
                        weights_dict={NAME: Scale(1.0), "env.transform[9]": Scale(1.0)})
                assert served.version == 0  # no refused call changed the module
                await collector.update_policy_weights(model_id=NAME)  # the module's own
                assert served.version == 1


def test_in_process_collector_refuses_a_scheme_for_a_served_module_naming_model_id() -> None:
    from asyncrl import Collector

    with pytest.raises(TypeError, match=r"a served module \(a RayModuleTransformScheme's\) "
                       r"needs no scheme here: update_policy_weights\(w, model_id=name\) "
                       r"updates the ServedModule open in this process under that name"):
        Collector(StepEnv, None, frames_per_batch=16,
                  weight_sync_schemes={NAME: ServedModuleScheme()})
