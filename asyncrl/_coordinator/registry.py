"""Every worker a collector ever admitted, with its life cycle, counts and exit code.

The coordinator's state keeps what the rules need (who is alive, what each owes);
this registry keeps what an operator asks: frames handed to the trainer, the
time of each worker's last batch, how a lost one ended. It turns admissions and
losses into :class:`~asyncrl._observe.events.CollectorEvent`\\ s. Lost entries are kept
(the newest ``max_lost``), so a SIGKILLed worker shows as ``"lost"`` with its
exit code instead of disappearing.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from transports import peer_name

from .._observe.events import CollectorEvent
from .._observe.statistics import WorkerState, WorkerStatistics
from .state import WorkerInfo


@dataclass(eq=False)
class WorkerRecord:
    """One admission: the coordinator's :class:`WorkerInfo` and what the registry adds."""

    info: WorkerInfo
    frames: int = 0
    last_batch: float | None = None  # time.monotonic() of its last delivered batch
    exit_code: int | None = None
    lost: bool = False
    left: bool = False  # it left cleanly (a goodbye), rather than being lost

    def state(self) -> WorkerState:
        if self.left:
            return "left"
        if self.lost or not self.info.alive:
            return "lost"
        if self.info.role == "env":  # central inference's env worker steps while admitted
            return "collecting"
        return "collecting" if self.info.credits > 0 else "idle"


class WorkerRegistry:
    """Admissions in order, live and lost; publishes ``joined`` / ``lost`` / ``refused``.

    A MultiCollector's coordinator keeps one for its workers; AsyncBatchedCollector's
    env hub (:mod:`asyncrl.collectors.batched.env_hub`) one for its env workers, whose
    records (role ``"env"``) are collecting for as long as they are admitted.
    """

    def __init__(self, publish: Callable[[CollectorEvent], None] | None = None, *,
                 max_lost: int = 1024, max_refusals: int = 4) -> None:
        self._publish = publish or (lambda event: None)
        self._records: dict[int, WorkerRecord] = {}  # id(WorkerInfo) -> record, in order
        self._max_lost = max_lost
        self._lost = 0
        # The latest distinct refusals ("name from host: why"), for the first fill's
        # warnings; bounded, as peers may say hello as often as they like.
        self._refusals: deque[str] = deque(maxlen=max_refusals)

    def records(self) -> list[WorkerRecord]:
        return list(self._records.values())

    def refusals(self) -> list[str]:
        """The latest distinct refusals, oldest first: ``"name from host: why"``."""
        return list(self._refusals)

    def record(self, info: WorkerInfo) -> WorkerRecord | None:
        return self._records.get(id(info))

    # -- what the coordinator tells it -----------
    def joined(self, info: WorkerInfo) -> None:
        """``info`` was welcomed (again, if it is known: then nothing happens)."""
        if id(info) in self._records:
            return
        self._records[id(info)] = WorkerRecord(info)
        self._publish(CollectorEvent("joined", worker=info.index, name=info.name,
                                     host=info.host, pid=info.pid))

    def publish(self, event: CollectorEvent) -> None:
        """Publish ``event`` on the collector's stream (e.g. ``"waiting"``)."""
        self._publish(event)

    def refused(self, name: str, host: str, reason: str, pid: int | None = None) -> None:
        text = f"{name} from {host}: {reason}"
        if text in self._refusals:
            self._refusals.remove(text)
        self._refusals.append(text)
        self._publish(CollectorEvent("refused", name=name, host=host, pid=pid, reason=reason))

    def check_lost(self, reason: str = "", *, left: bool = False) -> None:
        """Mark the admissions the coordinator dropped since the last call as lost
        (``left``: as having left cleanly: a ``"left"`` event and state)."""
        for record in self._records.values():
            if not record.lost and not record.info.alive:
                record.left = left
                self._mark_lost(record, reason or "dropped by the coordinator")

    def exited(self, pid: int, exit_code: int | None, reason: str = "", *,
               announce: bool = True) -> None:
        """A local process ended: its admission (if any) is lost, with its exit code
        (``announce=False``: without a ``"lost"`` event, as for a process the collector
        stopped while closing)."""
        for record in reversed(self._records.values()):
            if record.info.pid == pid and record.exit_code is None:
                record.exit_code = exit_code
                if not record.lost:
                    self._mark_lost(record, reason or f"its process ended (exit code {exit_code})",
                                    announce=announce)
                return

    def delivered(self, info: WorkerInfo, frames: int, now: float | None = None) -> None:
        """A batch (or share) of ``info`` with ``frames`` frames was handed to the trainer."""
        record = self._records.get(id(info))
        if record is not None:
            record.frames += frames
            record.last_batch = time.monotonic() if now is None else now

    # -- what an operator reads -----------
    def statistics(self, *, heard: Callable[[bytes], float | None] | None = None,
                   routes: Mapping[int, bytes] | None = None,
                   joining: Iterable[tuple[int, int, str]] = (),
                   waiting: Iterable[WorkerInfo] = (),
                   joining_name: str = "worker") -> list[WorkerStatistics]:
        """One line per admission (lost ones too) and per local process still joining,
        ordered by worker index (a restarted slot: its admissions in order).

        ``heard(peer)``: ``time.monotonic()`` it was last heard (None: not connected);
        ``joining``: ``(slot, pid, host)`` of local processes not admitted yet (named
        ``f"{joining_name}-{slot}"``: central inference's env workers are ``env-SLOT``);
        ``waiting``: lost workers whose replacement the trainer is blocked on (a
        ``"waiting"`` line each, beside their ``"lost"`` one).
        """
        now = time.monotonic()
        routes = routes or {}
        lines = []
        live_pids = set()
        for record in self._records.values():
            info, state = record.info, record.state()
            gone = state in ("lost", "left")
            seen = heard(info.peer) if heard is not None and not gone else None
            if not gone:
                live_pids.add(info.pid)
            lines.append(WorkerStatistics(
                index=info.index, name=info.name, host=info.host, pid=info.pid, state=state,
                frames=record.frames, batches=info.delivered,
                ahead=info.ahead if not gone else 0,
                last_batch_age=None if record.last_batch is None else now - record.last_batch,
                heartbeat_age=None if seen is None else max(0.0, now - seen),
                exit_code=record.exit_code,
                relay=peer_name(routes.get(info.index, b""))
                if not gone else "", **info.arrivals.as_dict()))
        for slot, pid, host in joining:
            if pid not in live_pids and not any(r.info.pid == pid for r in self._records.values()):
                lines.append(WorkerStatistics(index=slot, name=f"{joining_name}-{slot}", host=host,
                                              pid=pid, state="joining"))
        for info in waiting:
            lines.append(WorkerStatistics(index=info.index, name=info.name, host=info.host,
                                          pid=info.pid, state="waiting"))
        return sorted(lines, key=lambda line: line.index)  # stable: admission order per index

    def _mark_lost(self, record: WorkerRecord, reason: str, *, announce: bool = True) -> None:
        record.lost = True
        info = record.info
        if announce:
            self._publish(CollectorEvent("left" if record.left else "lost", worker=info.index,
                                         name=info.name, host=info.host, pid=info.pid,
                                         reason=reason, exit_code=record.exit_code))
        self._lost += 1
        if self._lost > self._max_lost:  # bounded: forget the oldest lost admission
            for key, old in self._records.items():
                if old.lost:
                    del self._records[key]
                    self._lost -= 1
                    break


__all__ = ["WorkerRecord", "WorkerRegistry"]
