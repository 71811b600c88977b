"""A weight send while it waits for its acknowledgements.

A :class:`Sent` is one version sent to some workers: one hub message per
:class:`Part` (to workers directly, or to one relay for its members), read
into ``{worker_id: version applied}`` and errors once nothing is pending. What
is on its way to each worker (newest wins) is :mod:`._newest`'s. The
:class:`~asyncrl.weights.WeightSender` owns them.

A send to a host's relay names the members in its
:class:`~asyncrl._protocol.WeightMeta` (``relay_to``); the relay acks with a
:class:`~asyncrl._protocol.RelayAck` for all of them, which
:func:`parse_relay_ack` reads as hostile input: anything malformed counts as a
failure of every member, never a crash.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from transports import PeerLostError, ProtocolError, RemoteError, Ticket, peer_name

from .._protocol import RelayAck, WeightsApplied, decode

__all__ = ["Part", "Sent", "first_error", "gone_part", "parse_relay_ack", "timeout_error"]


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

    def annotate(self, error: BaseException, model_id: str) -> BaseException:
        """``error`` with a note naming this send: its version, model and workers."""
        ids = sorted(w for part in self.parts for w in part.workers.values())
        error.add_note(f"while sending version {self.version} of model {model_id!r} "
                       f"to worker(s) {ids}")
        return error

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
                        version = decode(WeightsApplied, result).version
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
            via = peer_name(part.relay)
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


def timeout_error(model_id: str, late: list[Sent], timeout: float | None) -> TimeoutError:
    """The error of a ``wait_ack`` that timed out: the versions, workers and peers still silent."""
    parts = [part for s in late for part in s.parts]
    silent = sorted({w for part in parts for w in part.silent()})
    peers = sorted({peer_name(p) for part in parts for p in part.ticket.pending})
    versions = sorted({s.version for s in late})
    return TimeoutError(
        f"model {model_id!r}: no acknowledgement of version(s) {versions} within "
        f"{timeout} s from worker(s) {silent} (peers {', '.join(peers)}); they may be busy, "
        "stuck or gone. The sends stay outstanding: call wait_ack() again to keep waiting."
    )


def parse_relay_ack(result: Any, members: dict[bytes, int], relay: bytes, sent: int,
                    latest: int) -> tuple[dict[int, int], dict[int, BaseException]]:
    """Read a relay's ack: ``({worker_id: version}, {worker_id: error})`` over ``members``.

    ``members`` maps each member identity the message was relayed to onto its
    worker id. A member the answer does not account for, or one that claims a
    version outside ``sent..latest`` (newest wins: a worker may ack version
    ``sent`` with a newer one it applied), is a failure, so a faulty relay cannot
    make ``wait_ack`` report an update nobody applied.
    """
    via = peer_name(relay)
    try:
        ack = decode(RelayAck, result)
    except ProtocolError as exc:
        ack, why = RelayAck("", {}), f"; its ack is malformed: {exc}"
    else:
        why = ""
    applied: dict[int, int] = {}
    errors: dict[int, BaseException] = {}
    for member, worker_id in members.items():
        version = ack.versions.get(member)
        if version is not None and sent <= version <= latest:
            applied[worker_id] = version
        elif member in ack.failed:
            errors[worker_id] = _failure_error(member, ack, via)
        else:
            errors[worker_id] = RemoteError(
                f"relay {via} acknowledged without a valid version for this worker "
                f"(got {version!r}); expected an int in {sent}..{latest}{why}",
                peer=member, remote_type="asyncrl.weights.RelayProtocolError")
    return applied, errors


def _failure_error(member: bytes, ack: RelayAck, via: str) -> BaseException:
    failure = ack.failed[member]
    if failure.type == RelayAck.LOST_TYPE:
        return PeerLostError([member], f"(relay {via}: {failure.message})")
    error = failure.to_remote_error(member)
    error.add_note(f"reported by relay {via}")
    return error
