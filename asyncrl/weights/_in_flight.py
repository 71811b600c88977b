"""A weight send while it waits for its acknowledgements, and each worker's lane.

A :class:`Sent` is one version sent to some workers: one hub message per
:class:`Part` (to workers directly, or to one relay for its members), read
into ``{worker_id: version applied}`` and errors once nothing is pending. A
:class:`Lane` is what is on its way to one worker (newest wins: at most one
message in transit and one :class:`Queued` version). The
:class:`~asyncrl.weights.WeightSender` owns them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from transports import PeerLostError, ProtocolError, RemoteError, Ticket

from .._protocol import WeightsApplied
from ._fanout import parse_relay_ack


@dataclass(eq=False)
class Part:
    """One hub message of a send: to workers directly, or to one relay for its members."""

    ticket: Ticket
    workers: dict[bytes, int]  # peer (direct) or member identity (relayed) -> worker id
    relay: bytes | None = None
    gone: set[int] = field(default_factory=set)  # relayed members removed since

    @property
    def pending(self) -> bool:
        if self.relay is not None:
            return bool(self.ticket.pending)
        # The ticket may cover more workers than this send (a version that superseded
        # this one went to them too): only this part's own peers count.
        return not self.ticket.pending.isdisjoint(self.workers)

    def silent(self) -> list[int]:
        if self.relay is not None:
            return sorted(self.workers.values()) if self.ticket.pending else []
        return [self.workers[p] for p in self.ticket.pending if p in self.workers]


@dataclass(eq=False)
class Sent:
    """One send (one version to some workers) waiting for its acknowledgements."""

    version: int
    parts: list[Part]
    slot: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    #: Workers it is queued for: not transmitted yet (their previous version is in transit).
    waiting: set[int] = field(default_factory=set)
    #: ``time.monotonic()`` of a ``send_async`` (None: a catch-up), for the sync latency.
    started: float | None = None
    _outcome: tuple[dict[int, int], list[BaseException]] | None = None

    @property
    def tickets(self) -> list[Ticket]:
        return [part.ticket for part in self.parts]

    @property
    def pending(self) -> bool:
        return bool(self.waiting) or any(part.pending for part in self.parts)

    def outcome(self, latest: int) -> tuple[dict[int, int], list[BaseException]]:
        """``({worker_id: version applied}, [errors])`` of a send that is not pending.

        ``latest`` is the sender's newest version: what a worker may have applied
        instead of this one.
        """
        if self._outcome is None:
            self._outcome = self._read_outcome(latest)
        return self._outcome

    def _read_outcome(self, latest: int) -> tuple[dict[int, int], list[BaseException]]:
        applied: dict[int, int] = {}
        errors: list[BaseException] = []
        for part in self.parts:
            ticket = part.ticket
            if part.relay is None:
                own = part.workers
                for peer, result in ticket.acks.items():
                    if peer not in own:
                        continue
                    try:
                        version = WeightsApplied.from_body(result).version
                    except ProtocolError as exc:
                        errors.append(malformed_ack(peer, exc))
                        continue
                    if self.version <= version <= latest:
                        applied[own[peer]] = version
                    else:  # e.g. a worker still counting in a previous trainer's versions
                        errors.append(bad_ack(peer, version, self.version, latest))
                errors.extend(e for p, e in ticket.errors.items() if p in own)
                lost = sorted(p for p in ticket.lost if p in own)
                if lost:
                    errors.append(PeerLostError(lost, f"before acknowledging message {ticket.seq}"))
                continue
            via = part.relay.decode(errors="replace")
            members = sorted(part.workers)
            for error in ticket.errors.values():  # the relay refused the message itself
                error.add_note(f"relay {via} failed to deliver to worker(s) "
                               f"{sorted(part.workers.values())}")
                errors.append(error)
            if ticket.lost:
                errors.append(PeerLostError(members, f"(their relay {via} went silent before "
                                                     f"acknowledging message {ticket.seq})"))
            if ticket.acks:
                live = {m: w for m, w in part.workers.items() if w not in part.gone}
                done, failed = parse_relay_ack(ticket.acks[part.relay], live, part.relay,
                                               self.version, latest)
                applied.update(done)
                errors.extend(failed.values())
                gone = [m for m, w in part.workers.items() if w in part.gone]
                if gone:
                    errors.append(PeerLostError(gone, "(removed while their relay delivered)"))
        return applied, errors


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


def gone_part(peer: bytes, worker_id: int) -> Part:
    """The part of a send for a worker that left before it went out: lost, never sent.

    ``peer`` is its hub identity (what the run knows it by: a departure is told from a
    loss by it).
    """
    ticket = Ticket(seq=0, peers=frozenset([peer]))
    ticket.resolve(peer, lost=True)
    return Part(ticket, {peer: worker_id})


def first_error(errors: list[BaseException]) -> BaseException:
    """A worker's own failure before a lost peer; the others are named in a note."""
    first = next((e for e in errors if isinstance(e, RemoteError)), errors[0])
    if len(errors) > 1:
        first.add_note(f"{len(errors) - 1} more failure(s) in the same send: "
                       + "; ".join(str(e).splitlines()[0] for e in errors if e is not first))
    return first


def malformed_ack(peer: bytes, error: ProtocolError) -> RemoteError:
    return RemoteError(
        f"worker acknowledged weights with a malformed answer ({error}); expected "
        "{'model_id': str, 'version': int}. Update asyncrl on its host",
        peer=peer, remote_type="asyncrl.weights.WeightSyncError")


def bad_ack(peer: bytes, version: int, sent: int, latest: int) -> RemoteError:
    return RemoteError(
        f"worker acknowledged version {version} for a send of version {sent}; expected "
        f"{sent}..{latest} (newest wins). It may count versions of another trainer "
        "instance: restart it, or update asyncrl on its host",
        peer=peer, remote_type="asyncrl.weights.WeightSyncError")
