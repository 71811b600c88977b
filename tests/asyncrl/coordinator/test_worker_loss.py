"""Local workers that die, freeze or never start: ``on_worker_loss`` and spawning.

Each test kills (SIGKILL), freezes (SIGSTOP/SIGCONT) or breaks a real worker
process and checks what the trainer sees: an error naming the worker and its
exit status, or a run that completes with exactly ``total_frames``; and that no
process outlives the collector.

Processes and sockets behave the same under both anyio backends, and each test
spawns several processes: each runs on one backend, alternating, so that both
are covered and the suite stays short on a 2-core machine.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any

import anyio
import pytest
import torch

from asyncrl import MultiAsyncCollector, MultiSyncCollector, WorkerLostError
from asyncrl.testing import ParamPolicy
from tests.multihost.processes import alive

pytestmark = pytest.mark.anyio

LIMIT = 120  # generous: 2 shared cores, several process spawns per test
ENV = "CartPole-v1"
FAST = {"heartbeat_interval": 0.5, "peer_timeout": 3.0}


class ExitOnUnpickle:
    """Unpickling it calls ``sys.exit(1)``: a worker that dies before it could report."""

    def __reduce__(self) -> tuple[Any, tuple[int]]:
        return sys.exit, (1,)


async def run_to_the_end(collector: Any) -> list[int]:
    """Frames of every batch until ``total_frames``."""
    return [batch.numel() async for batch in collector]


async def wait_until(condition: Any, what: str) -> None:
    with anyio.fail_after(60):  # bounded; polling the collector's public state is fine
        while not condition():
            await anyio.sleep(0.05)


def pids_gone(pids: list[int]) -> bool:
    return bool(pids) and not any(alive(pid) for pid in pids)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_sigkill_under_raise_names_the_signal() -> None:
    with anyio.fail_after(LIMIT):
        async with MultiSyncCollector(ENV, num_workers=2, frames_per_batch=8,
                                      total_frames=800) as c:
            await c.__anext__()
            pids = c.worker_pids
            os.kill(pids[1], signal.SIGKILL)
            with pytest.raises(WorkerLostError, match=r"worker 1 .*SIGKILL \(exit code -9\)"):
                await run_to_the_end(c)
    assert pids_gone(pids)


@pytest.mark.parametrize(("anyio_backend", "collector_class"),
                         [("asyncio", MultiSyncCollector), ("trio", MultiAsyncCollector)])
async def test_sigkill_under_continue_delivers_exactly_total_frames(collector_class) -> None:
    with anyio.fail_after(LIMIT):
        async with collector_class(ENV, num_workers=2, frames_per_batch=8, total_frames=96,
                                   on_worker_loss="continue") as c:
            first = (await c.__anext__()).numel()
            pids = c.worker_pids
            os.kill(pids[1], signal.SIGKILL)
            frames = [first, *await run_to_the_end(c)]
            workers = c.statistics().workers
            assert [s.pid for s in workers if s.state != "lost"] == [pids[0]]
            assert [(s.pid, s.exit_code) for s in workers if s.state == "lost"] == [(pids[1], -9)]
    assert sum(frames) == 96  # sync: later rounds make up the shrunk ones, no overshoot
    assert pids_gone(pids)


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_sigkill_under_restart_respawns_the_slot() -> None:
    with anyio.fail_after(LIMIT):
        async with MultiSyncCollector(ENV, policy=ParamPolicy(), num_workers=2,
                                      frames_per_batch=8, total_frames=48,
                                      on_worker_loss="restart") as c:
            await c.__anext__()
            old = c.worker_pids
            os.kill(old[1], signal.SIGKILL)
            frames = await run_to_the_end(c)  # each round waits for the replacement's share
            new = c.worker_pids
            stats = c.statistics()
    assert frames == [8] * 5
    assert new[0] == old[0] and new[1] != old[1]
    assert [(s.index, s.pid) for s in stats.workers if s.state != "lost"] == [
        (0, new[0]), (1, new[1])]
    assert [(s.index, s.pid, s.exit_code) for s in stats.workers if s.state == "lost"] == [
        (1, old[1], -9)]
    assert pids_gone(old + new)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_restart_of_a_crash_looping_slot_is_bounded() -> None:
    with anyio.fail_after(LIMIT):
        async with MultiSyncCollector(ENV, num_workers=1, frames_per_batch=4,
                                      create_env_kwargs={"x": ExitOnUnpickle()},
                                      on_worker_loss="restart") as c:
            c.max_restarts = 1
            with pytest.raises(WorkerLostError, match=r"slot 0 died 2 times .*exited with code 1"):
                await c.__anext__()
            pids = [p.pid for p in c._run.workers.processes]  # type: ignore[union-attr]
    assert len(pids) == 2 and pids_gone(pids)


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_exit_before_reporting_raises_instead_of_hanging() -> None:
    with anyio.fail_after(LIMIT):
        async with MultiSyncCollector(ENV, num_workers=1, frames_per_batch=4,
                                      create_env_kwargs={"x": ExitOnUnpickle()}) as c:
            with pytest.raises(WorkerLostError) as info:
                await c.__anext__()
            assert c.worker_pids == []  # a dead process is not listed as a worker
    message = str(info.value)
    assert "worker 0 (pid" in message and "exited with code 1" in message
    assert "__main__" in message and "unpickled" in message


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_reported_error_wins_over_the_exit_code() -> None:
    # The worker reports, says goodbye and exits with 1: its process may be seen dead
    # before its report is read; the report (type, message) is what the trainer gets.
    from asyncrl.testing import failing_env_at_init

    with anyio.fail_after(LIMIT):
        async with MultiSyncCollector(failing_env_at_init, num_workers=1,
                                      frames_per_batch=4) as c:
            with pytest.raises(ValueError, match="cannot be built"):
                await c.__anext__()


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_wait_with_a_dead_local_worker_and_no_replacement_is_an_error() -> None:
    with anyio.fail_after(LIMIT):
        async with MultiSyncCollector(ENV, num_workers=2, frames_per_batch=8,
                                      total_frames=800, on_worker_loss="wait") as c:
            await c.__anext__()
            pids = c.worker_pids
            os.kill(pids[1], signal.SIGKILL)
            with pytest.raises(WorkerLostError, match=r"nothing can replace.*'restart'"):
                await run_to_the_end(c)
    assert pids_gone(pids)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_frozen_worker_is_readmitted_under_wait() -> None:
    with anyio.fail_after(LIMIT):
        async with MultiSyncCollector(ENV, num_workers=2, frames_per_batch=8, total_frames=40,
                                      on_worker_loss="wait", **FAST) as c:
            await c.__anext__()
            pids = c.worker_pids
            os.kill(pids[1], signal.SIGSTOP)
            try:
                await wait_until(lambda: [w.state for w in c.statistics().workers].count("lost")
                                 == 1, "worker 1 dropped")
            finally:
                os.kill(pids[1], signal.SIGCONT)
            frames = await run_to_the_end(c)  # worker 1 is told to rejoin, and does
            stats = c.statistics()
    assert frames == [8] * 4  # every round whole: it waited for worker 1's share
    # The dropped admission stays listed as lost; the same process was admitted again.
    assert sorted((s.index, s.pid, s.state == "lost") for s in stats.workers) == [
        (0, pids[0], False), (1, pids[1], False), (1, pids[1], True)]
    assert pids_gone(pids)


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_spawning_a_big_policy_keeps_the_event_loop_free() -> None:
    policy = ParamPolicy()
    # ~32 MB pickled (not in the state dict: only `value` is synced), far over the
    # 64 KB pipe buffer that made Process.start() wait for each child to read it.
    policy.register_buffer("ballast", torch.zeros(8_000_000), persistent=False)
    gaps = [0.0]

    async def ticker() -> None:
        last = time.monotonic()
        while True:
            await anyio.sleep(0.05)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    with anyio.fail_after(LIMIT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(ticker)
            async with MultiSyncCollector(ENV, policy=policy, num_workers=3,
                                          frames_per_batch=6, peer_timeout=10.0) as c:
                batch = await c.__anext__()
                pids = c.worker_pids
            tg.cancel_scope.cancel()
    assert batch.numel() == 6
    assert max(gaps) < 5.0, f"the event loop was blocked for {max(gaps):.1f} s"
    assert pids_gone(pids)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_frozen_worker_is_replaced_under_restart() -> None:
    with anyio.fail_after(LIMIT):
        async with MultiSyncCollector(ENV, num_workers=2, frames_per_batch=8, total_frames=40,
                                      on_worker_loss="restart", **FAST) as c:
            await c.__anext__()
            old = c.worker_pids
            os.kill(old[1], signal.SIGSTOP)  # silent for good: killed, its slot respawned
            frames = await run_to_the_end(c)
            new = c.worker_pids
    assert frames == [8] * 4
    assert new[0] == old[0] and new[1] != old[1]
    assert pids_gone(old + new)
