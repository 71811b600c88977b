"""``statistics().workers`` and the membership events of AsyncBatchedCollector's env workers.

Local env workers are rows of their processes (:func:`env_worker_statistics`). A
remote env host (``asyncrl worker --role env``) is admitted by the one admission
into the one roster (:class:`~asyncrl._coordinator.records.WorkerInfo`: its name,
host and pid, from its hello); :class:`RemoteRows` adds what central inference
knows of it: the slot it sat in, what it sent (chunks and their frames), and how
it ended. It joins (event ``"joined"``), and ends as a departure (it said goodbye:
SIGTERM to its host; event and state ``"left"``) or a loss (its connection closed,
it went silent, or it broke the agreement and was refused; event and state
``"lost"`` with the reason). Ended hosts stay listed (the last :data:`KEEP_ENDED`).
"""

from __future__ import annotations

import socket
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from transports import Hub

from .._coordinator.records import WorkerInfo
from .._observe.events import CollectorEvent
from .._observe.statistics import WorkerState, WorkerStatistics
from .._spawn.processes import WorkerProcesses
from .chunk_buffer import SlotCounts

#: Ended remote env hosts kept for statistics() (a host may come and go for ever: bounded).
KEEP_ENDED = 256


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


@dataclass
class RemoteHost:
    """One admission of a remote env host: its roster entry and its slot in the loop."""

    info: WorkerInfo
    slot: int
    envs: int
    state: WorkerState = "joining"  # "collecting" from its first chunk; "left" / "lost"
    # what it sent, frozen when it ends (its slot's counts restart for the next occupant)
    sent: SlotCounts = field(default_factory=SlotCounts)
    reason: str = ""


class RemoteRows:
    """The remote env host in each slot, and the ended ones; publishes their events.

    >>> rows = RemoteRows(publish=print)
    >>> rows.rows({}, None)
    []
    """

    def __init__(self, publish: Callable[[CollectorEvent], None]) -> None:
        self._publish = publish
        self.live: dict[int, RemoteHost] = {}
        self.ended: deque[RemoteHost] = deque(maxlen=KEEP_ENDED)

    def joined(self, slot: int, info: WorkerInfo, *, envs: int) -> None:
        self.live[slot] = RemoteHost(info, slot, envs)
        self._publish(CollectorEvent("joined", worker=slot, name=f"env-{slot}", host=info.host,
                                     pid=info.pid))

    def refused(self, reason: str) -> None:
        """A hello (not an admitted host) was refused."""
        self._publish(CollectorEvent("refused", reason=reason[:2000]))

    def end(self, slot: int, *, left: bool, reason: str, sent: SlotCounts | None) -> None:
        """Slot ``slot``'s host is gone: ``left`` cleanly, or lost (``reason``)."""
        host = self.live.pop(slot, None)
        if host is None:
            return
        host.state = "left" if left else "lost"
        host.reason = reason
        host.sent = sent or SlotCounts()
        self.ended.append(host)
        self._publish(CollectorEvent(host.state, worker=slot, name=f"env-{slot}",
                                     host=host.info.host, pid=host.info.pid, reason=reason))

    def rows(self, counts: Mapping[int, SlotCounts], hub: Hub | None) -> list[WorkerStatistics]:
        """The ended hosts (oldest first), then the live ones by slot."""
        now, rows = time.monotonic(), []
        for host in [*self.ended, *sorted(self.live.values(), key=lambda m: m.slot)]:
            live = self.live.get(host.slot) is host
            sent = counts.get(host.slot, SlotCounts()) if live else host.sent
            state = host.state
            if live:
                state = "collecting" if sent.chunks else "joining"
            heard = hub.last_heard(host.info.peer) if live and hub is not None else None
            rows.append(WorkerStatistics(
                index=host.slot, name=f"env-{host.slot}", host=host.info.host,
                pid=host.info.pid, state=state, frames=sent.frames, batches=sent.chunks,
                last_batch_age=None if sent.last is None else now - sent.last,
                heartbeat_age=None if heard is None else now - heard))
        return rows


__all__ = ["KEEP_ENDED", "RemoteHost", "RemoteRows", "env_worker_statistics"]
