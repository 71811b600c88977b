"""Chaos: ``on_worker_loss="wait"`` with no replacement coming (issue #22, item 3).

A worker is frozen (SIGSTOP) and never resumed within ``replacement_timeout``:
the trainer says that it waits (a ``"waiting"`` event, a ``"waiting"`` line in
``statistics()``, a WARNING repeated at intervals) and then fails naming the slot,
instead of waiting for ever.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal

import anyio
import pytest

from asyncrl import MultiSyncCollector, WorkerLostError
from asyncrl.testing import ValuePolicy, identity_env

from .helpers import LIMIT, LIVENESS, train

pytestmark = [pytest.mark.anyio, pytest.mark.chaos]
REPLACEMENT_TIMEOUT = 4.0


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_wait_for_a_replacement_says_so_and_is_bounded(
        sandbox, caplog: pytest.LogCaptureFixture) -> None:
    frozen: list[int] = []
    seen: list[str] = []

    async def freeze_after_first(c, index: int) -> None:
        if index == 0:
            frozen.append(c.worker_pids[1])
            os.kill(frozen[0], signal.SIGSTOP)

    async def watch(c) -> None:
        async with c.events() as events:
            async for event in events:
                if event.kind == "waiting":
                    seen.append(event.reason)
                    states = [w.state for w in c.statistics().workers]
                    seen.append(",".join(states))

    caplog.set_level(logging.WARNING, logger="asyncrl.coordinator")
    try:
        with anyio.fail_after(LIMIT):
            c = MultiSyncCollector(identity_env, ValuePolicy(0.0), num_workers=2,
                                   frames_per_batch=20, total_frames=10_000,
                                   on_worker_loss="wait",
                                   replacement_timeout=REPLACEMENT_TIMEOUT, **LIVENESS)
            async with anyio.create_task_group() as tg:
                tg.start_soon(watch, c)
                async with c:
                    with pytest.raises(WorkerLostError) as caught:
                        await train(c, after_batch=freeze_after_first)
                tg.cancel_scope.cancel()
    finally:
        for pid in frozen:  # (killed by aclose() already, normally)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    await sandbox.assert_clean()
    message = str(caught.value)
    assert "worker 1 (" in message and f"pid {frozen[0]}" in message, message
    assert f"replacement_timeout={REPLACEMENT_TIMEOUT} s" in message, message
    assert len(seen) == 2 and "waiting for a replacement of worker 1" in seen[0], seen
    assert "waiting" in seen[1].split(","), seen
    repeated = [r for r in caplog.records if "waiting for a replacement" in r.getMessage()]
    assert len(repeated) >= 2, [r.getMessage() for r in caplog.records]
