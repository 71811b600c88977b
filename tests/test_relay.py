"""Per-host relay: one copy of each weight version per host, fanned out to its workers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import anyio
import pytest
import torch

from asyncrl import MultiAsyncCollector, MultiSyncCollector
from asyncrl.relay import HostRelay
from asyncrl.testing import ParamPolicy
from asyncrl.weights import WEIGHTS_KIND
from asyncrl.weights._fanout import RELAY_TO
from transports import Hub, Link, PeerLostError, RemoteError

pytestmark = pytest.mark.anyio
LIMIT = 90


def cli_host(endpoint: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "asyncrl.cli", "worker", "--connect", endpoint,
         "--env", "CartPole-v1", "--policy", "asyncrl.testing:ParamPolicy", *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


async def wait_exit(process: subprocess.Popen) -> int:
    while process.poll() is None:
        await anyio.sleep(0.05)
    return process.returncode


def kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


async def wait_for_routes(collector: MultiSyncCollector | MultiAsyncCollector,
                          count: int) -> dict[int, bytes]:
    scheduler = collector._scheduler
    assert scheduler is not None
    while len(scheduler.relay_routes()) < count:
        await anyio.sleep(0.02)
    return scheduler.relay_routes()


async def test_one_weight_copy_per_host_reaches_every_worker_of_it() -> None:
    policy = ParamPolicy()
    with anyio.fail_after(LIMIT):
        async with MultiSyncCollector("CartPole-v1", policy, num_workers=0, remote_workers=3,
                                      listen="tcp://127.0.0.1:0", frames_per_batch=60,
                                      total_frames=-1) as collector:
            host = cli_host(collector.endpoint, "--workers", "3")
            try:
                batches = collector.__aiter__()
                first = await batches.__anext__()
                routes = await wait_for_routes(collector, 3)
                sender = collector.weight_sender()
                copies_before = sender.copies_sent
                for step in range(1, 6):
                    with torch.no_grad():
                        policy.value.fill_(1.0 if step % 2 else -1.0)  # actions 1, 0, 1...
                    await collector.update_policy_weights()
                    batch = await batches.__anext__()
                    # On-policy through the relay: the whole batch used the new weights.
                    assert batch["collector", "policy_version"].unique().tolist() == [step]
                    assert batch["action"].unique().tolist() == [step % 2]
                copies = sender.copies_sent - copies_before
                relays = set(routes.values())
            finally:
                await collector.aclose()
                code = await wait_exit(host) if host.poll() is None else host.returncode
                if code is None:
                    kill_group(host)
    output = host.stdout.read()
    assert code == 0, output
    assert first.shape[0] == 3
    assert len(relays) == 1
    assert sorted(routes) == [0, 1, 2]
    assert copies == 5, f"one message per version for the whole host, got {copies} for 5"
    assert sender.acked_versions == {0: 5, 1: 5, 2: 5}
