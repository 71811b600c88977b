"""Chaos: a worker whose env's ``step()`` never returns (issue #22, item 2).

The process stays alive and its heartbeats go on: only ``sample_timeout`` (the
stall watchdog) tells the trainer that it owes a batch and delivers nothing.
The hang is keyed on an env kwarg of one worker (``IdentityEnv(hang_at_step=...)``),
and ``hang_once`` (a file in the sandbox) lets a respawned process step on.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from asyncrl import MultiAsyncCollector, MultiSyncCollector, WorkerLostError
from asyncrl.testing import ValuePolicy, identity_env

from .helpers import LIMIT, LIVENESS, assert_frames, pids_in, train

pytestmark = [pytest.mark.anyio, pytest.mark.chaos]
TOTAL = 240
HANG_AT = 35  # worker 1's 35th step: mid-batch, after it delivered at least once
SAMPLE_TIMEOUT = 2.0  # small: each scenario waits for it once (or a few times)


def collector(sync: bool, on_worker_loss: Any, sandbox: Any) -> Any:
    cls = MultiSyncCollector if sync else MultiAsyncCollector
    hang = {"hang_at_step": HANG_AT, "hang_once": str(sandbox.root / "hung")}
    return cls(identity_env, ValuePolicy(0.0), num_workers=2, frames_per_batch=20,
               total_frames=TOTAL, create_env_kwargs=[{}, hang],
               on_worker_loss=on_worker_loss, sample_timeout=SAMPLE_TIMEOUT, **LIVENESS)


@pytest.mark.parametrize(("anyio_backend", "sync"), [("asyncio", True), ("trio", False)])
async def test_a_hung_env_fails_the_run_naming_the_worker_and_the_cause(sandbox,
                                                                        sync: bool) -> None:
    with anyio.fail_after(LIMIT):
        async with collector(sync, "raise", sandbox) as c:
            hung = c.worker_pids[1]
            with pytest.raises(WorkerLostError) as caught:
                await train(c)
            lost = [w for w in c.statistics().workers if w.state == "lost"]
        await sandbox.assert_clean()
    message = str(caught.value)
    assert "worker 1 (" in message and f"pid {hung}" in message, message
    assert "the env step or the policy did not return" in message, message
    assert "delivered nothing for" in message and "sample_timeout" in message, message
    assert [w.pid for w in lost] == [hung]


@pytest.mark.parametrize(("anyio_backend", "sync"), [("trio", True), ("asyncio", False)])
async def test_a_hung_env_under_continue_the_healthy_worker_finishes_exactly(
        sandbox, sync: bool) -> None:
    """Async: the stuck worker's credit goes back to the budget: exactly TOTAL frames."""
    with anyio.fail_after(LIMIT):
        async with collector(sync, "continue", sandbox) as c:
            hung = c.worker_pids[1]
            batches, values = await train(c)
        await sandbox.assert_clean()
    assert_frames(batches, values, total_frames=TOTAL)
    late = pids_in(batches[-3:])
    assert hung not in late and len(late) == 1, late


@pytest.mark.parametrize(("anyio_backend", "sync"), [("asyncio", True), ("trio", False)])
async def test_a_hung_env_under_restart_is_killed_and_respawned(sandbox, sync: bool) -> None:
    with anyio.fail_after(LIMIT):
        async with collector(sync, "restart", sandbox) as c:
            hung = c.worker_pids[1]
            batches, values = await train(c)
            # The respawn was decided at the loss; on a loaded machine the healthy worker
            # may finish the run (async) before the new process is up: wait for it here.
            while len(c.worker_pids) < 2:
                await anyio.sleep(0.05)
            pids = list(c.worker_pids)
        await sandbox.assert_clean()
    assert_frames(batches, values, total_frames=TOTAL)
    assert len(pids) == 2 and hung not in pids, pids
    fresh = set(pids) - pids_in(batches[:2]) - {hung}
    if sync:  # each round waits for the respawned slot's share
        assert fresh and fresh <= pids_in(batches), (fresh, pids)
