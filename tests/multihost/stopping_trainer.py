"""A trainer that SIGTERM stops cleanly (as a pod's); prints one JSON line per event.

Usage: python stopping_trainer.py ENDPOINT REMOTE_WORKERS TOTAL_FRAMES POLICY_VALUE

``TOTAL_FRAMES`` -1: it runs until SIGTERM. Its batches' actions say which trainer
made them: ``ParamPolicy(value)`` acts ``int(value > 0)``.
"""

from __future__ import annotations

import json
import signal
import sys

import anyio

from asyncrl import MultiSyncCollector
from asyncrl.testing import ParamPolicy


def say(**event: object) -> None:
    print(json.dumps(event), flush=True)


async def main(endpoint: str, workers: int, total_frames: int, value: float) -> None:
    async with anyio.create_task_group() as tg:

        async def stop_on_sigterm() -> None:
            with anyio.open_signal_receiver(signal.SIGTERM) as signals:
                async for _ in signals:
                    say(event="sigterm")
                    tg.cancel_scope.cancel()  # the collector's aclose: a stop, not the end

        tg.start_soon(stop_on_sigterm)
        async with MultiSyncCollector(
                "CartPole-v1", ParamPolicy(value), num_workers=0, remote_workers=workers,
                listen=endpoint, frames_per_batch=10 * workers, total_frames=total_frames,
                heartbeat_interval=0.25, peer_timeout=2.0) as collector:
            say(event="listening")
            async for batch in collector:
                say(event="batch", frames=batch.numel(),
                    actions=sorted(set(batch["action"].flatten().tolist())),
                    workers=sorted(set(batch["collector", "worker_id"].flatten().tolist())))
            say(event="done", frames=collector.frames_collected)
        tg.cancel_scope.cancel()


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]))
