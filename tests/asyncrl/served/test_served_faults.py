"""Faults of a served module: it raises, it is slow, it closes, its host dies, a caller dies."""

from __future__ import annotations

import functools
import multiprocessing as mp
import os
import signal
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
    ServedModuleHandle,
    ServedModuleTimeout,
)

from .served_envs import Raises, Scale, Slow, rewarded_env

pytestmark = pytest.mark.anyio

#: Where the module is hosted: both hosts keep each promise below.
BACKENDS = pytest.mark.parametrize("server_backend", ["thread", "process"])

EXAMPLE = {"next_observation": torch.zeros(3)}


def obs(t: float) -> dict[str, np.ndarray]:
    return {"next_observation": np.array([t, 0, 0], np.float32)}


async def call(client: ServedModuleClient, t: float) -> tuple[np.ndarray, int]:
    return await anyio.to_thread.run_sync(client, obs(t))


async def test_a_module_that_raises_fails_the_call_with_its_error_and_serves_no_more() -> None:
    with anyio.fail_after(90):
        async with ServedModule(Raises(), name="r", example=EXAMPLE) as served:
            client = ServedModuleClient(served.handle)
            assert (await call(client, 2.0))[0].tolist() == [2.0]
            started = time.monotonic()
            with pytest.raises(ServedModuleError,
                               match="failed and serves no more calls: ValueError: reward "
                                     "model: observation out of range"):
                await call(client, 3.0)
            with pytest.raises(ServedModuleError, match="ValueError"):  # at once, every call
                await call(client, 1.0)
            assert time.monotonic() - started < served.call_timeout  # not a timeout
            assert isinstance(served.error, ValueError)
            with pytest.raises(ServedModuleError, match="failed and serves no more"):
                await served.update({"w": torch.ones(1)})
            client.close()


async def test_a_module_that_raises_stops_the_collector_with_its_error() -> None:
    with anyio.fail_after(120):
        async with ServedModule(Raises(), name="r", example=EXAMPLE) as served:
            # the worker's error, re-raised with its type: the module's message, the worker
            with pytest.raises(ServedModuleError, match=r"(?s)observation out of range.*"
                                                        r"raised in worker 0"):
                async with MultiSyncCollector(functools.partial(rewarded_env, served.handle),
                                              num_workers=1, frames_per_batch=16,
                                              total_frames=64) as collector:
                    async for _ in collector:
                        pass


@BACKENDS
async def test_a_call_not_answered_in_time_fails_and_the_next_call_gets_its_own_answer(
        server_backend: str) -> None:
    with anyio.fail_after(90):
        async with ServedModule(Slow(), name="slow", example=EXAMPLE, call_timeout=0.5,
                                server_backend=server_backend) as served:
            client = ServedModuleClient(served.handle)
            await served.update({"delay": torch.tensor([1.0])})
            with pytest.raises(ServedModuleTimeout,
                               match=r"'slow' \(pid \d+\) did not send its answer within "
                                     r"call_timeout=0.5 s"):
                await call(client, 7.0)
            await served.update({"delay": torch.tensor([0.0])})  # after the slow call ended
            out, version = await call(client, 4.0)
            assert out.tolist() == [4.0] and version == 2  # not the late answer to 7.0
            client.close()


async def test_closing_the_module_fails_its_callers_at_once() -> None:
    with anyio.fail_after(90):
        async with ServedModule(Slow(), name="c", example=EXAMPLE, call_timeout=20) as served:
            client = ServedModuleClient(served.handle)
            await served.update({"delay": torch.tensor([0.5])})
            error: list[BaseException] = []

            async def caller() -> None:
                try:
                    for _ in range(100):
                        await call(client, 1.0)
                except ServedModuleError as exc:
                    error.append(exc)

            async with anyio.create_task_group() as tg:
                tg.start_soon(caller)
                await anyio.sleep(0.2)
                started = time.monotonic()
                await served.aclose()
            assert time.monotonic() - started < 15
        assert error and "was closed while this env called it" in str(error[0])
        with pytest.raises(ServedModuleError, match="is not served"):
            ServedModuleClient(served.handle)
        client.close()


def _call_forever(handle: ServedModuleHandle) -> None:
    client = ServedModuleClient(handle)
    while True:
        client(obs(99.0))


@BACKENDS
async def test_a_caller_lost_mid_call_frees_its_slot_and_no_answer_goes_astray(
        server_backend: str) -> None:
    with anyio.fail_after(90):
        async with ServedModule(Slow(), name="lost", example=EXAMPLE, clients=1,
                                server_backend=server_backend) as served:
            await served.update({"delay": torch.tensor([0.3])})
            process = mp.get_context("forkserver").Process(target=_call_forever,
                                                           args=(served.handle,))
            process.start()
            try:
                while served.statistics().calls < 1:  # it holds the only slot, mid-call
                    await anyio.sleep(0.05)
                with pytest.raises(ServedModuleError, match="all its 1 client slots"):
                    ServedModuleClient(served.handle)
            finally:
                os.kill(process.pid, signal.SIGKILL)
                await anyio.to_thread.run_sync(process.join, 10)
            client = ServedModuleClient(served.handle)  # the kernel freed the slot
            out, _ = await call(client, 5.0)
            assert out.tolist() == [5.0]  # its own answer, not the dead caller's 99
            client.close()


def _host(queue: mp.Queue, stop: mp.Event) -> None:  # type: ignore[type-arg]
    async def serve() -> None:
        async with ServedModule(Scale(), name="host", example=EXAMPLE,
                                call_timeout=1.0) as served:
            queue.put(served.handle)
            await anyio.to_thread.run_sync(stop.wait)

    anyio.run(serve)


async def test_a_killed_host_fails_the_call_after_call_timeout_never_a_hang() -> None:
    context = mp.get_context("forkserver")
    queue, stop = context.Queue(), context.Event()
    host = context.Process(target=_host, args=(queue, stop))
    host.start()
    handle: ServedModuleHandle | None = None
    try:
        with anyio.fail_after(90):
            handle = await anyio.to_thread.run_sync(queue.get, True, 50)
            assert handle is not None
            client = ServedModuleClient(handle)
            assert (await call(client, 3.0))[0].tolist() == [3.0]
            os.kill(host.pid, signal.SIGKILL)
            await anyio.to_thread.run_sync(host.join, 10)
            started = time.monotonic()
            with pytest.raises(ServedModuleTimeout, match="did not send its answer"):
                await call(client, 3.0)
            assert time.monotonic() - started < 10
            client.close()
    finally:
        if host.is_alive():
            host.kill()
        if handle is not None:  # what the killed host could not clean up
            for name in [handle.status, *(n for pair in handle.blocks for n in pair)]:
                try:
                    os.unlink(f"/dev/shm/{name}")
                except FileNotFoundError:
                    pass
            import shutil

            shutil.rmtree(handle.directory, ignore_errors=True)


@BACKENDS
async def test_inputs_of_the_wrong_shape_are_refused_before_the_call(server_backend: str) -> None:
    with anyio.fail_after(90):
        async with ServedModule(Scale(), name="s", example=EXAMPLE,
                                server_backend=server_backend) as served:
            client = ServedModuleClient(served.handle)
            with pytest.raises(ServedModuleError, match=r"input 'next_observation' has shape "
                                                        r"\(4,\), expected \(3,\)"):
                client({"next_observation": np.zeros(4, np.float32)})
            with pytest.raises(ServedModuleError, match="this call lacks"):
                client({"observation": np.zeros(3, np.float32)})
            assert (await call(client, 2.0))[0].tolist() == [2.0]
            client.close()


@BACKENDS
async def test_weights_that_do_not_fit_are_refused_and_the_module_serves_on(
        server_backend: str) -> None:
    with anyio.fail_after(90):
        async with ServedModule(Scale(2.0), name="s", example=EXAMPLE,
                                server_backend=server_backend) as served:
            client = ServedModuleClient(served.handle)
            with pytest.raises(RuntimeError, match="scale"):
                await served.update({"weight": torch.ones(3)})
            assert served.version == 0 and served.error is None
            out, version = await call(client, 2.0)
            assert out.tolist() == [4.0] and version == 0
            client.close()


@BACKENDS
async def test_calls_waiting_together_are_answered_by_one_call_of_the_module(
        server_backend: str) -> None:
    with anyio.fail_after(90):
        async with ServedModule(Slow(), name="b", example=EXAMPLE, clients=4,
                                server_backend=server_backend) as served:
            await served.update({"delay": torch.tensor([0.3])})
            clients = [ServedModuleClient(served.handle) for _ in range(4)]
            answers: dict[int, list[float]] = {}

            async def ask(i: int) -> None:
                answers[i] = (await call(clients[i], float(i + 1)))[0].tolist()

            async with anyio.create_task_group() as tg:
                for i in range(4):
                    tg.start_soon(ask, i)
            assert answers == {i: [float(i + 1)] for i in range(4)}  # each its own row
            while served.statistics().observations < 4:  # a host process reports each 0.2 s
                await anyio.sleep(0.05)
            # the first call holds the module 0.3 s: the others wait, then go in one call
            assert max(served.statistics().batch_sizes) >= 2
            for client in clients:
                client.close()


def test_a_client_on_another_host_is_refused_naming_both_hosts() -> None:
    elsewhere = ServedModuleHandle(name="m", host="trainer-host", pid=1, directory="/x",
                                   status="s", blocks=(("a", "b"),),
                                   inputs=(("next_observation", "float32", (3,)),),
                                   output=("output", "float32", (1,)), call_timeout=1.0,
                                   spin=0.0)
    with pytest.raises(ServedModuleError, match="served on host 'trainer-host'; this process "
                                                "runs on"):
        ServedModuleClient(elsewhere)
