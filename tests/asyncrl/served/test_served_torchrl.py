"""ServedModuleTransform in TorchRL's TransformedEnv, and RayModuleTransformScheme translated."""

from __future__ import annotations

import functools

import anyio
import pytest
import torch

from asyncrl import MultiSyncCollector
from asyncrl.served import ServedModule, ServedModuleScheme, ServedModuleTransform
from asyncrl.weights._torchrl import as_weight_sync_schemes

from .served_envs import Scale, torchrl_env

pytest.importorskip("torchrl")
pytestmark = pytest.mark.anyio

NAME = "env.transform[0]"
EXAMPLE = {"next_observation": torch.zeros(3)}


async def test_a_transformed_env_gets_its_reward_and_version_from_the_served_module() -> None:
    with anyio.fail_after(60):
        async with ServedModule(Scale(2.0), name=NAME, example=EXAMPLE) as served:
            env = torchrl_env(served.handle)
            rollout = await anyio.to_thread.run_sync(env.rollout, 4)
            t = rollout["next", "observation"][..., 0]
            assert torch.equal(rollout["next", "reward"].squeeze(-1), 2 * t)
            assert rollout["next", "served_versions", NAME].tolist() == [0, 0, 0, 0]
            await served.update({"scale": torch.tensor([3.0])})
            rollout = await anyio.to_thread.run_sync(env.rollout, 2)
            assert rollout["next", "served_versions", NAME].tolist() == [1, 1]
            assert torch.equal(rollout["next", "reward"].squeeze(-1),
                               3 * rollout["next", "observation"][..., 0])
            env.close()


async def test_torchrl_envs_in_workers_get_the_weights_updated_by_model_id() -> None:
    # asyncrl's TorchRL env pool keeps flat observation keys only: the version the
    # transform writes (nested) is not in the batch; sync mode says which weights ran.
    with anyio.fail_after(120):
        async with ServedModule(Scale(1.0), name=NAME, example=EXAMPLE) as served:
            async with MultiSyncCollector(
                    functools.partial(torchrl_env, served.handle), num_workers=2,
                    frames_per_batch=32, total_frames=96,
                    weight_sync_schemes={NAME: ServedModuleScheme()}) as collector:
                scales = []
                async for batch in collector:
                    t = batch["next", "observation"][..., 0]
                    ratio = batch["next", "reward"].squeeze(-1)[t > 0] / t[t > 0]
                    scales.append(ratio.unique().tolist())
                    await collector.update_policy_weights_(  # TorchRL's spelling
                        {"scale": torch.tensor([float(served.version + 2)])}, model_id=NAME)
                assert scales == [[1.0], [2.0], [3.0]]


def test_ray_module_transform_scheme_translates_to_the_served_scheme() -> None:
    from torchrl.weight_update import RayModuleTransformScheme

    schemes = as_weight_sync_schemes({NAME: RayModuleTransformScheme()})
    assert isinstance(schemes[NAME], ServedModuleScheme)
    assert schemes[NAME].served is None  # finds the module open under NAME


def test_a_scheme_bound_to_torchrls_ray_actor_is_refused_naming_the_served_transform() -> None:
    from torchrl.weight_update import RayModuleTransformScheme

    scheme = RayModuleTransformScheme()
    scheme._set_transform(object())  # what RayModuleTransform(weight_sync_scheme=) does
    with pytest.raises(TypeError, match=r"bound to TorchRL's RayModuleTransform.*"
                                        r"ServedModuleTransform"):
        as_weight_sync_schemes({NAME: scheme})


def test_an_input_with_no_known_key_is_refused_naming_what_to_pass() -> None:
    from asyncrl.served import ServedModuleError, ServedModuleHandle

    weird = ServedModuleHandle(name="m", host="h", pid=1, directory="/x", status="s",
                               blocks=(("a", "b"),), inputs=(("pixels", "float32", (3,)),),
                               output=("output", "float32", (1,)), call_timeout=1.0, spin=0.0)
    with pytest.raises(ServedModuleError, match=r"in_keys=\{'pixels': \('next', "):
        ServedModuleTransform(weird)
    transform = ServedModuleTransform(weird, in_keys={"pixels": ("next", "pixels")})
    assert transform.in_keys == ["pixels"]
