"""Trainer of the elastic-membership scenarios in network namespaces (test_netns_membership.py).

Usage: python elastic_trainer.py LISTEN_ENDPOINT SCENARIO, SCENARIO one of

* ``depart``: after batch 3, SIGTERM the first host (its pid comes on stdin:
  ``hosts PID PID``) and wait for its departure (``on_worker_loss="raise"``);
* ``kill``: after batch 3, SIGKILL the first worker and wait for its loss (seen on the
  closed connection: ``peer_timeout`` is 120 s), then print ``replace`` (the test
  starts a new host), under ``on_worker_loss="wait"``.

Runs a sync collector of :class:`IdentityEnv` envs with a :class:`ValuePolicy` to
``TOTAL`` frames, publishing new weights after every batch, and prints one JSON
line per event; the last one (``done``) carries what the frames and versions show
(``frame_identity_problems``, ``version_problems``), the membership events and the
workers' final states.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: tests.*

from asyncrl import MultiSyncCollector
from asyncrl.testing import ValuePolicy, identity_env
from tests.chaos.helpers import pids_in, train, wait_for

TOTAL = 400


def say(**event: object) -> None:
    print(json.dumps(event), flush=True)


async def main(listen: str, scenario: str) -> None:
    options: dict[str, Any] = (
        {"heartbeat_interval": 0.2, "peer_timeout": 1.5} if scenario == "depart" else
        {"on_worker_loss": "wait", "heartbeat_interval": 0.5, "peer_timeout": 120})
    collector = MultiSyncCollector(identity_env, ValuePolicy(0.0), num_workers=0,
                                   remote_workers=2, listen=listen, frames_per_batch=20,
                                   total_frames=TOTAL, **options)
    events: list[Any] = []
    faulted: list[int] = []
    async with anyio.create_task_group() as tg, collector:
        stream = collector.events()

        async def pump() -> None:
            async for event in stream:
                events.append(event)

        tg.start_soon(pump)
        say(event="listening", endpoint=collector.endpoint)
        hosts: list[int] = []
        if scenario == "depart":
            line = await anyio.to_thread.run_sync(sys.stdin.readline)
            hosts = [int(p) for p in line.split()[1:]]

        async def after_batch(c: Any, index: int) -> None:
            say(event="batch", index=index)
            if index != 3:
                return
            if scenario == "depart":
                faulted.append(hosts[0])
                os.kill(hosts[0], signal.SIGTERM)
                await wait_for(lambda: any(e.kind == "left" for e in events), "the departure")
            else:
                faulted.append(c.statistics().workers[0].pid)
                os.kill(faulted[0], signal.SIGKILL)
                with anyio.fail_after(30):  # far less than peer_timeout
                    await wait_for(lambda: any(e.kind == "lost" for e in events), "the loss")
                say(event="replace")

        batches, values = await train(collector, after_batch=after_batch)
        from asyncrl.testing import frame_identity_problems, version_problems

        say(event="done", frames=sum(b.numel() for b in batches),
            sizes=sorted({b.numel() for b in batches}),
            problems=frame_identity_problems(batches, from_start=True)
            + version_problems(batches, values),
            membership=[[e.kind, e.reason] for e in events
                         if e.kind in ("joined", "left", "lost")],
            states=sorted(s.state for s in collector.statistics().workers),
            pids_after=sorted(pids_in(batches) - pids_in(batches[:4])), faulted=faulted)
        tg.cancel_scope.cancel()


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], sys.argv[2])
