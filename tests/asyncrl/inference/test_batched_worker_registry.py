"""AsyncBatchedCollector's env workers in ``statistics().workers`` and ``events()``.

Every env worker, local or remote, is a record of the registry a MultiCollector keeps:
the rows and events a MultiSyncCollector's user reads, with the same fields, an env
worker named by its slot (index ``SLOT``, name ``env-SLOT``: the ``worker_id`` of its
frames). Each test asserts whole rows and whole events (their ages and times aside).
"""

from __future__ import annotations

import os
import signal
import socket
from dataclasses import replace
from typing import Any

import anyio
import pytest

from asyncrl import AsyncBatchedCollector, WorkerLostError, WorkerStatistics
from asyncrl._observe.events import CollectorEvent
from asyncrl.testing import CountingEnv, ValuePolicy
from tests.asyncrl.inference.test_batched_remote_env_hosts import hello, start_env_host, wait_exit
from transports import Link

pytestmark = pytest.mark.anyio
LIMIT = 120
HOST = socket.gethostname()


def without_ages(rows: Any) -> list[WorkerStatistics]:
    return [replace(r, last_batch_age=None, heartbeat_age=None) for r in rows]


def untimed(events: list[CollectorEvent]) -> list[CollectorEvent]:
    return [replace(e, time=0.0) for e in events]


async def rows_when(collector: Any, ready: Any) -> tuple[WorkerStatistics, ...]:
    """``statistics().workers`` once ``ready(rows)``, taking batches meanwhile (the env
    workers wait once the buffer is full); bounded by the test's fail_after."""
    while not ready(rows := collector.statistics().workers):
        await collector.__anext__()
    return rows


async def test_a_local_env_worker_is_a_row_and_its_join_an_event() -> None:
    collector = AsyncBatchedCollector(CountingEnv, num_envs=1, policy=ValuePolicy(1.0),
                                      frames_per_batch=8)
    events = collector.events()
    with anyio.fail_after(LIMIT):
        async with collector:
            [pid] = collector.worker_pids
            [row] = await rows_when(collector, lambda rows: rows and rows[0].batches >= 2)
            steps = collector.chunk_steps
            assert without_ages([row]) == [WorkerStatistics(
                index=0, name="env-0", host=HOST, pid=pid, state="collecting",
                frames=row.batches * steps, batches=row.batches)]
            assert row.last_batch_age is not None and row.heartbeat_age is not None
        seen = [e async for e in events]  # (ends once the collector closed)
    assert untimed(seen) == [CollectorEvent("joined", worker=0, name="env-0", host=HOST,
                                            pid=pid, time=0.0)]  # its stop is no loss
    [closed] = collector.statistics().workers  # stopped by the close: lost, its exit code
    assert (closed.index, closed.pid, closed.state, closed.heartbeat_age) == (
        0, pid, "lost", None) and closed.exit_code is not None


async def test_a_remote_env_worker_is_a_row_and_its_join_refusal_and_loss_events() -> None:
    collector = AsyncBatchedCollector(CountingEnv, num_envs=1, policy=ValuePolicy(1.0),
                                      frames_per_batch=8, listen="tcp://127.0.0.1:0",
                                      remote_workers=1)
    events = collector.events()
    with anyio.fail_after(LIMIT):
        async with collector:
            [local] = collector.worker_pids
            await rows_when(collector, lambda rows: rows and rows[0].batches)  # joined first
            async with Link(collector.endpoint, identity=b"wrong-spec",
                            heartbeat_interval=0.5) as wrong:
                await wrong.send(hello([3]), kind="hello")
                refusal = (await wrong.recv()).body["reason"]
            host = start_env_host(collector.endpoint, 2, "asyncio")
            try:
                rows = await rows_when(collector, lambda rows: len(rows) == 2 and all(
                    r.batches for r in rows))
                steps = collector.chunk_steps
                assert without_ages(rows) == [
                    WorkerStatistics(index=0, name="env-0", host=HOST, pid=local,
                                     state="collecting", frames=rows[0].batches * steps,
                                     batches=rows[0].batches),
                    WorkerStatistics(index=1, name="env-1", host=HOST, pid=host.pid,
                                     state="collecting", frames=rows[1].batches * 2 * steps,
                                     batches=rows[1].batches)]  # its 2 envs per chunk
                assert all(r.last_batch_age is not None and r.heartbeat_age is not None
                           for r in rows)
                host.kill()  # a loss: its connection closes at once
                gone = await rows_when(collector, lambda rows: rows[1].state == "lost")
                assert without_ages(gone)[1] == replace(without_ages(rows)[1], state="lost",
                                                        frames=gone[1].frames,
                                                        batches=gone[1].batches)
                assert gone[1].heartbeat_age is None
                assert gone[1].frames == gone[1].batches * 2 * steps >= rows[1].frames
            finally:
                host.kill()
                await wait_exit(host)
        seen = [e async for e in events]
    assert untimed(seen) == [
        CollectorEvent("joined", worker=0, name="env-0", host=HOST, pid=local, time=0.0),
        CollectorEvent("refused", name="test", host="test-host", pid=1, reason=refusal,
                       time=0.0),
        CollectorEvent("joined", worker=1, name="env-1", host=HOST, pid=host.pid, time=0.0),
        CollectorEvent("lost", worker=1, name="env-1", host=HOST, pid=host.pid,
                       reason="lost: its connection closed (its process died)", time=0.0)]


async def test_an_env_worker_that_dies_shows_lost_with_its_exit_code() -> None:
    collector = AsyncBatchedCollector(CountingEnv, num_envs=2, policy=ValuePolicy(1.0),
                                      frames_per_batch=8)
    events = collector.events()
    with anyio.fail_after(LIMIT):
        async with collector:
            pids = collector.worker_pids
            await collector.__anext__()
            # Worker 0's frames can make the first batch before worker 1 has said hello
            # (a loaded machine): kill worker 1 once it is admitted (a process still
            # joining has a "joining" row of its own, gone with its process).
            while [r.state for r in collector.statistics().workers] != ["collecting"] * 2:
                await anyio.sleep(0.01)
            os.kill(pids[1], signal.SIGKILL)
            with pytest.raises(WorkerLostError, match=r"env worker 1 .*SIGKILL"):
                for _ in range(10_000):
                    await collector.__anext__()
            rows = collector.statistics().workers
            assert [(r.index, r.name, r.pid, r.state, r.exit_code) for r in rows] == [
                (0, "env-0", pids[0], "collecting", None), (1, "env-1", pids[1], "lost", -9)]
            assert rows[1].heartbeat_age is None
        seen = [e async for e in events]
    assert untimed([e for e in seen if e.kind != "joined"]) == [CollectorEvent(
        "lost", worker=1, name="env-1", host=HOST, pid=pids[1],
        reason="was killed by SIGKILL (exit code -9)", exit_code=-9, time=0.0)]
    assert sorted((e.worker, e.pid) for e in seen if e.kind == "joined") == [
        (0, pids[0]), (1, pids[1])]
