"""Newest wins: the one rule every weight scheme follows, on both sides of the wire.

A worker only ever wants the newest weights. So nothing older is kept or sent
once something newer exists, and every send is still answered:

* **Trainer side** (:class:`Lanes`): each worker has at most one message in
  transit (handed to the hub, not acknowledged yet) and one :class:`Queued`
  version. A newer version replaces the queued one, which is never transmitted;
  the sends it answered for are answered by the newer one's acknowledgement.
* **Worker side** (:func:`offer`): a version no newer than the one held is acked
  with the held one; one no newer than the pending one waits for the pending
  one's ack; a newer one replaces the pending one (its payload dropped).

The transports (ZeroMQ, shared memory, CUDA IPC, a process group, Ray) decide how
the bytes travel; none of them decides what is dropped: they call this module.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from transports import Ticket

from ._in_flight import Sent

__all__ = ["Lane", "Lanes", "Offer", "Queued", "offer"]


@dataclass(eq=False)
class Queued:
    """The newest version for one worker, waiting while its previous one is in transit."""

    version: int
    payload: Any
    extra: dict[str, Any]
    direct: bool
    sends: list[Sent]  # the sends it answers for: its own, and those it superseded


@dataclass(eq=False)
class Lane:
    """What is on its way to one worker: at most one message in transit, one queued.

    A message is in transit from the moment it is handed to the hub until its
    peer (the worker, or the relay that carries it) acknowledged it, failed, or
    was lost. A newer version replaces the queued one: never sent, never held.
    """

    ticket: Ticket | None = None
    peer: bytes | None = None  # who ``ticket`` waits for: the worker or its relay
    queued: Queued | None = None

    def busy(self) -> bool:
        return self.ticket is not None and self.peer in self.ticket.pending


class Lanes(dict[int, Lane]):
    """``{worker_id: Lane}``: the trainer's side of newest wins (see the module docstring).

    >>> lanes = Lanes()
    >>> first, second = Sent(1, [], None, {}), Sent(2, [], None, {})
    >>> lanes.queue([0], 1, "v1", {}, False, first)
    >>> lanes.queue([0], 2, "v2", {}, False, second)  # replaces version 1, never sent
    >>> queued = lanes[0].queued
    >>> queued.version, queued.payload, queued.sends == [first, second]
    (2, 'v2', True)
    """

    def queue(self, worker_ids: list[int], version: int, payload: Any, extra: dict[str, Any],
              direct: bool, sent: Sent) -> None:
        """Queue ``version`` for each worker, replacing a queued older one (newest wins)."""
        for worker_id in worker_ids:
            lane = self.setdefault(worker_id, Lane())
            older = lane.queued.sends if lane.queued is not None else []
            lane.queued = Queued(version, payload, extra, direct, [*older, sent])

    def queued(self) -> Iterator[Queued]:
        """Every version still queued (what a sender must not overwrite yet)."""
        return (lane.queued for lane in self.values() if lane.queued is not None)

    def renew(self, worker_id: int) -> None:
        """``worker_id`` is a new incarnation: nothing of its own is in transit."""
        lane = self.get(worker_id)
        if lane is not None:
            lane.ticket = None

    def ready(self, workers: Mapping[int, bytes]
              ) -> tuple[dict[tuple[int, bool], list[int]], list[tuple[int, Queued]]]:
        """What may go out now: ``{(version, direct): worker ids}`` of the queued versions
        whose worker has nothing in transit, and ``(worker_id, queued)`` of the workers
        gone before theirs went out (their lanes dropped: lost, like any other)."""
        groups: dict[tuple[int, bool], list[int]] = {}
        gone: list[tuple[int, Queued]] = []
        for worker_id, lane in list(self.items()):
            queued = lane.queued
            if queued is None or lane.busy():
                continue
            if worker_id not in workers:
                del self[worker_id]
                gone.append((worker_id, queued))
                continue
            groups.setdefault((queued.version, queued.direct), []).append(worker_id)
        return groups, gone

    def hand_over(self, worker_id: int, ticket: Ticket, peer: bytes) -> Queued:
        """``worker_id``'s queued version is in transit under ``ticket`` (to ``peer``)."""
        lane = self[worker_id]
        queued = lane.queued
        assert queued is not None
        lane.ticket, lane.peer, lane.queued = ticket, peer, None
        return queued

    def ahead(self) -> Ticket | str | None:
        """What a queued version waits for: a ticket in transit, ``"send"`` (nothing), or None."""
        ahead: Ticket | str | None = None
        for lane in self.values():
            if lane.queued is not None:
                if not lane.busy():
                    return "send"
                ahead = lane.ticket
        return ahead

    def blocking(self, worker_ids: set[int]) -> Ticket | None:
        """A ticket in transit that one of ``worker_ids`` (still queued) waits behind."""
        for worker_id in worker_ids:
            lane = self.get(worker_id)
            if lane is not None and lane.busy():
                return lane.ticket
        return None


class Offer(enum.Enum):
    """What a worker does with a version that arrives (see :func:`offer`)."""

    HELD = "held"  # it holds this version or a newer one: ack with what it holds
    SUPERSEDED = "superseded"  # a newer one is pending: ack with that one, once applied
    NEWEST = "newest"  # keep it as the pending version (dropping an older pending one)


def offer(version: int, held: int, pending: int | None) -> Offer:
    """The worker's side of newest wins, for ``version`` arriving while it holds
    ``held`` and has ``pending`` waiting (None: nothing).

    >>> offer(3, held=3, pending=None), offer(4, held=3, pending=5), offer(6, held=3, pending=5)
    (<Offer.HELD: 'held'>, <Offer.SUPERSEDED: 'superseded'>, <Offer.NEWEST: 'newest'>)
    """
    if version <= held:
        return Offer.HELD
    if pending is not None and version <= pending:
        return Offer.SUPERSEDED
    return Offer.NEWEST
