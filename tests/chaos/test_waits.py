"""Chaos: waits for workers that never come are said, and bounded.

A worker is frozen (SIGSTOP) and never resumed within ``replacement_timeout``
(``on_worker_loss="wait"``, issue #22, item 3), or no host ever takes a
``remote_workers`` place within ``startup_timeout`` (issue #35, item 5): the
trainer says that it waits (a ``"waiting"`` event, ``statistics()`` saying
``"waiting"``, a WARNING repeated at intervals) and then fails naming what it
waited for, instead of waiting for ever.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal

import anyio
import pytest

from asyncrl import CollectorError, MultiSyncCollector, WorkerLostError
from asyncrl.testing import ValuePolicy, identity_env

from .helpers import LIMIT, LIVENESS, cli_host, train, wait_for

pytestmark = [pytest.mark.anyio, pytest.mark.chaos]
REPLACEMENT_TIMEOUT = 4.0
STARTUP_TIMEOUT = 3.0


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


def waiting_for_a_host(**options: object) -> MultiSyncCollector:
    return MultiSyncCollector(identity_env, ValuePolicy(0.0), num_workers=0, remote_workers=1,
                              listen="tcp://127.0.0.1:0", frames_per_batch=10,
                              total_frames=100, startup_timeout=STARTUP_TIMEOUT, **LIVENESS,
                              **options)  # type: ignore[arg-type]


async def first_batch_error(c: MultiSyncCollector, seen: list[object]) -> CollectorError:
    """The error of the first ``async for`` over ``c``, noting its events and states."""

    async def watch() -> None:
        async with c.events() as events:
            async for event in events:
                seen.append(event)
                seen.append(c.statistics().state)

    async with anyio.create_task_group() as tg:
        tg.start_soon(watch)
        with pytest.raises(CollectorError) as caught:
            async for _ in c:
                pass
        tg.cancel_scope.cancel()
    return caught.value


async def test_no_host_arriving_for_the_first_fill_says_so_and_is_bounded(
        sandbox, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="asyncrl.coordinator")
    seen: list[object] = []
    with anyio.fail_after(LIMIT):
        async with waiting_for_a_host() as c:
            error = await first_batch_error(c, seen)
    await sandbox.assert_clean()
    message = str(error)
    for part in (f"startup_timeout={STARTUP_TIMEOUT} s", "1 of remote_workers=1",
                 "listen='tcp://127.0.0.1:0'", "no host was refused",
                 "asyncrl worker --connect"):
        assert part in message, message
    waiting = [e for e in seen if getattr(e, "kind", None) == "waiting"]
    assert len(waiting) == 1 and "remote_workers=1" in waiting[0].reason, seen  # type: ignore[attr-defined]
    assert "waiting" in seen, seen  # statistics().state while it waited
    warned = [r for r in caplog.records if "waiting for 1 of 1 worker" in r.getMessage()]
    assert len(warned) >= 2, [r.getMessage() for r in caplog.records]


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # one host process: one backend
async def test_a_host_refused_for_its_specs_is_named_by_the_first_fills_error(
        sandbox) -> None:
    seen: list[object] = []
    with anyio.fail_after(LIMIT):
        async with waiting_for_a_host() as c:
            refused: list[object] = []

            async def note_refusals() -> None:
                async with c.events() as events:
                    async for event in events:
                        refused.append(event)

            async with anyio.create_task_group() as tg:
                tg.start_soon(note_refusals)
                # CountingEnv's observation is 2 floats; the run's IdentityEnv's, 3.
                host = cli_host(c.endpoint, "--env", "asyncrl.testing:CountingEnv",
                                sandbox=sandbox)
                await wait_for(lambda: any(getattr(e, "kind", "") == "refused"
                                           for e in refused), "the host's refusal")
                tg.cancel_scope.cancel()
            error = await first_batch_error(c, seen)
        assert host.wait(LIMIT) == 4, host.stdout.read() if host.stdout else ""
    await sandbox.assert_clean()
    message = str(error)
    assert "hellos refused so far:" in message and "observation" in message, message
    assert f"startup_timeout={STARTUP_TIMEOUT} s" in message, message
