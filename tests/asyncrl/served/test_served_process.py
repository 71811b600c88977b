"""A served module hosted in a dedicated process (``server_backend="process"``), and the
bound on ``update()`` for both hosts."""

from __future__ import annotations

import functools
import os
import signal
import time

import anyio
import numpy as np
import pytest
import torch

from asyncrl import MultiSyncCollector
from asyncrl._spawn.child import process_alive
from asyncrl.served import (
    ServedModule,
    ServedModuleClient,
    ServedModuleError,
    ServedModuleScheme,
    ServedModuleTimeout,
)

from .served_envs import Scale, Slow, checked_versions, rewarded_env

pytestmark = pytest.mark.anyio

EXAMPLE = {"next_observation": torch.zeros(3)}
NAME = "env.transform[0]"


def obs(t: float) -> dict[str, np.ndarray]:
    return {"next_observation": np.array([t, 0, 0], np.float32)}


async def call(client: ServedModuleClient, t: float) -> tuple[np.ndarray, int]:
    return await anyio.to_thread.run_sync(client, obs(t))


def shm_names(served: ServedModule) -> list[str]:
    handle = served.handle
    return [handle.status, *(n for pair in handle.blocks for n in pair)]


def left_behind(directory: str, names: list[str]) -> list[str]:
    """What of a module's directory and shared memory still exists."""
    paths = [directory, *(f"/dev/shm/{n}" for n in names)]
    return [p for p in paths if os.path.exists(p)]


async def test_a_process_host_serves_from_its_own_process_versioned_and_closes_clean() -> None:
    with anyio.fail_after(90):
        served = ServedModule(Scale(2.0), name="p", example=EXAMPLE, server_backend="process")
        async with served:
            pid, handle = served.pid, served.handle
            assert pid != os.getpid() and process_alive(pid)
            assert handle.server_backend == "process" and handle.pid == pid
            names, directory = shm_names(served), handle.directory
            client = ServedModuleClient(handle)
            out, version = await call(client, 3.0)
            assert out.tolist() == [6.0] and version == 0
            assert await served.update({"scale": torch.tensor([5.0])}) == 1  # acknowledged
            out, version = await call(client, 3.0)
            assert out.tolist() == [15.0] and version == 1  # the next call uses them
            assert await served.update(Scale(7.0)) == 2 and served.version == 2
            assert (await call(client, 1.0))[0].tolist() == [7.0]
            with pytest.raises(RuntimeError, match="scale"):  # checked in the trainer
                await served.update({"scale": torch.ones(3)})
            assert served.version == 2 and served.error is None
            assert (await call(client, 1.0))[0].tolist() == [7.0]  # it serves on
            client.close()
        assert not process_alive(pid)  # stopped and reaped: no zombie either
        await served.aclose()  # idempotent
        assert repr(served) == "ServedModule('p', closed, version=2)"
        assert left_behind(directory, names) == []


async def test_weights_by_model_id_reach_a_process_host_and_every_frame_records_them() -> None:
    with anyio.fail_after(120):
        async with ServedModule(Scale(1.0), name=NAME, example=EXAMPLE, clients=4,
                                server_backend="process") as served:
            async with MultiSyncCollector(
                    functools.partial(rewarded_env, served.handle), num_workers=2,
                    envs_per_worker=2, frames_per_batch=32, total_frames=32 * 3,
                    info_keys=[served.handle.info_key],
                    weight_sync_schemes={NAME: ServedModuleScheme(served)}) as collector:
                seen = []
                async for batch in collector:
                    version = checked_versions(batch)
                    seen.append(int(version.max()))
                    new = {"scale": torch.tensor([float(served.version + 2)])}
                    await collector.update_policy_weights(new, model_id=NAME)
                    assert collector.weight_sender(NAME).version == served.version
                assert seen == [0, 1, 2]
                assert served.version == 3


async def test_a_killed_host_process_fails_callers_at_once_and_the_update_with_its_exit() -> None:
    with anyio.fail_after(90):
        async with ServedModule(Scale(), name="k", example=EXAMPLE, call_timeout=30,
                                server_backend="process") as served:
            pid = served.pid
            client = ServedModuleClient(served.handle)
            assert (await call(client, 3.0))[0].tolist() == [3.0]
            os.kill(pid, signal.SIGKILL)
            started = time.monotonic()
            expected = (rf"served module 'k' failed and serves no more calls: its host "
                        rf"process \(pid {pid}\) was killed by SIGKILL \(exit code -9\)")
            with pytest.raises(ServedModuleError, match=expected):
                while True:  # calls made before the trainer saw it may still be answered
                    await call(client, 3.0)
            assert time.monotonic() - started < 15  # not after call_timeout (30 s)
            with pytest.raises(ServedModuleError,
                               match=rf"'k' failed and serves no more: its host process "
                                     rf"\(pid {pid}\) was killed by SIGKILL"):
                await served.update({"scale": torch.ones(1)})
            assert isinstance(served.error, ServedModuleError)
            assert "failed" in repr(served)
            client.close()
        await served.aclose()


async def test_a_module_that_raises_in_its_host_process_fails_callers_with_its_error() -> None:
    from .served_envs import Raises

    with anyio.fail_after(90):
        async with ServedModule(Raises(), name="r", example=EXAMPLE,
                                server_backend="process") as served:
            client = ServedModuleClient(served.handle)
            assert (await call(client, 2.0))[0].tolist() == [2.0]
            started = time.monotonic()
            with pytest.raises(ServedModuleError,
                               match=r"failed and serves no more calls: ValueError: reward "
                                     r"model: observation out of range \(raised by the module "
                                     rf"in its host process, pid {served.pid}\)"):
                await call(client, 3.0)
            with pytest.raises(ServedModuleError, match="ValueError"):  # every call, at once
                await call(client, 1.0)
            assert time.monotonic() - started < served.call_timeout
            assert isinstance(served.error, ValueError)
            with pytest.raises(ServedModuleError, match="failed and serves no more"):
                await served.update({"w": torch.ones(1)})
            client.close()


async def test_closing_a_process_host_fails_its_callers_and_cancelled_close_leaves_nothing(
) -> None:
    with anyio.fail_after(90):
        served = ServedModule(Slow(), name="c", example=EXAMPLE, call_timeout=20,
                              server_backend="process")
        await served.open()
        pid = served.pid
        client = ServedModuleClient(served.handle)
        await served.update({"delay": torch.tensor([0.5])})
        errors: list[BaseException] = []

        async def caller() -> None:
            try:
                for _ in range(100):
                    await call(client, 1.0)
            except ServedModuleError as exc:
                errors.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(caller)
            await anyio.sleep(0.3)
            with anyio.CancelScope() as scope:  # a close cancelled at once still finishes
                scope.cancel()
                await served.aclose()
        assert errors and "was closed while this env called it" in str(errors[0])
        assert not process_alive(pid)
        with pytest.raises(ServedModuleError, match="is not served"):
            ServedModuleClient(served.handle)
        client.close()


@pytest.mark.parametrize("server_backend", ["thread", "process"])
async def test_an_update_waits_for_a_stuck_call_at_most_update_timeout(
        server_backend: str) -> None:
    with anyio.fail_after(90):
        async with ServedModule(Slow(), name="u", example=EXAMPLE, call_timeout=0.5,
                                update_timeout=1.0, server_backend=server_backend) as served:
            client = ServedModuleClient(served.handle)
            await served.update({"delay": torch.tensor([4.0])})  # every call: 4 s
            with pytest.raises(ServedModuleTimeout, match="did not send its answer"):
                await call(client, 1.0)  # the module is now inside a 4 s call
            started = time.monotonic()
            with pytest.raises(ServedModuleTimeout,
                               match=r"'u': update\(\) waited 1.0 s \(update_timeout\) for "
                                     r"the call under way"):
                await served.update({"delay": torch.tensor([0.0])})
            assert time.monotonic() - started < 3.5  # not the 4 s call's end
            if server_backend == "thread":
                # nothing loaded: once the call ends it serves on, at its version
                assert served.version == 1 and served.error is None
                await anyio.sleep(4.0)
                assert await served.update({"delay": torch.tensor([0.0])}) == 2
                out, version = await call(client, 5.0)
                assert out.tolist() == [5.0] and version == 2
            else:
                # a host process stuck that long is stopped: the module fails, saying why
                assert isinstance(served.error, ServedModuleTimeout)
                assert not process_alive(served.pid)
                with pytest.raises(ServedModuleError, match=r"stuck in a call for more than "
                                                            r"update_timeout=1.0 s"):
                    await call(client, 5.0)
            client.close()


def test_the_host_is_a_thread_a_process_or_a_ray_actor_and_nothing_else() -> None:
    with pytest.raises(ValueError, match=r"server_backend='dask': expected one of "
                                         r"\('thread', 'process', 'ray'\)"):
        ServedModule(Scale(), example=EXAMPLE, server_backend="dask")
    with pytest.raises(ValueError, match="start_method='spawn' starts a host process"):
        ServedModule(Scale(), example=EXAMPLE, start_method="spawn")
    with pytest.raises(ValueError, match="update_timeout=0"):
        ServedModule(Scale(), example=EXAMPLE, update_timeout=0)


FORGOTTEN = """
import anyio, torch
from asyncrl.served import ServedModule
from tests.asyncrl.served.served_envs import Scale

async def main():
    served = ServedModule(Scale(), example={"next_observation": torch.zeros(3)},
                          server_backend="process")
    await served.open()  # and never closed
    h = served.handle
    print(served.pid, h.directory, h.status, *(n for pair in h.blocks for n in pair),
          flush=True)

anyio.run(main)
"""


def test_a_process_host_never_closed_lets_the_trainer_exit_and_ends_with_it() -> None:
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[3])
    done = subprocess.run([sys.executable, "-c", FORGOTTEN], capture_output=True, text=True,
                          timeout=120, cwd=root, env={**os.environ, "PYTHONPATH": root})
    assert done.returncode == 0, done.stderr[-2000:]  # exited: no thread held it
    pid, directory, *names = done.stdout.split()
    try:
        deadline = time.monotonic() + 20
        while process_alive(int(pid)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not process_alive(int(pid))  # the host saw its parent gone and exited
    finally:  # what a trainer that never closed its module leaves (its shared memory)
        shutil.rmtree(directory, ignore_errors=True)
        for name in names:
            Path(f"/dev/shm/{name}").unlink(missing_ok=True)


async def test_closing_a_process_host_during_an_update_ends_the_update_at_once() -> None:
    with anyio.fail_after(90):
        served = ServedModule(Slow(), name="cu", example=EXAMPLE, call_timeout=0.5,
                              update_timeout=30, server_backend="process")
        await served.open()
        client = ServedModuleClient(served.handle)
        await served.update({"delay": torch.tensor([5.0])})
        with pytest.raises(ServedModuleTimeout):
            await call(client, 1.0)  # the host is now inside a 5 s call
        errors: list[BaseException] = []

        async def update() -> None:
            try:
                await served.update({"delay": torch.tensor([0.0])})
            except ServedModuleError as exc:
                errors.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(update)
            await anyio.sleep(0.5)
            started = time.monotonic()
            await served.aclose()
        assert time.monotonic() - started < 15  # not update_timeout (30 s)
        assert len(errors) == 1 and "was closed while update() waited" in str(errors[0])
        assert not process_alive(served.pid)
        client.close()


async def test_a_module_its_host_cannot_build_fails_open_saying_so_and_leaves_nothing() -> None:
    from .served_envs import HomeOnly

    with anyio.fail_after(90):
        served = ServedModule(HomeOnly(), name="h", example=EXAMPLE, server_backend="process")
        with pytest.raises(ServedModuleError, match=r"'h': its host process did not start "
                                                    r"serving: its host process \(pid \d+\) "
                                                    r"exited with code 1 before it could say "
                                                    r"why \(its stderr has the traceback"):
            await served.open()
        assert repr(served) == "ServedModule('h', closed, version=0)"
        await served.aclose()
