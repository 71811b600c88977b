"""AsyncBatchedCollector.pause(): nothing handed over, no policy call, nothing lost."""

from __future__ import annotations

import functools
import time

import anyio
import pytest
import torch

from asyncrl import AsyncBatchedCollector
from asyncrl.testing import CountingEnv
from tests.asyncrl.counting_frames import check_counting_frames
from tests.asyncrl.test_batched_inference_process import where_and_when

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
