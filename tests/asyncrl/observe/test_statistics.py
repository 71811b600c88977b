"""``collector.statistics()``: exact counts, every worker with its life cycle, exit codes.

The meters alone (episode returns across batches, rate, lag, the latency
histogram), the registry with the coordinator's worker records, then real
collectors in both modes on both backends: counts that add up, a SIGKILLed
worker listed as lost with exit code -9, ``wait_ready()`` and its timeout.
"""

from __future__ import annotations

import os
import signal

import anyio
import pytest
import torch
from tensordict import TensorDict

from asyncrl import (
    CollectorStatistics,
    MultiAsyncCollector,
    MultiSyncCollector,
    WorkerStatistics,
)
from asyncrl._coordinator.registry import WorkerRegistry
from asyncrl._coordinator.state import WorkerInfo
from asyncrl._observe.events import CollectorEvent
from asyncrl._observe.latency import LatencyHistogram
from asyncrl._observe.statistics import EpisodeReturns, RateMeter, policy_lag
from asyncrl.testing import CountingEnv, ParamPolicy, failing_env_at_init

pytestmark = pytest.mark.anyio

LIMIT = 120
FAST = {"heartbeat_interval": 0.5, "peer_timeout": 5.0}


def batch(traj: list[list[int]], reward: list[list[float]], done: list[list[bool]],
          versions: list[list[int]] | None = None) -> TensorDict:
    shape = [len(traj), len(traj[0])]
    td = TensorDict({
        ("collector", "traj_ids"): torch.tensor(traj),
        ("next", "reward"): torch.tensor(reward).unsqueeze(-1),
        ("next", "done"): torch.tensor(done).unsqueeze(-1),
    }, shape)
    if versions is not None:
        td["collector", "policy_version"] = torch.tensor(versions)
    return td


def test_episode_returns_span_batches() -> None:
    returns = EpisodeReturns(window=3)
    # env 0: episode 10 ends at t=1 (1+2), episode 11 runs on; env 1: episode 20 runs on.
    returns.add(batch([[10, 10, 11], [20, 20, 20]], [[1, 2, 4], [1, 1, 1]],
                      [[False, True, False], [False, False, False]]))
    assert (returns.episodes, list(returns.recent)) == (1, [3.0])
    returns.add(batch([[11, 12, 12], [20, 21, 21]], [[8, 1, 1], [1, 5, 5]],
                      [[True, False, False], [True, False, True]]))
    assert returns.episodes == 4
    # 11: 4 + 8 (across batches), 20: 3 + 1 (across batches), 21: 5 + 5; window 3 drops 3.
    assert list(returns.recent) == [12.0, 4.0, 10.0]
    assert returns.mean() == pytest.approx(26 / 3)
    returns.add(batch([[12]], [[7]], [[True]]))  # 12 carried over: 1 + 1, then 7
    assert (returns.episodes, returns.recent[-1]) == (5, 9.0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_episode_returns_of_a_batch_stored_on_cuda() -> None:
    returns = EpisodeReturns()  # device="cuda" collectors store their batches there
    returns.add(batch([[10, 10, 11]], [[1, 2, 4]], [[False, True, False]]).to("cuda"))
    assert (returns.episodes, list(returns.recent)) == (1, [3.0])


def test_policy_lag_is_newest_minus_oldest_version_in_the_batch() -> None:
    td = batch([[1, 1]], [[0, 0]], [[False, False]], versions=[[3, 5]])
    assert policy_lag(td, 5) == 2
    assert policy_lag(td, 3) == 0
    assert policy_lag(batch([[1]], [[0]], [[False]]), 7) == 0  # no version key


def test_rate_meter_counts_frames_over_its_window() -> None:
    now = [0.0]
    meter = RateMeter(window=10.0, clock=lambda: now[0])
    assert meter.rate() == 0.0
    for _ in range(5):
        meter.add(100)
        now[0] += 1.0
    now[0] -= 1.0
    assert meter.rate() == pytest.approx(400 / 4.0)  # the first sample opens the interval
    now[0] += 100.0
    assert meter.rate() == 0.0  # frames stopped: the gauge says so within a window
    meter.add(100)
    assert meter.rate() == pytest.approx(100 / 10.0)  # frames of the last window, over it
    now[0] += 5.0
    meter.add(50)
    assert meter.rate() == pytest.approx(150 / 10.0)
    now[0] += 9.0
    assert meter.rate() == pytest.approx(50 / 10.0)  # the first of the two left the window


def test_latency_histogram_is_cumulative() -> None:
    h = LatencyHistogram((0.1, 1.0))
    for seconds in (0.05, 0.1, 0.5, 3.0):
        h.observe(seconds)
    assert h.cumulative() == [(0.1, 2), (1.0, 3), (float("inf"), 4)]
    assert (h.count, h.sum, h.last) == (4, pytest.approx(3.65), 3.0)


def test_registry_keeps_lost_workers_with_their_exit_code() -> None:
    events: list[CollectorEvent] = []
    registry = WorkerRegistry(events.append)
    a = WorkerInfo(0, b"a", "worker-a", "h", 100)
    b = WorkerInfo(1, b"b", "worker-b", "h", 101)
    registry.joined(a)
    registry.joined(b)
    registry.joined(a)  # welcomed again: no new entry, no event
    a.credits = 1
    registry.delivered(a, 16, now=0.0)
    registry.exited(101, -9, "was killed by SIGKILL (exit code -9)")
    b.alive = False
    registry.check_lost()  # already lost: no second event
    lines = registry.statistics(joining=[(2, 102, "h"), (1, 101, "h")])
    assert [(w.index, w.pid, w.state, w.frames, w.exit_code) for w in lines] == [
        (0, 100, "collecting", 16, None), (1, 101, "lost", 0, -9), (2, 102, "joining", 0, None)]
    assert [(e.kind, e.worker, e.exit_code) for e in events] == [
        ("joined", 0, None), ("joined", 1, None), ("lost", 1, -9)]
    assert events[-1].reason == "was killed by SIGKILL (exit code -9)"


def test_registry_memory_is_bounded() -> None:
    registry = WorkerRegistry(max_lost=3)
    for i in range(10):
        info = WorkerInfo(i, bytes([i]), f"w{i}", "h", 1000 + i)
        registry.joined(info)
        registry.exited(1000 + i, 1)
    assert [r.info.index for r in registry.records()] == [7, 8, 9]


def test_worker_statistics_keeps_its_old_field_name() -> None:
    line = WorkerStatistics(0, "w", "h", 1, "idle", batches=3)
    assert line.delivered == 3


@pytest.mark.parametrize(("anyio_backend", "kind"),
                         [("asyncio", MultiSyncCollector), ("trio", MultiAsyncCollector),
                          ("trio", MultiSyncCollector), ("asyncio", MultiAsyncCollector)])
async def test_statistics_add_up_and_a_killed_worker_shows_as_lost(kind: type) -> None:
    with anyio.fail_after(LIMIT):
        async with kind(CountingEnv, ParamPolicy(), num_workers=2, frames_per_batch=16,
                        total_frames=-1, on_worker_loss="continue", **FAST) as c:
            assert c.statistics() == CollectorStatistics(
                workers=c.statistics().workers)  # nothing delivered yet
            await c.wait_ready(timeout=60)
            stats = c.statistics()
            assert sorted(w.pid for w in stats.workers) == sorted(c.worker_pids)
            assert all(w.state in ("collecting", "idle") for w in stats.workers)
            frames = 0
            for i in range(4):
                if i == 2:
                    await c.update_policy_weights()
                frames += (await c.__anext__()).numel()
            stats = c.statistics()
            assert (stats.frames, stats.batches, stats.policy_version) == (frames, 4, 1)
            assert sum(w.frames for w in stats.workers) == frames
            assert stats.frames_per_second > 0
            assert stats.episodes > 0 and stats.episode_return_mean == pytest.approx(5.0)
            if kind is MultiSyncCollector:
                assert stats.policy_lag == 0  # on-policy: collected after the update
            live = [w for w in stats.workers]
            assert all(w.heartbeat_age is not None and w.exit_code is None for w in live)
            assert all(w.last_batch_age is not None for w in live if w.frames)
            victim = c.worker_pids[1]
            os.kill(victim, signal.SIGKILL)
            with anyio.fail_after(60):
                while not any(w.state == "lost" for w in c.statistics().workers):
                    await c.__anext__()  # bounded: the loss is noticed while collecting
            workers = c.statistics().workers
            assert [(w.pid, w.state, w.exit_code, w.heartbeat_age, w.ahead)
                    for w in workers if w.pid == victim] == [(victim, "lost", -9, None, 0)]
            assert [w.state != "lost" for w in workers].count(True) == 1


async def test_wait_ready_times_out_naming_the_missing_workers() -> None:
    with anyio.fail_after(LIMIT):
        async with MultiAsyncCollector(CountingEnv, num_workers=0, remote_workers=1,
                                       listen="tcp://127.0.0.1:0", frames_per_batch=8) as c:
            with pytest.raises(TimeoutError, match=r"0 of 1 workers joined within 0.3 s"):
                await c.wait_ready(timeout=0.3)
            assert c.statistics().workers == ()


async def test_wait_ready_raises_the_runs_error() -> None:
    with anyio.fail_after(LIMIT):
        async with MultiSyncCollector(failing_env_at_init, num_workers=1,
                                      frames_per_batch=10) as c:
            with pytest.raises(ValueError, match="cannot be built"):
                await c.wait_ready(timeout=60)
