"""Chaos: the process's file descriptors, under repeated collectors and under a flood.

Descriptors must come back when a collector closes, not when the garbage collector
runs; and a flood of half-open connections must not use up the descriptors that a
real worker needs to join.
"""

from __future__ import annotations

import functools
import gc
import os
import resource
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from asyncrl import AsyncBatchedCollector, MultiAsyncCollector, MultiSyncCollector
from asyncrl.testing import CountingEnv, ValuePolicy, identity_env
from tests.multihost.lines import Lines
from tests.multihost.processes import free_port

from .helpers import LIMIT, Sandbox, cli_host, sandbox_env

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


# -- a flood of connections that never finish their handshake ----------------------------------
FLOOD = str(Path(__file__).parent / "flood.py")
SOFT_LIMIT = 1024  # the common default soft limit of open files
FLOOD_SIZE = 1500  # more than that limit can hold at once
TRAINER = """
import json, resource, sys, anyio
from asyncrl import MultiSyncCollector
from asyncrl.testing import ValuePolicy, identity_env

async def main(endpoint):
    async with MultiSyncCollector(identity_env, ValuePolicy(0.0), num_workers=0,
                                  remote_workers=1, listen=endpoint, frames_per_batch=10,
                                  total_frames=50, heartbeat_interval=0.2,
                                  peer_timeout=1.5) as c:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        print(json.dumps({"event": "listening", "soft": soft}), flush=True)
        frames = [b.numel() async for b in c]
    print(json.dumps({"event": "done", "frames": sum(frames)}), flush=True)

anyio.run(main, sys.argv[1])
"""


def _soft_limit(limit: int) -> Callable[[], None]:
    def apply() -> None:  # in the child, before it runs Python
        resource.setrlimit(resource.RLIMIT_NOFILE,
                           (limit, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    return apply


def _popen(sandbox: Sandbox, args: list[str], **kwargs: Any) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, *args], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True,
                               env=sandbox_env(sandbox), **kwargs)
    sandbox.watch(session=process.pid)
    return process


def _stop(*processes: subprocess.Popen) -> None:
    for process in processes:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.communicate(timeout=LIMIT)


@pytest.mark.chaos
@pytest.mark.skipif(resource.getrlimit(resource.RLIMIT_NOFILE)[1] < FLOOD_SIZE + 200,
                    reason="the hard limit of open files is too low for the flood")
def test_a_worker_joins_through_a_slow_greeting_flood_at_a_soft_limit_of_1024(sandbox) -> None:
    """1,500 connections dripping their greeting: the trainer, started at a soft limit of
    1,024, raises it to its hard limit and drops unfinished handshakes; a real worker
    joins and the run completes."""
    port = free_port()
    endpoint = f"tcp://127.0.0.1:{port}"
    script = sandbox.root / "trainer.py"
    script.write_text(TRAINER)
    trainer = _popen(sandbox, [str(script), endpoint], preexec_fn=_soft_limit(SOFT_LIMIT))
    flood = host = None
    try:
        events = Lines(trainer)
        listening = events.until(lambda e: e["event"] == "listening", LIMIT)
        assert listening["soft"] > SOFT_LIMIT, listening
        flood = _popen(sandbox, [FLOOD, str(port), str(FLOOD_SIZE), str(3 * LIMIT)])
        # More flood connections at once than a soft limit of 1,024 could hold.
        Lines(flood).until(lambda e: e["connected"] >= SOFT_LIMIT + 150, LIMIT)
        host = cli_host(endpoint, sandbox=sandbox)
        done = events.until(lambda e: e["event"] == "done", LIMIT)
        assert done["frames"] == 50, done
        assert trainer.wait(LIMIT) == 0
        output = host.communicate(timeout=LIMIT)[0]
        assert host.returncode == 0, output
    finally:
        _stop(*(p for p in (trainer, flood, host) if p is not None))
    anyio.run(sandbox.assert_clean)
