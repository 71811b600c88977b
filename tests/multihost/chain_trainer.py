"""Trainer run inside a network namespace by test_chain.py; prints one JSON line per event.

A MultiSyncCollector whose remote workers get their weights along a gloo chain
(``DistributedWeightSyncScheme(algorithm="chain")``). It says each time more
workers joined; after ``BATCHES`` batches, one weight update each, it reports
the version problems, the chain's path and each worker's namespace.

Usage: python chain_trainer.py LISTEN_ENDPOINT INIT_METHOD REMOTE_WORKERS
"""

from __future__ import annotations

import json
import subprocess
import sys

import anyio

from asyncrl import MultiSyncCollector
from asyncrl.testing import ValuePolicy, fill_parameters, version_problems
from asyncrl.weights import DistributedWeightSyncScheme

BATCHES = 8


def say(**event: object) -> None:
    print(json.dumps(event), flush=True)


def namespace_of(pid: int) -> str:
    out = subprocess.run(["ip", "netns", "identify", str(pid)], capture_output=True,
                         text=True, timeout=30)
    return out.stdout.strip()


async def report_joins(collector: MultiSyncCollector, wanted: int) -> None:
    """One ``joined`` event each time the number of workers grows, until all are in."""
    seen = 0
    while seen < wanted:
        now = len(collector.statistics().workers)
        if now != seen:
            seen = now
            say(event="joined", workers=now)
        await anyio.sleep(0.05)


async def main(listen: str, init_method: str, remote_workers: int) -> None:
    policy = ValuePolicy(0.0)
    scheme = DistributedWeightSyncScheme(init_method=init_method, algorithm="chain",
                                         timeout=60)
    values: dict[int, float | None] = {0: 0.0}
    batches = []
    with anyio.fail_after(240):
        async with MultiSyncCollector(
                "asyncrl.testing:CountingEnv", policy, num_workers=0,
                remote_workers=remote_workers, listen=listen,
                frames_per_batch=4 * remote_workers, total_frames=-1,
                weight_sync_schemes={"policy": scheme}) as collector:
            say(event="listening", endpoint=collector.endpoint)
            async with anyio.create_task_group() as tg:
                tg.start_soon(report_joins, collector, remote_workers)
                async for batch in collector:
                    batches.append(batch)
                    if len(batches) == BATCHES:
                        break
                    version = collector.policy_version + 1
                    fill_parameters(policy, float(version))
                    values[version] = float(version)
                    await collector.update_policy_weights()
            group = collector.weight_sender()._group  # type: ignore[attr-defined]
            say(event="done", problems=version_problems(batches, values),
                versions=sorted({int(v) for b in batches
                                 for v in b["collector", "policy_version"].reshape(-1)}),
                order=group.order,  # while the workers run: where each one is
                hosts={s.index: namespace_of(s.pid) for s in collector.statistics().workers})


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], sys.argv[2], int(sys.argv[3]))
