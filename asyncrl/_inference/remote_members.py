"""Who held each remote env host slot of AsyncBatchedCollector: rows and events.

Every admission of a remote env host (``asyncrl env-worker``) is a member: its
slot, host, pid and number of envs, from its hello. It joins (event
``"joined"``), and ends as a departure (it said goodbye: SIGTERM to its host;
event and state ``"left"``) or a loss (its connection closed, it went silent,
or it broke the agreement and was refused; event and state ``"lost"`` with the
reason). ``statistics().workers`` lists every member, the ended ones too (the
last :data:`KEEP_ENDED`), with what it sent (chunks and their frames).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from transports import Hub

from .._observe.events import CollectorEvent
from .._observe.statistics import WorkerState, WorkerStatistics
from .chunk_buffer import SlotCounts

#: Ended members kept for statistics() (a host may come and go for ever: bounded).
KEEP_ENDED = 256


@dataclass
class Member:
    """One admission of a remote env host."""

    slot: int
    peer: bytes
    host: str
    pid: int
    envs: int
    state: WorkerState = "joining"  # "collecting" from its first chunk; "left" / "lost"
    # what it sent, frozen when it ends (its slot's counts restart for the next occupant)
    sent: SlotCounts = field(default_factory=SlotCounts)
    reason: str = ""


class RemoteMembers:
    """The live member of each remote slot, and the ended ones; publishes their events.

    >>> members = RemoteMembers(publish=print)
    >>> members.rows({}, None)
    []
    """

    def __init__(self, publish: Callable[[CollectorEvent], None]) -> None:
        self._publish = publish
        self.live: dict[int, Member] = {}
        self.ended: deque[Member] = deque(maxlen=KEEP_ENDED)

    def joined(self, slot: int, peer: bytes, *, host: str, pid: int, envs: int) -> None:
        member = Member(slot, peer, host, pid, envs)
        self.live[slot] = member
        self._publish(CollectorEvent("joined", worker=slot, name=f"env-{slot}", host=host,
                                     pid=pid))

    def refused(self, reason: str) -> None:
        """A hello (not an admitted member) was refused."""
        self._publish(CollectorEvent("refused", reason=reason[:2000]))

    def end(self, slot: int, *, left: bool, reason: str, sent: SlotCounts | None) -> None:
        """Slot ``slot``'s member is gone: ``left`` cleanly, or lost (``reason``)."""
        member = self.live.pop(slot, None)
        if member is None:
            return
        member.state = "left" if left else "lost"
        member.reason = reason
        member.sent = sent or SlotCounts()
        self.ended.append(member)
        self._publish(CollectorEvent(member.state, worker=slot, name=f"env-{slot}",
                                     host=member.host, pid=member.pid, reason=reason))

    def rows(self, counts: Mapping[int, SlotCounts], hub: Hub | None) -> list[WorkerStatistics]:
        """The ended members (oldest first), then the live ones by slot."""
        now, rows = time.monotonic(), []
        for member in [*self.ended, *sorted(self.live.values(), key=lambda m: m.slot)]:
            live = member.slot in self.live and self.live[member.slot] is member
            sent = counts.get(member.slot, SlotCounts()) if live else member.sent
            state = member.state
            if live:
                state = "collecting" if sent.chunks else "joining"
            heard = hub.last_heard(member.peer) if live and hub is not None else None
            rows.append(WorkerStatistics(
                index=member.slot, name=f"env-{member.slot}", host=member.host,
                pid=member.pid, state=state, frames=sent.frames, batches=sent.chunks,
                last_batch_age=None if sent.last is None else now - sent.last,
                heartbeat_age=None if heard is None else now - heard))
        return rows


__all__ = ["KEEP_ENDED", "Member", "RemoteMembers"]
