"""A trainer in its own process, for the scenarios that kill or restart it.

Prints one JSON line per event. Usage:
  python trainer.py remote ENDPOINT WORKERS   listen for WORKERS remote workers, train forever
  python trainer.py local                      two local workers; print their pids, then idle
"""

from __future__ import annotations

import json
import sys
from typing import Any

import anyio

from asyncrl import MultiSyncCollector
from asyncrl.testing import ValuePolicy, identity_env

LIVENESS: dict[str, Any] = {"heartbeat_interval": 0.2, "peer_timeout": 1.5}


def say(**event: object) -> None:
    print(json.dumps(event), flush=True)


async def remote(endpoint: str, workers: int) -> None:
    policy = ValuePolicy(0.0)
    async with MultiSyncCollector(identity_env, policy, num_workers=0, remote_workers=workers,
                                  listen=endpoint, frames_per_batch=10 * workers,
                                  total_frames=10**9, **LIVENESS) as collector:
        say(event="listening", endpoint=collector.endpoint)
        async for _ in collector:
            policy.value.data.fill_(collector.policy_version + 1)
            await collector.update_policy_weights()
            say(event="batch", version=collector.policy_version)


async def local() -> None:
    async with MultiSyncCollector(identity_env, ValuePolicy(0.0), num_workers=2,
                                  frames_per_batch=20, **LIVENESS) as collector:
        await collector.__anext__()
        say(event="ready", pids=collector.worker_pids, endpoint=collector.endpoint)
        await anyio.sleep(600)


if __name__ == "__main__":
    if sys.argv[1] == "remote":
        anyio.run(remote, sys.argv[2], int(sys.argv[3]))
    else:
        anyio.run(local)
