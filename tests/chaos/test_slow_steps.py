"""Chaos: a slow env that steps is never lost; a hung one is (issue #35, item 2).

``sample_timeout`` bounds the time a worker owes a batch *without a step*, not
the time a batch takes: its worker reports its step count while it collects, and
the stall watchdog counts from its last step. Here every step sleeps 0.3 s, so a
share of 8 steps takes 2.4 s, well above ``sample_timeout=1.5``.
"""

from __future__ import annotations

import logging
import re
import time
from typing import Any

import anyio
import pytest

from asyncrl import MultiAsyncCollector, MultiSyncCollector, WorkerLostError
from asyncrl.testing import IdentityEnv, ValuePolicy

from .helpers import LIMIT, LIVENESS, assert_frames, train

pytestmark = [pytest.mark.anyio, pytest.mark.chaos]
STEP_SECONDS = 0.3
SHARE = 8  # steps per share (one env per worker): 2.4 s per batch
SAMPLE_TIMEOUT = 1.5
MODES = [("asyncio", True), ("trio", False)]


class SlowIdentityEnv(IdentityEnv):
    """An :class:`IdentityEnv` whose every ``step()`` takes ``step_seconds``."""

    def __init__(self, step_seconds: float = STEP_SECONDS, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.step_seconds = step_seconds

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        time.sleep(self.step_seconds)
        return super().step(action)


def slow_identity_env(**kwargs: Any) -> SlowIdentityEnv:
    return SlowIdentityEnv(**kwargs)


def collector(sync: bool, on_worker_loss: Any, *, total: int = 2 * SHARE,
              **kwargs: Any) -> Any:
    cls = MultiSyncCollector if sync else MultiAsyncCollector
    return cls(slow_identity_env, ValuePolicy(0.0), num_workers=1, frames_per_batch=SHARE,
               total_frames=total, on_worker_loss=on_worker_loss,
               sample_timeout=SAMPLE_TIMEOUT, **LIVENESS, **kwargs)


def slow_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno >= logging.WARNING and "sample_timeout" in r.getMessage()]


@pytest.mark.parametrize(("anyio_backend", "sync"), MODES)
async def test_a_slow_env_that_steps_is_not_lost_and_is_named_once(
        sandbox, caplog: pytest.LogCaptureFixture, sync: bool) -> None:
    caplog.set_level(logging.WARNING)
    with anyio.fail_after(LIMIT):
        async with collector(sync, "raise") as c:
            batches, values = await train(c)
        await sandbox.assert_clean()
    assert_frames(batches, values, total_frames=2 * SHARE)
    warnings = slow_warnings(caplog)
    assert len(warnings) == 1, warnings
    assert re.search(r"took \d+\.\d s per batch", warnings[0]), warnings[0]
    assert f"sample_timeout={SAMPLE_TIMEOUT}" in warnings[0], warnings[0]


@pytest.mark.parametrize(("anyio_backend", "sync"), [("trio", True), ("asyncio", False)])
async def test_a_slow_env_under_restart_is_never_killed(sandbox, sync: bool) -> None:
    with anyio.fail_after(LIMIT):
        async with collector(sync, "restart") as c:
            first = list(c.worker_pids)
            batches, values = await train(c)
            assert list(c.worker_pids) == first
        await sandbox.assert_clean()
    assert_frames(batches, values, total_frames=2 * SHARE)


@pytest.mark.parametrize(("anyio_backend", "sync"), MODES)
async def test_a_slow_env_that_hangs_is_lost_naming_the_hang(sandbox, sync: bool) -> None:
    """Three steps of 0.3 s, then a step that never returns: lost after ~sample_timeout."""
    with anyio.fail_after(LIMIT):
        async with collector(sync, "raise", create_env_kwargs={"hang_at_step": 4}) as c:
            with pytest.raises(WorkerLostError) as caught:
                await train(c)
        await sandbox.assert_clean()
    message = str(caught.value)
    assert "the env step or the policy did not return" in message, message
    assert "sample_timeout" in message, message
    no_step = re.search(r"no step for (\d+\.\d) s", message)
    assert no_step is not None, message
    assert SAMPLE_TIMEOUT <= float(no_step.group(1)) < SAMPLE_TIMEOUT + 5, message


@pytest.mark.parametrize(("anyio_backend", "sync"), [("trio", True)])
async def test_a_slot_that_keeps_hanging_under_restart_names_sample_timeout(
        sandbox, sync: bool) -> None:
    """Each respawn hangs again: the crash-loop error blames the watchdog, not OOM."""
    with anyio.fail_after(LIMIT):
        c = collector(sync, "restart", create_env_kwargs={"hang_at_step": 2})
        c.max_restarts = 1
        async with c:
            with pytest.raises(WorkerLostError) as caught:
                await train(c)
        await sandbox.assert_clean()
    message = str(caught.value)
    assert "sample_timeout" in message, message
    assert "OOM" not in message, message
