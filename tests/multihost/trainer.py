"""Trainer run inside a network namespace by test_multihost.py; prints one JSON line per event.

Usage: python trainer.py LISTEN_ENDPOINT TOTAL_FRAMES [REMOTE_WORKERS]
"""

from __future__ import annotations

import json
import sys

import anyio

from asyncrl import MultiAsyncCollector
from asyncrl.testing import ParamPolicy
from transports import PeerLostError


def say(**event: object) -> None:
    print(json.dumps(event), flush=True)


async def keep_updating(collector: MultiAsyncCollector) -> None:
    # A training loop that publishes weights twice a second, whoever is connected.
    while True:
        try:
            await collector.weight_sender().send(timeout=5)
        except (PeerLostError, TimeoutError):
            pass  # a worker behind a cut link; it gets the latest version when it rejoins
        say(event="weights", version=collector.policy_version,
            relayed=sum(1 for s in collector.statistics().workers if s.relay),
            copies=collector.weight_sender().copies_sent)
        await anyio.sleep(0.5)


async def main(listen: str, total_frames: int, remote_workers: int) -> None:
    async with MultiAsyncCollector(
        "CartPole-v1", ParamPolicy(), num_workers=0, remote_workers=remote_workers, listen=listen,
        frames_per_batch=100, total_frames=total_frames, on_worker_loss="continue",
        heartbeat_interval=0.25, peer_timeout=2.0,
    ) as collector:
        say(event="listening", endpoint=collector.endpoint)
        async with anyio.create_task_group() as tg:
            updating = False
            async for batch in collector:
                if not updating:
                    updating = True
                    tg.start_soon(keep_updating, collector)
                versions = batch["collector", "policy_version"]
                say(event="batch", frames=batch.numel(),
                    worker=int(batch["collector", "worker_id"][0, 0]),
                    min_version=int(versions.min()), max_version=int(versions.max()),
                    traj_ids=sorted(set(batch["collector", "traj_ids"].flatten().tolist())))
                await anyio.sleep(0.05)  # a training step: lets several updates happen per run
            tg.cancel_scope.cancel()
        say(event="done", frames=collector.frames_collected)


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 1)
