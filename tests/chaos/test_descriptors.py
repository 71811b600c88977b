"""Chaos: the process's file descriptors, under repeated collectors and under a flood.

Descriptors must come back when a collector closes, not when the garbage collector
runs; and a flood of half-open connections must not use up the descriptors that a
real worker needs to join.
"""

from __future__ import annotations

import functools
import gc
import os
from collections.abc import Callable
from typing import Any

import anyio
import pytest

from asyncrl import AsyncBatchedCollector, MultiAsyncCollector, MultiSyncCollector
from asyncrl.testing import CountingEnv, ValuePolicy, identity_env

from .helpers import LIMIT

ROUNDS = 6  # a leak of one descriptor per worker shows as 12 or more


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


async def settled_descriptors(baseline: int | None, grace: float = 5.0) -> int:
    """The open descriptors, once back to ``baseline`` or ``grace`` s from now.

    ZeroMQ closes a socket's own descriptors (its mailbox) in its reaper thread,
    just after ``close()`` returns: a count taken at once may see them still open.
    """
    with anyio.move_on_after(grace):
        while baseline is not None and open_descriptors() > baseline:
            await anyio.sleep(0.05)
    return open_descriptors()


def _multi_sync() -> Any:
    return MultiSyncCollector(identity_env, ValuePolicy(0.0), num_workers=2,
                              frames_per_batch=20, total_frames=40)


def _multi_async() -> Any:
    return MultiAsyncCollector(identity_env, ValuePolicy(0.0), num_workers=2,
                               frames_per_batch=10, total_frames=40)


def _batched() -> Any:
    return AsyncBatchedCollector(functools.partial(CountingEnv, length=3), num_envs=2,
                                 policy=ValuePolicy(1.0), frames_per_batch=6, total_frames=12)


@pytest.mark.anyio
@pytest.mark.chaos
@pytest.mark.parametrize(("anyio_backend", "make"), [
    ("asyncio", _multi_sync), ("trio", _multi_async), ("asyncio", _batched)])
async def test_collectors_opened_and_closed_leave_no_descriptor_without_a_collection(
        sandbox, make: Callable[[], Any]) -> None:
    """``gc.disable()``: what a closed collector held must be closed by ``aclose()`` itself."""
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        with anyio.fail_after(LIMIT * 3):
            counts = []
            for _ in range(ROUNDS + 1):  # the first one starts the fork server
                async with make() as collector:
                    async for _ in collector:
                        pass
                counts.append(await settled_descriptors(counts[0] if counts else None))
    finally:
        if enabled:
            gc.enable()
    # No round after the first ends with more descriptors open than the first.
    assert max(counts[1:]) <= counts[0], f"descriptors after each collector: {counts}"
    await sandbox.assert_clean()
