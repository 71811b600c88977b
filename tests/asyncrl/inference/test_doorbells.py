"""AsyncBatchedCollector's local path (issue #25): doorbells, not a ZeroMQ message per step.

Local env workers ask through shared-memory sequence numbers and eventfds
(``asyncrl._inference.doorbell``); the loop serves from a thread in both server
backends. What must not change: versions stamped per frame, weight updates
between two calls, pause, failures as documented.
"""

from __future__ import annotations

import functools
import os
import signal
import threading
import time

import anyio
import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch import nn

from asyncrl import AsyncBatchedCollector, WorkerLostError
from asyncrl._inference.doorbell import (
    DEFAULT_SPIN,
    EventFd,
    no_wakeup_preemption,
    spin_for,
    spin_then_block,
    usable_cores,
)
from asyncrl._inference.thread_server import ThreadPolicyServer
from asyncrl._spawn.forkserver import worker_context
from asyncrl.testing import CountingEnv, ValuePolicy, fill_parameters, version_problems
from tests.asyncrl.counting_frames import check_counting_frames
from tests.asyncrl.inference.test_batched_inference_process import FailsAtStep2

pytestmark = pytest.mark.anyio
LIMIT = 90
counting3 = functools.partial(CountingEnv, length=3)
BACKENDS = ["thread", "process"]


def endless_two_envs(server_backend: str) -> AsyncBatchedCollector:
    """Two one-env workers, batches of 4 frames for ever, the action 1.0."""
    return AsyncBatchedCollector(counting3, num_envs=2, policy=ValuePolicy(1.0),
                                 frames_per_batch=4, total_frames=-1,
                                 server_backend=server_backend)


def _echo(request: EventFd, answer: EventFd) -> None:
    for _ in range(3):
        request.wait()
        answer.ring()


@pytest.mark.parametrize("start_method", ["forkserver", "spawn"])
def test_an_eventfd_reaches_a_child_by_either_start_method(start_method) -> None:
    request, answer = EventFd(), EventFd()
    process = worker_context(start_method).Process(target=_echo, args=(request, answer))
    process.start()
    try:
        for _ in range(3):
            request.ring()
            assert answer.wait(timeout=60), "the child never rang back"
        process.join(30)
        assert process.exitcode == 0
    finally:
        if process.is_alive():
            process.kill()
        request.close()
        answer.close()


def test_a_wait_ends_when_ready_when_stopped_or_at_its_deadline() -> None:
    bell = EventFd()
    word = [0]
    stop = threading.Event()

    def later() -> None:
        time.sleep(0.05)
        word[0] = 1
        bell.ring()

    threading.Thread(target=later).start()
    assert spin_then_block(lambda: word[0] == 1, bell, spin=1e-5, stopped=stop.is_set)
    threading.Timer(0.05, lambda: (stop.set(), bell.ring())).start()
    assert not spin_then_block(lambda: False, bell, spin=0.0, stopped=stop.is_set)
    start = time.monotonic()
    assert not spin_then_block(lambda: False, bell, spin=0.0, stopped=lambda: False,
                               deadline=time.monotonic() + 0.05)
    assert time.monotonic() - start < 5
    bell.close()


def test_waiters_spin_only_while_each_can_own_a_core() -> None:
    assert spin_for(2, cores=2) == DEFAULT_SPIN  # 1 env worker and the loop on 2 cores
    assert spin_for(3, cores=2) == 0.0  # 2 env workers and the loop: a spinner steals a core
    assert spin_for(15, cores=16) == DEFAULT_SPIN
    assert spin_for(1) == DEFAULT_SPIN  # this process's affinity, at least one core
    assert spin_for(usable_cores() + 1) == 0.0


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="SCHED_BATCH is Linux's")
def test_no_wakeup_preemption_changes_the_calling_thread_only() -> None:
    seen: list[tuple[bool, int]] = []

    def stepping() -> None:
        seen.append((no_wakeup_preemption(), os.sched_getscheduler(0)))

    thread = threading.Thread(target=stepping)
    thread.start()
    thread.join(30)
    assert seen == [(True, os.SCHED_BATCH)]
    assert os.sched_getscheduler(0) == os.SCHED_OTHER  # this (the main) thread is untouched


def _thread_policies(pid: int) -> list[int]:
    """The scheduling policy of each thread of ``pid`` (field 41 of /proc/PID/task/TID/stat)."""
    policies = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                stat = f.read()
        except FileNotFoundError:  # a thread that ended meanwhile
            continue
        policies.append(int(stat.rsplit(")", 1)[1].split()[38]))
    return policies


@pytest.mark.skipif(not os.path.isdir("/proc/self/task") or not hasattr(os, "SCHED_BATCH"),
                    reason="reads Linux's /proc for the threads' scheduling policy")
@pytest.mark.parametrize("server_backend", BACKENDS)
async def test_env_workers_step_in_a_batch_thread_and_spin_by_the_core_rule(
        server_backend) -> None:
    with anyio.fail_after(LIMIT):
        async with endless_two_envs(server_backend) as collector:
            await collector.__anext__()
            for pid in collector.worker_pids:
                policies = _thread_policies(pid)
                while os.SCHED_BATCH not in policies:  # its stepping thread may start later
                    await collector.__anext__()
                    policies = _thread_policies(pid)
                # the stepping thread only: the event loop (the trainer's link) keeps the default
                assert policies.count(os.SCHED_BATCH) == 1, policies
                assert os.SCHED_OTHER in policies, policies
            assert collector._spin == spin_for(3)  # 2 env workers and the loop
            if isinstance(collector._server, ThreadPolicyServer):
                assert collector._server.loop.spin == collector._spin


async def test_a_policy_error_in_the_inference_thread_stops_the_run_with_that_error() -> None:
    with anyio.fail_after(LIMIT):
        async with AsyncBatchedCollector(counting3, num_envs=2, policy=FailsAtStep2(),
                                         frames_per_batch=4, total_frames=-1) as collector:
            with pytest.raises(RuntimeError, match="policy blew up at step 2") as info:
                async for _ in collector:
                    pass
    assert "inference thread" in "\n".join(getattr(info.value, "__notes__", []))


@pytest.mark.parametrize("server_backend", BACKENDS)
async def test_an_env_worker_killed_while_it_waits_for_its_answer_is_reported(
        server_backend) -> None:
    with anyio.fail_after(LIMIT):
        async with endless_two_envs(server_backend) as collector:
            await collector.__anext__()
            await collector.pause()  # every env worker now sleeps on its answer bell
            await anyio.sleep(0.2)
            os.kill(collector.worker_pids[0], signal.SIGKILL)
            await collector.resume()
            with pytest.raises(WorkerLostError, match=r"env worker 0 .*SIGKILL"):
                for _ in range(10_000):
                    await collector.__anext__()


async def collect_updating(**kwargs) -> tuple[list[TensorDict], dict[int, float | None],
                                                dict[int, int]]:
    """Collect counting3 frames, a new version of ValuePolicy after every batch.

    Returns the batches, each version's value, and the calls per batch size.
    """
    policy = ValuePolicy(0.0)
    values: dict[int, float | None] = {0: 0.0}
    batches = []
    with anyio.fail_after(LIMIT):
        async with AsyncBatchedCollector(counting3, policy=policy, **kwargs) as collector:
            async for batch in collector:
                batches.append(batch)
                version = collector.policy_version + 1
                fill_parameters(policy, float(version))
                values[version] = float(version)
                await collector.update_policy_weights()
                assert collector.policy_version == version
            await anyio.sleep(0.5)  # the inference process reports every 0.2 s
            sizes = collector.inference_statistics().batch_sizes
    assert version_problems(batches, values) == []
    return batches, values, sizes


@pytest.mark.parametrize("server_backend", BACKENDS)
async def test_versions_are_exact_per_frame_with_requests_of_several_envs(
        server_backend) -> None:
    batches, _, _ = await collect_updating(num_envs=6, envs_per_worker=2, frames_per_batch=12,
                                           total_frames=144, server_backend=server_backend)
    frames = torch.cat(batches, 0)
    assert len(set(frames["collector", "policy_version"].tolist())) >= 3
    check_counting_frames(frames, length=3, action=None)


class Slow(nn.Module):
    """Action 1, after 50 ms: the other workers' requests wait while a call runs."""

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        time.sleep(0.05)
        return torch.ones(observation.shape[:-1], dtype=torch.int64)


def slow_policy() -> TensorDictModule:
    return TensorDictModule(Slow(), in_keys=["observation"], out_keys=["action"])


@pytest.mark.parametrize("server_backend", BACKENDS)
async def test_one_call_gathers_every_request_that_is_ready(server_backend) -> None:
    with anyio.fail_after(LIMIT):
        async with AsyncBatchedCollector(counting3, num_envs=4, policy_factory=slow_policy,
                                         frames_per_batch=8, total_frames=96,
                                         server_backend=server_backend) as collector:
            frames = torch.cat([b async for b in collector], 0)
            await anyio.sleep(0.5)  # the process reports every 0.2 s
            sizes = collector.inference_statistics().batch_sizes
    check_counting_frames(frames, length=3, action=1)
    # one env per worker: calls served several workers' requests at once, up to all four
    # (how often depends on the machine's load: not asserted)
    assert max(sizes) == 4, sizes


@pytest.mark.parametrize("server_backend", ["thread", "process"])
async def test_neither_a_step_nor_a_chunk_sends_a_message(server_backend) -> None:
    with anyio.fail_after(LIMIT):
        async with AsyncBatchedCollector(counting3, num_envs=2,
                                         policy_factory=functools.partial(ValuePolicy, 1.0),
                                         frames_per_batch=64, total_frames=640,
                                         transition_chunk_size=16, heartbeat_interval=60.0,
                                         peer_timeout=120.0,
                                         server_backend=server_backend) as collector:
            batches = [b async for b in collector]
            assert collector._hub is not None
            received = collector._hub.statistics().messages_received
            chunks = sum(c.chunks for c in collector._frames.counts.values())
    # 640 frames in chunks of 16 steps: 40 chunks or more, all through the workers' rings;
    # the hub heard only the workers' (and the inference process's) joining messages. A
    # message per chunk would be 40 or more, a message per step 640 or more.
    assert sum(b.numel() for b in batches) == 640 and chunks >= 40
    assert received < 10, received
