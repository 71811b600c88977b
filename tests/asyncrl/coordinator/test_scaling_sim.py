"""64 simulated workers through the real Hub and Coordinator: exact accounting, both backends.

The workers are in-process anyio tasks with their own ``transports.Link``
(``asyncrl._worker.simulated.sim_worker``); everything on the coordinator side is
the real thing. No assertion here is about speed.
"""

from __future__ import annotations

import uuid

import anyio
import pytest

from asyncrl._coordinator.coordinator import Coordinator, check_specs
from asyncrl._worker.simulated import SimRecord, sim_worker
from asyncrl.collectors._assemble import assemble
from tests.asyncrl.coordinator.rules import rules
from transports import Hub

WORKERS = 64
FRAMES = 8


async def _start_workers(tg: anyio.abc.TaskGroup, endpoint: str) -> list[SimRecord]:
    records = []
    for i in range(WORKERS):
        record = SimRecord(f"sim-{i}")
        await tg.start(_worker, endpoint, record)
        records.append(record)
    return records


async def _worker(endpoint: str, record: SimRecord, *,
                  task_status: anyio.abc.TaskStatus[SimRecord]) -> None:
    await sim_worker(endpoint, record.name, frames=FRAMES, record=record,
                     task_status=task_status)


def _scheduler(hub: Hub, *, sync: bool, prefetch: int = 1) -> Coordinator:
    return Coordinator(hub, *rules(sync=sync, share_frames=[FRAMES] * WORKERS,
                                   prefetch=prefetch, check_specs=check_specs,
                                   accept_remote=True))


@pytest.mark.anyio
async def test_sync_rounds_hold_one_share_per_worker() -> None:
    rounds = 4
    with anyio.fail_after(60):
        async with Hub(f"inproc://scaling-sync-{uuid.uuid4().hex}") as hub:
            scheduler = _scheduler(hub, sync=True)
            async with anyio.create_task_group() as tg:
                tg.start_soon(scheduler.run)
                records = await _start_workers(tg, hub.endpoint)
                await scheduler.wait_for_workers(WORKERS)
                admitted = {w.index for w in scheduler.roster.live_workers}
                assert len(admitted) == WORKERS
                for r in range(rounds):
                    shares = await scheduler.next_round()
                    indices = [w.index for w, _ in shares]
                    assert sorted(indices) == sorted(admitted)  # one share per worker
                    for worker, frames in shares:
                        assert frames.shape == (1, FRAMES)
                        ids = frames["collector", "worker_id"]
                        assert bool((ids == worker.index).all())
                        assert bool((frames["collector", "traj_ids"] == r).all())
                    batch = assemble([f for _, f in shares], "stack")  # TorchRL's default
                    assert batch.shape == (WORKERS, FRAMES)
                    assert batch.numel() == WORKERS * FRAMES
                tg.cancel_scope.cancel()
    for record in records:
        assert record.index in admitted
        assert record.sent == record.granted == rounds  # nothing lost, nothing extra
        assert record.max_outstanding == 1
        assert len(set(record.requests)) == rounds  # one share per round request


@pytest.mark.anyio
async def test_async_batches_respect_credits() -> None:
    prefetch, batches = 2, 300
    seen: dict[int, list[int]] = {}
    with anyio.fail_after(60):
        async with Hub(f"inproc://scaling-async-{uuid.uuid4().hex}") as hub:
            scheduler = _scheduler(hub, sync=False, prefetch=prefetch)
            async with anyio.create_task_group() as tg:
                tg.start_soon(scheduler.run)
                records = await _start_workers(tg, hub.endpoint)
                await scheduler.wait_for_workers(WORKERS)
                admitted = {w.index for w in scheduler.roster.live_workers}
                for _ in range(batches):
                    worker, frames = await scheduler.next_batch()
                    assert worker.index in admitted
                    assert frames.shape == (1, FRAMES)
                    assert bool((frames["collector", "worker_id"] == worker.index).all())
                    seq = int(frames["collector", "traj_ids"][0, 0])
                    seen.setdefault(worker.index, []).append(seq)
                    assert all(w.credits <= prefetch for w in scheduler.roster.workers.values())
                tg.cancel_scope.cancel()
    assert sum(len(s) for s in seen.values()) == batches
    for seqs in seen.values():
        assert seqs == sorted(set(seqs))  # in order, no duplicate
    for record in records:
        assert record.max_outstanding <= prefetch
        # Sent = consumed + still queued or in flight, bounded by the credits.
        assert len(seen.get(record.index, [])) <= record.sent <= record.granted
        assert record.granted <= len(seen.get(record.index, [])) + prefetch
