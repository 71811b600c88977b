"""AsyncBatchedCollector operated: pause() stops the loop, statistics() lists the env workers."""

from __future__ import annotations

import functools
import time

import anyio
import pytest
import torch

from asyncrl import AsyncBatchedCollector
from asyncrl.testing import CountingEnv
from tests.asyncrl.counting_frames import check_counting_frames
from tests.asyncrl.inference.test_batched_inference_process import where_and_when

pytestmark = pytest.mark.anyio
LIMIT = 90
counting3 = functools.partial(CountingEnv, length=3)


@pytest.mark.parametrize("server_backend", ["thread", "process"])
async def test_a_paused_collector_serves_and_hands_over_nothing_then_goes_on(
        server_backend) -> None:
    frames = []
    with anyio.fail_after(LIMIT):
        # Big batches: the buffer's back-pressure (two batches) would let ~256 more
        # frames be collected; a pause must stop the server at once.
        async with AsyncBatchedCollector(counting3, num_envs=2, policy_factory=where_and_when,
                                         frames_per_batch=128, total_frames=-1,
                                         server_backend=server_backend) as collector:
            frames.append(await collector.__anext__())
            await collector.pause()
            paused_at = time.monotonic()
            assert collector.paused and collector.statistics().paused
            with anyio.move_on_after(2.0) as waited:
                await collector.__anext__()
            assert waited.cancelled_caught  # no batch while paused
            resumed_at = time.monotonic()
            await collector.resume()
            while frames[-1]["t"].max() < resumed_at:  # until frames chosen after it
                frames.append(await collector.__anext__())
    everything = torch.cat(frames, 0)
    while_paused = int(((everything["t"] > paused_at) & (everything["t"] < resumed_at)).sum())
    # at most the calls already under way when pause() returned: one per env worker
    assert while_paused <= 2, while_paused
    # what was collected around the pause is whole: every trajectory in order
    check_counting_frames(everything, length=3, action=1)


async def test_statistics_list_each_env_worker_with_what_it_sent() -> None:
    with anyio.fail_after(LIMIT):
        async with AsyncBatchedCollector(counting3, num_envs=4, envs_per_worker=2,
                                         policy_factory=where_and_when, frames_per_batch=8,
                                         total_frames=-1) as collector:
            taken = 0
            while True:
                taken += (await collector.__anext__()).numel()
                stats = collector.statistics()
                # collecting from its admission; every one has sent a chunk:
                if all(w.state == "collecting" and w.batches for w in stats.workers):
                    break
            assert [w.index for w in stats.workers] == [0, 1]
            assert [w.pid for w in stats.workers] == collector.worker_pids
            assert [w.name for w in stats.workers] == ["env-0", "env-1"]
            sent = sum(w.frames for w in stats.workers)
            assert sent >= taken == stats.frames  # sent: handed over, or still held
            for w in stats.workers:
                assert w.frames == w.batches * 2 * collector.chunk_steps  # whole chunks
                assert w.last_batch_age is not None and w.heartbeat_age is not None
                assert w.exit_code is None
            pids = collector.worker_pids
    # after close: every process ended, and says so
    final = collector.statistics().workers
    assert [w.state for w in final] == ["lost", "lost"] and [w.pid for w in final] == pids
    assert all(w.exit_code is not None for w in final)
