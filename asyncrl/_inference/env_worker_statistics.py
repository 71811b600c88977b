"""``statistics().workers`` for AsyncBatchedCollector: one row per local env worker."""

from __future__ import annotations

import socket
import time
from collections.abc import Mapping

from transports import Hub

from .._observe.statistics import WorkerState, WorkerStatistics
from .._spawn.processes import WorkerProcesses
from .chunk_buffer import SlotCounts


def env_worker_statistics(workers: WorkerProcesses, peers: Mapping[int, bytes],
                          counts: Mapping[int, SlotCounts],
                          hub: Hub | None) -> list[WorkerStatistics]:
    """Each local env worker, in slot order.

    ``frames`` / ``batches`` count what it sent (frames and chunks of transitions,
    in the trainer's buffer or handed over); ``state`` is ``joining`` until its first
    chunk, then ``collecting``, and ``lost`` once its process ended (``exit_code``).

    >>> env_worker_statistics(WorkerProcesses(0, print, lambda s, i: (),  # doctest: +SKIP
    ...                                       identity=lambda s: b""), {}, {}, None)
    []
    """
    now, host, rows = time.monotonic(), socket.gethostname(), []
    for slot, process in sorted(workers.slots.items()):
        sent = counts.get(slot, SlotCounts())
        peer = peers.get(slot)
        heard = hub.last_heard(peer) if hub is not None and peer is not None else None
        ended = process.exitcode is not None
        state: WorkerState = "lost" if ended else "collecting" if sent.chunks else "joining"
        rows.append(WorkerStatistics(
            index=slot, name=f"env-{slot}", host=host, pid=process.pid or 0, state=state,
            frames=sent.frames, batches=sent.chunks,
            last_batch_age=None if sent.last is None else now - sent.last,
            heartbeat_age=None if heard is None or ended else now - heard,
            exit_code=process.exitcode))
    return rows


__all__ = ["env_worker_statistics"]
