"""A served module hosted in a Ray actor (``server_backend="ray"``; the ray extra).

A local Ray cluster of two raylets on this machine (the trainer, the driver, on the
head; the second with the custom ``env_host`` resource), one for the module: starting
one costs seconds. Every test closes its module, and closing waits (bounded) until the
actor's process is gone: the end of each test checks it.
"""

from __future__ import annotations

import functools
import os
import socket
import time

import anyio
import numpy as np
import pytest
import torch

from asyncrl import MultiSyncCollector
from asyncrl.served import (
    ServedModule,
    ServedModuleClient,
    ServedModuleError,
    ServedModuleScheme,
    ServedModuleTimeout,
)
from asyncrl.weights._torchrl import as_weight_sync_schemes

from .served_envs import Raises, Scale, Slow, checked_versions, rewarded_env

ray = pytest.importorskip("ray", reason="the ray extra is not installed")
from asyncrl.launch._ray_handle import _ray_process_alive, actor_info  # noqa: E402
from tests.multihost.ray_cluster import two_raylets  # noqa: E402

# One local Ray cluster at a time: the Ray tests share an xdist group.
pytestmark = [pytest.mark.anyio, pytest.mark.xdist_group("ray")]

EXAMPLE = {"next_observation": torch.zeros(3)}
NAME = "env.transform[0]"


@pytest.fixture(scope="module")
def local_ray():
    yield from two_raylets(env_hosts=1)


def obs(t: float) -> dict[str, np.ndarray]:
    return {"next_observation": np.array([t, 0, 0], np.float32)}


async def call(client: ServedModuleClient, t: float) -> tuple[np.ndarray, int]:
    return await anyio.to_thread.run_sync(client, obs(t))


def actor_of(served: ServedModule):
    return served._host.server.actor


def exists(path: str) -> bool:
    return os.path.exists(path)


def left_behind(handle) -> list[str]:
    """What of a module's directory and shared memory still exists."""
    names = [handle.status, *(n for pair in handle.blocks for n in pair)]
    return [p for p in [handle.directory, *(f"/dev/shm/{n}" for n in names)] if exists(p)]


def gone(actor) -> bool:
    info = actor_info(actor)
    return info.get("State") == "DEAD" and not _ray_process_alive(int(info.get("Pid") or 0))


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_a_ray_actor_serves_versioned_calls_and_is_gone_once_closed(local_ray) -> None:
    with anyio.fail_after(120):
        served = ServedModule(Scale(2.0), name="ray", example=EXAMPLE, server_backend="ray")
        async with served:
            actor = actor_of(served)
            info = actor_info(actor)
            assert served.pid == info["Pid"] != os.getpid()
            # pinned to the trainer's node by default
            assert info["Address"]["NodeID"] == ray.get_runtime_context().get_node_id()
            handle = served.handle
            assert handle.server_backend == "ray" and handle.pid == served.pid
            client = ServedModuleClient(handle)
            out, version = await call(client, 3.0)
            assert out.tolist() == [6.0] and version == 0
            assert await served.update({"scale": torch.tensor([5.0])}) == 1  # acknowledged
            out, version = await call(client, 3.0)
            assert out.tolist() == [15.0] and version == 1  # the next call uses them
            with pytest.raises(RuntimeError, match="scale"):  # checked in the trainer
                await served.update({"scale": torch.ones(3)})
            assert served.version == 1 and served.error is None
            client.close()
        assert gone(actor)  # killed, and its process waited for
        assert left_behind(handle) == []
        await served.aclose()  # idempotent


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # end to end: one backend
async def test_ray_module_transform_scheme_updates_the_ray_hosted_module_by_model_id(
        local_ray) -> None:
    pytest.importorskip("torchrl", reason="TorchRL's scheme needs torchrl")
    from torchrl.weight_update import RayModuleTransformScheme

    with anyio.fail_after(180):
        async with ServedModule(Scale(1.0), name=NAME, example=EXAMPLE, clients=4,
                                server_backend="ray") as served:
            actor = actor_of(served)
            async with MultiSyncCollector(
                    functools.partial(rewarded_env, served.handle), num_workers=2,
                    envs_per_worker=2, frames_per_batch=32, total_frames=32 * 3,
                    info_keys=[served.handle.info_key],
                    weight_sync_schemes={NAME: RayModuleTransformScheme()}) as collector:
                seen = []
                async for batch in collector:
                    version = checked_versions(batch)
                    seen.append(int(version.max()))
                    new = {"scale": torch.tensor([float(served.version + 2)])}
                    collector.update_policy_weights_(new, model_id=NAME)  # TorchRL's spelling
                    assert collector.weight_sender(NAME).version == served.version
                assert seen == [0, 1, 2]
                assert served.version == 3
        assert gone(actor)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # end to end: one backend
async def test_workers_launched_on_another_raylet_call_the_ray_hosted_module_by_name(
        local_ray) -> None:
    """The module in a Ray actor on the trainer's node; workers that ``launch_workers``
    started on the second raylet call it by name over their links (through the trainer),
    a local worker through shared memory: one copy, one version per frame for both."""
    from asyncrl.launch.ray import launch_workers

    with anyio.fail_after(180):
        async with ServedModule(Scale(1.0), name=NAME, example=EXAMPLE, clients=8,
                                server_backend="ray") as served:
            actor = actor_of(served)
            async with MultiSyncCollector(
                    functools.partial(rewarded_env, served.handle), num_workers=1,
                    remote_workers=1, listen="tcp://127.0.0.1:0", envs_per_worker=2,
                    frames_per_batch=64, total_frames=64 * 3,
                    info_keys=[served.handle.info_key],
                    weight_sync_schemes={NAME: ServedModuleScheme(served)}) as collector:
                workers = launch_workers(
                    collector.endpoint, num_workers=1, envs_per_worker=2, max_restarts=0,
                    env="tests.asyncrl.served.served_envs:remote_rewarded_env",
                    resources={"env_host": 1})
                try:
                    seen = []
                    async for batch in collector:
                        version = checked_versions(batch)
                        assert sorted(batch["collector", "worker_id"].unique().tolist()) \
                            == [0, 1]  # the local worker and the one Ray launched
                        seen.append(sorted(version.unique().tolist()))
                        new = {"scale": torch.tensor([float(served.version + 2)])}
                        await collector.update_policy_weights(new, model_id=NAME)
                except BaseException:
                    await workers.aclose()
                    raise
                assert seen == [[0], [1], [2]]
                remote = collector.weight_sender(NAME).remote_calls
                assert remote.answered >= 32 * 3 and remote.refusals == []
            async with workers:  # the collector closed them: each returned 0
                outcomes = await anyio.to_thread.run_sync(lambda: workers.wait(timeout=60))
            assert [o.exit_code for o in outcomes] == [0]
        assert gone(actor)


def test_torchrls_scheme_translates_to_the_served_scheme_that_finds_a_ray_hosted_module(
) -> None:
    pytest.importorskip("torchrl", reason="TorchRL's scheme needs torchrl")
    from torchrl.weight_update import RayModuleTransformScheme

    scheme = as_weight_sync_schemes({NAME: RayModuleTransformScheme()})[NAME]
    assert isinstance(scheme, ServedModuleScheme) and scheme.served is None


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_killed_actor_fails_its_callers_at_once_with_rays_reason(local_ray) -> None:
    with anyio.fail_after(120):
        async with ServedModule(Scale(), name="k", example=EXAMPLE, call_timeout=30,
                                server_backend="ray") as served:
            actor, pid = actor_of(served), served.pid
            client = ServedModuleClient(served.handle)
            assert (await call(client, 3.0))[0].tolist() == [3.0]
            ray.kill(actor, no_restart=True)
            started = time.monotonic()
            expected = (rf"served module 'k' failed and serves no more calls: its Ray actor "
                        rf"\(pid {pid}, node \w+\) died: \w+Error: ")
            with pytest.raises(ServedModuleError, match=expected):
                while True:  # calls made before the trainer saw it may still be answered
                    await call(client, 3.0)
            assert time.monotonic() - started < 15  # not after call_timeout (30 s)
            with pytest.raises(ServedModuleError, match=r"'k' failed and serves no more: its "
                                                        r"Ray actor .* died"):
                await served.update({"scale": torch.ones(1)})
            client.close()
        assert gone(actor)


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_a_module_raising_in_its_actor_fails_callers_with_its_error(local_ray) -> None:
    with anyio.fail_after(120):
        async with ServedModule(Raises(), name="r", example=EXAMPLE,
                                server_backend="ray") as served:
            actor = actor_of(served)
            client = ServedModuleClient(served.handle)
            assert (await call(client, 2.0))[0].tolist() == [2.0]
            with pytest.raises(ServedModuleError,
                               match=r"failed and serves no more calls: ValueError: reward "
                                     r"model: observation out of range \(raised by the module "
                                     rf"in its host process, pid {served.pid}\)"):
                await call(client, 3.0)
            assert isinstance(served.error, ValueError)
            client.close()
        assert gone(actor)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_call_not_answered_in_time_fails_after_call_timeout(local_ray) -> None:
    with anyio.fail_after(120):
        async with ServedModule(Slow(), name="t", example=EXAMPLE, call_timeout=0.5,
                                server_backend="ray") as served:
            client = ServedModuleClient(served.handle)
            await served.update({"delay": torch.tensor([2.0])})
            with pytest.raises(ServedModuleTimeout,
                               match=rf"'t' \(pid {served.pid}\) did not send its answer within "
                                     r"call_timeout=0.5 s .* its host process may be blocked"):
                await call(client, 1.0)
            client.close()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_an_actor_stuck_past_update_timeout_is_killed_and_the_module_fails(
        local_ray) -> None:
    with anyio.fail_after(120):
        async with ServedModule(Slow(), name="u", example=EXAMPLE, call_timeout=0.5,
                                update_timeout=1.0, server_backend="ray") as served:
            actor = actor_of(served)
            client = ServedModuleClient(served.handle)
            await served.update({"delay": torch.tensor([4.0])})  # every call: 4 s
            with pytest.raises(ServedModuleTimeout, match="did not send its answer"):
                await call(client, 1.0)  # the module is now inside a 4 s call
            with pytest.raises(ServedModuleTimeout,
                               match=r"'u': update\(\) waited 1.0 s \(update_timeout\)"):
                await served.update({"delay": torch.tensor([0.0])})
            assert gone(actor)  # killed at once, not at close
            with pytest.raises(ServedModuleError, match=r"stuck in a call for more than "
                                                        r"update_timeout=1.0 s"):
                await call(client, 5.0)
            client.close()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_an_actor_placed_by_resources_on_another_raylet_of_this_host_serves(
        local_ray) -> None:
    with anyio.fail_after(120):
        async with ServedModule(Scale(4.0), name="res", example=EXAMPLE, server_backend="ray",
                                ray_options={"resources": {"env_host": 1}}) as served:
            actor = actor_of(served)
            trainer = ray.get_runtime_context().get_node_id()
            assert actor_info(actor)["Address"]["NodeID"] != trainer  # the second raylet
            client = ServedModuleClient(served.handle)
            assert (await call(client, 1.0))[0].tolist() == [4.0]
            client.close()
        assert gone(actor)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_an_actor_on_another_host_is_refused_naming_the_way_out(local_ray,
                                                                     monkeypatch) -> None:
    real = socket.gethostname()
    monkeypatch.setattr(socket, "gethostname", lambda: "trainer-host")  # this process only
    served = ServedModule(Scale(), name="far", example=EXAMPLE, server_backend="ray")
    with anyio.fail_after(120):
        with pytest.raises(ServedModuleError,
                           match=rf"Ray placed its actor on host '{real}' .*shared memory of "
                                 r"this host, 'trainer-host'.*server_backend='process'"):
            await served.open()
    assert gone(actor_of(served))  # stopped once refused
    assert served._directory is not None and not exists(served._directory)


def test_the_ray_hosts_docstring_examples_run_as_written() -> None:
    import doctest

    from asyncrl.served import _ray_host

    result = doctest.testmod(_ray_host, optionflags=doctest.ELLIPSIS)
    assert result.attempted and not result.failed


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_ray_options_belong_to_a_ray_host_which_is_never_restarted() -> None:
    with pytest.raises(ValueError, match=r"ray_options=\{'num_gpus': 1\} start a Ray actor: "
                                         r"give server_backend='ray'"):
        ServedModule(Scale(), example=EXAMPLE, ray_options={"num_gpus": 1})
    from asyncrl.served._ray_host import actor_options

    with pytest.raises(ValueError, match="never restarted"):
        actor_options({"max_restarts": -1}, 1)
    served = ServedModule(Scale(), example=EXAMPLE, server_backend="ray",
                          ray_options={"max_restarts": 2})
    with anyio.fail_after(60), pytest.raises(ValueError, match=r"ray_options=\{'max_restarts"
                                                               r"': 2\}: .* never restarted"):
        await served.open()  # before any actor starts
    assert repr(served) == "ServedModule('served', closed, version=0)"
    on_gpu = ServedModule(Scale(), example=EXAMPLE, server_backend="ray", device="cuda")
    with anyio.fail_after(60), pytest.raises(ValueError, match=r"sees no GPU unless it asks "
                                                               r"for one: give ray_options="
                                                               r"\{'num_gpus': 1\}"):
        await on_gpu.open()  # refused before any actor starts (a GPU or not here)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_without_ray_init_a_ray_host_is_refused_saying_so(monkeypatch) -> None:
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    served = ServedModule(Scale(), name="no", example=EXAMPLE, server_backend="ray")
    with anyio.fail_after(60), pytest.raises(ServedModuleError, match=r"^served module 'no': "
                                                         r"server_backend='ray' .* there is "
                                                         r"none: call ray.init\(\)"):
        await served.open()
    assert repr(served) == "ServedModule('no', closed, version=0)"
