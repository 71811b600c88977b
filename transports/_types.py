"""Small value types shared by the channels: messages, peer events, tickets."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import anyio

from ._errors import PeerLostError, RemoteError
from ._printable import peer_name


@dataclass(slots=True)
class Message:
    """One received message.

    ``peer`` is the sender's identity on a :class:`Hub` (``b""`` on a
    :class:`Link`, whose only peer is the hub); ``needs_ack`` says the sender
    waits for :meth:`Link.ack`.

    >>> message = await hub.recv()                          # doctest: +SKIP
    >>> message.peer, message.kind, message.needs_ack       # doctest: +SKIP
    (b'worker-0', 'batch', False)
    """

    peer: bytes
    kind: str
    seq: int
    body: Any
    meta: dict[str, Any] = field(default_factory=dict)
    needs_ack: bool = False


@dataclass(frozen=True, slots=True)
class PeerEvent:
    """A peer appeared (first message or heartbeat) or went silent past the timeout.

    ``"returned"``: a peer that was admitted, then lost or expelled, speaks again
    (a frozen process resumed, a cut link restored); it is a stranger until the
    owner admits it again.

    >>> item = await hub.recv()          # a Message, or a PeerEvent        # doctest: +SKIP
    >>> isinstance(item, PeerEvent) and (item.peer, item.event)            # doctest: +SKIP
    (b'worker-0', 'joined')
    """

    peer: bytes
    event: Literal["joined", "lost", "restarted", "returned"]
    #: Why a peer was lost: ``"goodbye"`` (it closed its link), ``"disconnected"``
    #: (its connection closed and it did not reconnect: its process died) or
    #: ``"silent"`` (nothing heard for ``peer_timeout``) or ``"revoked"`` (its CURVE key
    #: was revoked while it ran). Not compared.
    reason: str = field(default="", compare=False)


@dataclass(eq=False)
class Ticket:
    """Tracks the acknowledgements of one :meth:`Hub.send_async`.

    ``acks`` maps each peer that answered to the result it sent back.

    >>> ticket = await hub.send_async([b"w0"], {"w": tensor}, kind="weights")  # doctest: +SKIP
    >>> await hub.wait_ack(ticket, timeout=5)                                 # doctest: +SKIP
    {b'w0': 3}
    """

    seq: int
    peers: frozenset[bytes]
    acks: dict[bytes, Any] = field(default_factory=dict)
    errors: dict[bytes, RemoteError] = field(default_factory=dict)
    lost: set[bytes] = field(default_factory=set)
    done: anyio.Event = field(default_factory=anyio.Event)

    @property
    def pending(self) -> frozenset[bytes]:
        """Peers that have neither acked, failed nor been lost."""
        return self.peers - self.acks.keys() - self.errors.keys() - self.lost

    def resolve(self, peer: bytes, *, result: Any = None, error: RemoteError | None = None,
                lost: bool = False) -> None:
        if peer not in self.pending:
            return  # a duplicate or unsolicited answer changes nothing
        if lost:
            self.lost.add(peer)
        elif error is not None:
            self.errors[peer] = error
        else:
            self.acks[peer] = result
        if not self.pending:
            self.done.set()

    def outcome(self) -> dict[bytes, Any]:
        """Return the acks, or raise the first remote error / the lost peers."""
        if self.errors:
            peer, error = next(iter(self.errors.items()))
            if len(self.errors) > 1:
                others = ", ".join(peer_name(p) for p in self.errors if p != peer)
                error.add_note(f"peers {others} failed too")
            raise error
        if self.lost:
            raise PeerLostError(sorted(self.lost), f"before acknowledging message {self.seq}")
        return dict(self.acks)
