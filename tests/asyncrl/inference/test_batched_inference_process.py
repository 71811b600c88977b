"""AsyncBatchedCollector(server_backend="process"): the policy served by a dedicated process."""

from __future__ import annotations

import functools
import os
import signal
import time
from typing import Any

import anyio
import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch import nn

from asyncrl import AsyncBatchedCollector, WorkerLostError
from asyncrl.testing import CountingEnv, ValuePolicy, fill_parameters, version_problems
from tests.asyncrl.counting_frames import check_counting_frames
from tests.asyncrl.process_checks import pid_alive

pytestmark = pytest.mark.anyio
LIMIT = 90
counting3 = functools.partial(CountingEnv, length=3)


class WhereAndWhen(nn.Module):
    """Action 1; also writes the process that chose it and when (CLOCK_MONOTONIC)."""

    def forward(self, observation: torch.Tensor) -> tuple[torch.Tensor, ...]:
        n = observation.shape[:-1]
        return (torch.ones(n, dtype=torch.int64), torch.full(n, os.getpid(), dtype=torch.int64),
                torch.full(n, time.monotonic(), dtype=torch.float64))


def where_and_when() -> TensorDictModule:
    return TensorDictModule(WhereAndWhen(), in_keys=["observation"],
                            out_keys=["action", "pid", "t"])


class FailsAtStep2(nn.Module):
    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        if (observation[..., 0] == 2).any():
            raise RuntimeError("policy blew up at step 2")
        return torch.ones(observation.shape[:-1], dtype=torch.int64)


NEEDS_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.parametrize("options", [
    pytest.param({"server_backend": "process"}, id="process"),
    # A CUDA graph (static_batch_size) reads the parameters where they are: each way of
    # giving weights must copy into them for the next replay to use them.
    pytest.param({"server_backend": "process", "device": "cuda", "static_batch_size": 8},
                 marks=NEEDS_CUDA, id="process-cuda-graph"),
    pytest.param({"server_backend": "thread", "device": "cuda", "static_batch_size": 8},
                 marks=NEEDS_CUDA, id="thread-cuda-graph"),
])
async def test_versions_and_frames_are_exact_across_every_kind_of_update(
        options: dict[str, Any]) -> None:
    policy = ValuePolicy(0.0)
    values: dict[int, float | None] = {0: 0.0}
    batches = []
    kinds = ["module_given", "state_dict", "tensordict", "module"]
    with anyio.fail_after(LIMIT):
        async with AsyncBatchedCollector(counting3, num_envs=4, envs_per_worker=2,
                                         policy=policy, frames_per_batch=8, total_frames=96,
                                         **options) as collector:
            assert collector.server_backend == options["server_backend"]
            async for batch in collector:
                batches.append(batch)
                version = collector.policy_version + 1
                kind = kinds[version % 4]
                weights: Any = None
                if kind == "module_given":
                    fill_parameters(policy, float(version))
                elif kind == "state_dict":
                    weights = {"value": torch.tensor([float(version)])}
                elif kind == "tensordict":
                    weights = TensorDict({"value": torch.tensor([float(version)])}, [])
                else:
                    weights = ValuePolicy(float(version))
                await collector.update_policy_weights(weights)
                values[version] = float(version)
                assert collector.policy_version == version  # acked: in use from now on
    assert [b.numel() for b in batches] == [8] * 12
    assert version_problems(batches, values) == []
    frames = torch.cat(batches, 0)
    assert len(set(frames["collector", "policy_version"].tolist())) >= 3
    # (actions were checked against their versions above; the rest, frame by frame:)
    check_counting_frames(frames, length=3)


async def test_the_policy_runs_in_its_own_process_and_it_ends_with_the_collector() -> None:
    with anyio.fail_after(LIMIT):
        async with AsyncBatchedCollector(counting3, num_envs=2, policy_factory=where_and_when,
                                         frames_per_batch=6, total_frames=12,
                                         server_backend="process") as collector:
            server = collector.inference_pid
            workers = collector.worker_pids
            frames = torch.cat([b async for b in collector], 0)
            await anyio.sleep(0.6)  # two statistics reports
            stats = collector.inference_statistics()
    assert server is not None and server not in (os.getpid(), *workers)
    assert set(frames["pid"].tolist()) == {server}
    assert stats.observations >= 12 and stats.calls >= 6
    check_counting_frames(frames, length=3, action=1)
    for pid in (server, *workers):
        assert not pid_alive(pid)


async def test_collection_goes_on_while_a_training_step_holds_the_trainers_loop() -> None:
    with anyio.fail_after(LIMIT):
        async with AsyncBatchedCollector(counting3, num_envs=2, policy_factory=where_and_when,
                                         frames_per_batch=4, total_frames=-1,
                                         server_backend="process") as collector:
            # Up to five training steps: on a loaded machine the workers' rings may be full
            # when one begins (the frames they hold were chosen before it), and then nothing
            # is left to answer during that step (three were too few once, under a full
            # `-n 2` run beside benchmarks); a server that needs this loop fails all five.
            for _ in range(5):
                await collector.__anext__()
                start = time.monotonic()
                time.sleep(2.0)  # a blocking training step: this event loop does nothing
                end = time.monotonic()
                # Until each worker has a frame chosen after the hold: a worker's chunks come
                # in order, so every frame it stepped during the hold is in by then (the other
                # worker's later frames may come first).
                frames, late = [], set()
                while late != {0, 1}:
                    frames.append(batch := await collector.__anext__())
                    late.update(batch["collector", "worker_id"][batch["t"] >= end].tolist())
                chosen = torch.cat(frames, 0)["t"]
                if ((chosen > start) & (chosen < end)).any():
                    break
    assert ((chosen > start) & (chosen < end)).any(), "no action was chosen during any step"


async def test_a_trainer_that_takes_no_batches_holds_the_server() -> None:
    with anyio.fail_after(LIMIT):
        async with AsyncBatchedCollector(counting3, num_envs=2, policy=ValuePolicy(1.0),
                                         frames_per_batch=4, total_frames=-1,
                                         server_backend="process") as collector:
            await collector.__anext__()
            calls = -1
            while collector.inference_statistics().calls != calls:  # until it stops serving
                calls = collector.inference_statistics().calls
                await anyio.sleep(1.0)
            batch = await collector.__anext__()
            while collector.inference_statistics().calls == calls:  # room again: it serves
                batch = await collector.__anext__()
                await anyio.sleep(0.1)
    check_counting_frames(batch, length=3, action=1)


async def test_a_policy_error_in_the_process_stops_the_run_with_that_error() -> None:
    with anyio.fail_after(LIMIT):
        async with AsyncBatchedCollector(counting3, num_envs=2, policy=FailsAtStep2(),
                                         frames_per_batch=4, total_frames=-1,
                                         server_backend="process") as collector:
            with pytest.raises(RuntimeError, match="policy blew up at step 2") as info:
                async for _ in collector:
                    pass
            assert "raised in worker the inference process" in info.value.__notes__[0]
            assert "in forward" in info.value.__notes__[0]  # its traceback


async def test_a_killed_inference_process_stops_the_run_and_leaves_nothing() -> None:
    with anyio.fail_after(LIMIT):
        async with AsyncBatchedCollector(counting3, num_envs=2, policy=ValuePolicy(1.0),
                                         frames_per_batch=4, total_frames=-1,
                                         server_backend="process") as collector:
            await collector.__anext__()
            server, workers = collector.inference_pid, collector.worker_pids
            assert server is not None
            os.kill(server, signal.SIGKILL)
            with pytest.raises(WorkerLostError, match=r"inference process .*SIGKILL"):
                async for _ in collector:
                    pass
    for pid in (server, *workers):
        assert not pid_alive(pid)


def test_torchrls_server_config_selects_the_process_and_the_batching() -> None:
    from torchrl.modules.inference_server import InferenceServerConfig

    c = AsyncBatchedCollector(counting3, num_envs=4, policy=ValuePolicy(), frames_per_batch=4,
                              server_config=InferenceServerConfig(
                                  service_backend="process", max_batch_size=2,
                                  min_batch_size=2, timeout=0.5))
    assert c.server_backend == "process"
    assert (c.batching.max_batch_size, c.batching.min_batch_size,
            c.batching.server_timeout) == (2, 2, 0.5)
    thread = AsyncBatchedCollector(counting3, num_envs=2, policy=ValuePolicy(),
                                   frames_per_batch=4, server_config=InferenceServerConfig())
    assert thread.server_backend == "thread" and thread.batching.max_batch_size == 64


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"server_config": "InferenceServerConfig(collect_stats=False)"}, ValueError,
     "collect_stats=False is not supported"),
    ({"server_config": "InferenceServerConfig()", "max_batch_size": 4}, ValueError,
     "mutually exclusive"),
    ({"server_backend": "ray"}, ValueError, r"server_backend must be one of \('thread', "
     r"'process'\), got 'ray'"),
    ({"server_backend": "process", "policy": None, "policy_factory": lambda: ValuePolicy()},
     TypeError, "policy_factory .* cannot be sent"),
])
def test_arguments_of_the_process_server_are_checked(kwargs, error, match) -> None:
    from torchrl.modules.inference_server import InferenceServerConfig  # noqa: F401 (eval)

    if "server_config" in kwargs:
        kwargs = {**kwargs, "server_config": eval(kwargs["server_config"])}
    options: dict[str, Any] = {"policy": ValuePolicy(), **kwargs}
    with pytest.raises(error, match=match):
        AsyncBatchedCollector(counting3, num_envs=2, frames_per_batch=4, **options)


class WhereItRan(nn.Module):
    """Action 1; ``on_cuda``: 1 where the forward saw its input on a CUDA device."""

    def forward(self, observation: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n = observation.shape[:-1]
        return (torch.ones(n, dtype=torch.int64, device=observation.device),
                torch.full(n, int(observation.is_cuda), dtype=torch.int64,
                           device=observation.device))


def where_it_ran() -> TensorDictModule:
    return TensorDictModule(WhereItRan(), in_keys=["observation"], out_keys=["action", "on_cuda"])


@NEEDS_CUDA
async def test_the_process_serves_the_policy_on_the_device_asked() -> None:
    with anyio.fail_after(LIMIT):
        async with AsyncBatchedCollector(counting3, num_envs=2, policy_factory=where_it_ran,
                                         device="cuda", frames_per_batch=6, total_frames=12,
                                         server_backend="process") as collector:
            frames = torch.cat([b async for b in collector], 0)
    assert frames.device == torch.device("cpu") or frames.device is None
    assert (frames["on_cuda"] == 1).all()
    check_counting_frames(frames, length=3, action=1)


async def test_what_waits_while_the_trainers_loop_is_held_is_bounded() -> None:
    opened = time.monotonic()
    with anyio.fail_after(LIMIT):
        async with AsyncBatchedCollector(counting3, num_envs=2, policy_factory=where_and_when,
                                         frames_per_batch=4, total_frames=-1,
                                         server_backend="process") as collector:
            for _ in range(20):  # take batches: the server has room and serves
                await collector.__anext__()
            # ... unless two batches wait already (back-pressure holds the server, as it
            # must; with fast round trips that happens): take until there is room
            while collector._frames.full:
                await collector.__anext__()
            start = time.monotonic()
            time.sleep(3.0)  # a training step: the workers may only use up their credits
            end = time.monotonic()
            # Until each worker has a frame chosen after the hold: a worker's chunks come
            # in order, so every frame it stepped during the hold is in by then (the other
            # worker's later frames may come first).
            frames, late = [], set()
            while late != {0, 1}:
                frames.append(batch := await collector.__anext__())
                late.update(batch["collector", "worker_id"][batch["t"] >= end].tolist())
    chosen = torch.cat(frames, 0)["t"]
    # the server's clock is the test's (CLOCK_MONOTONIC is one per machine), so the count
    # below means what it says
    assert bool(((chosen > opened) & (chosen < time.monotonic())).all())
    during = int(((chosen > start) & (chosen < end)).sum())
    # per worker (one env): its credits (2 chunks of chunk_steps=2 steps), the chunk it
    # is filling, its request in flight; without credits, thousands. None is right too:
    # the workers may have spent their credits before the hold began (CI saw that once).
    assert collector.chunk_steps == 2
    assert 0 <= during <= 2 * (2 * 2 + 2 + 1), during


@pytest.mark.parametrize("server_backend", ["thread", "process"])
async def test_the_rings_bound_what_is_made_ahead_even_if_the_server_never_holds(
        server_backend, monkeypatch) -> None:
    # Back-pressure has two parts: the server stops answering ("hold", a message to the
    # inference process), and the trainer takes no chunk from the rings while its buffer
    # is full, so the workers stop once their slots are full. The second alone must
    # bound the frames: a late hold (a busy machine) once let 80 frames of 96 through.
    from asyncrl._inference.inference_loop import InferenceLoop
    from asyncrl._inference.process_server import ProcessPolicyServer

    loop_room, process_room = InferenceLoop.set_room, ProcessPolicyServer.set_room

    def never_hold(self, room: bool) -> None:
        if room:
            loop_room(self, room)

    async def never_hold_process(self, room: bool, *, wait: bool = False) -> None:
        if room:
            await process_room(self, room, wait=wait)

    monkeypatch.setattr(InferenceLoop, "set_room", never_hold)
    monkeypatch.setattr(ProcessPolicyServer, "set_room", never_hold_process)
    with anyio.fail_after(LIMIT):
        async with AsyncBatchedCollector(counting3, num_envs=2, policy=ValuePolicy(1.0),
                                         frames_per_batch=8, total_frames=-1,
                                         server_backend=server_backend) as collector:
            await collector.__anext__()
            await anyio.sleep(1.5)  # the trainer's loop is free, and it takes no batch
            buffered, capacity = collector._frames.buffered, collector._frames.capacity
            made = sum(c.frames for c in collector._frames.counts.values())
            chunk = collector.chunk_steps  # one env per worker
            assert collector._frames.full
            await collector.__anext__()  # taking a batch takes what waits in the rings
            with anyio.fail_after(10):
                while sum(c.frames for c in collector._frames.counts.values()) <= made:
                    await anyio.sleep(0.01)
    # at most one chunk past the buffer's capacity (the take that filled it); without the
    # rule, a never-holding server fills the buffer as fast as the envs step (thousands)
    assert capacity <= buffered <= capacity + chunk, (buffered, capacity)
