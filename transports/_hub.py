"""The coordinator's end: a ROUTER socket with many identified peers."""

from __future__ import annotations

import errno
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

import anyio
import anyio.abc
import zmq

from ._channel import ACK, BYE, BYE_FINISHED, BYE_REVOKED, PING, Channel, ChannelStatistics
from ._codec import encode_message
from ._descriptors import raise_open_files_limit
from ._disconnects import DisconnectWatch
from ._error_payload import ErrorPayload
from ._errors import PeerLostError, ProtocolError, RemoteError
from ._printable import peer_name
from ._trust import tighten_for_curve, warn_if_exposed
from ._types import Message, PeerEvent, Ticket

log = logging.getLogger("transports")

MAX_PENDING_TICKETS = 4096
#: With ``admission=True``: the largest message a peer that was not admitted may send
#: (a hello with env specs fits), and how many such strangers are tracked at once.
STRANGER_MAX_BYTES = 1 << 20
MAX_STRANGERS = 256
#: Seconds a connection may take to finish its ZeroMQ handshake (greeting, and CURVE's
#: keys) before the hub drops it (libzmq's default: 30 s). A real peer does it in a
#: few round trips, in ZeroMQ's I/O thread (a busy event loop does not slow it); one
#: that drips its greeting only holds a descriptor, and a flood of them would hold
#: them all.
HANDSHAKE_TIMEOUT = 5.0

#: How long after a connection closed the hub looks which peer lost its route
#: (see :mod:`transports._disconnects`): a live DEALER reconnects well within it.
DISCONNECT_GRACE = 0.5


class Hub(Channel):
    """Many peers, each known by its identity; sends that peers acknowledge.

    Bind with ``async with``; ``endpoint`` then holds the real address (the
    port chosen for ``tcp://HOST:0``). ``recv()`` yields :class:`Message` and
    :class:`PeerEvent` items in arrival order. A peer is *joined* from its first
    message or heartbeat and *lost* when it says goodbye (its link closed), when
    its connection closes and it has not reconnected ``disconnect_grace`` s later
    (its process died: see :mod:`transports._disconnects`; None: silence only), or
    after ``peer_timeout`` seconds of silence (a frozen process, a dead host, a cut
    network). The lost event's ``reason`` says which.

    With ``admission=True`` (a hub that listens on a network) the owner decides
    who is a peer: :meth:`admit` after it authenticated a hello, :meth:`expel`
    when it refuses or drops one. Until admitted, a connection is a *stranger*:
    its messages above ``stranger_max_bytes`` are dropped unread (counted in
    ``statistics().bad_messages``), it produces no joined/lost events, and at most
    ``max_strangers`` of them are tracked (the longest silent one is forgotten
    first). An admitted peer is lost as usual and is then a stranger again.
    Bound ``max_bytes`` too: ZeroMQ assembles a whole message (up to that size)
    before anyone can look at who sent it.

    Each connection holds a descriptor from the moment it is accepted: one that
    has not finished its handshake within ``handshake_timeout`` seconds is
    dropped, and binding raises the process's open-files soft limit to its hard
    limit (once), so that a flood of half-open connections leaves room for the
    real peers.

    Identities are routing addresses, not credentials. Without CURVE,
    ``ROUTER_HANDOVER`` lets a reconnecting peer take its route back, so whoever
    presents an identity gets that peer's messages; peers therefore use
    unguessable identities (128 random bits, see ``transports.random_identity``),
    but on plain ``tcp://`` they travel in clear text. With CURVE (``curve=``)
    every connection is authenticated and encrypted, a live peer's route is
    never handed over, and each identity is bound to the key it came with: a
    copied identity presented with another key takes nothing over. Keys revoked
    while the hub runs are disconnected (see ``docs/security.md``).

    >>> async with Hub("tcp://127.0.0.1:0") as hub:          # doctest: +SKIP
    ...     item = await hub.recv()                         # PeerEvent(b"w0", "joined")
    ...     ticket = await hub.send_async([b"w0"], {"w": torch.ones(3)}, kind="weights")
    ...     acks = await hub.wait_ack(ticket, timeout=5)    # {b"w0": <ack result>}
    """

    _socket_type = zmq.ROUTER
    _leading_bytes = 2  # [identity, header]

    def __init__(self, endpoint: str = "tcp://127.0.0.1:0", *, admission: bool = False,
                 stranger_max_bytes: int = STRANGER_MAX_BYTES,
                 max_strangers: int = MAX_STRANGERS,
                 handshake_timeout: float = HANDSHAKE_TIMEOUT,
                 disconnect_grace: float | None = DISCONNECT_GRACE, **options: Any) -> None:
        super().__init__(endpoint, **options)
        self.handshake_timeout = handshake_timeout
        if disconnect_grace is not None and disconnect_grace < 0:
            raise ValueError(f"disconnect_grace must be >= 0 or None, got {disconnect_grace}")
        self.disconnect_grace = disconnect_grace
        self._disconnects: DisconnectWatch | None = None
        self.instance = secrets.token_hex(8)  # told to every peer in the pings
        self._finished = False  # the goodbye at close says "finished" (see finish())
        self.admission = admission
        self.stranger_max_bytes = stranger_max_bytes
        self.max_strangers = max(1, max_strangers)
        self._last_seen: dict[bytes, float] = {}  # live peers (admitted and strangers)
        self._admitted: set[bytes] = set()
        self._dropped: OrderedDict[bytes, None] = OrderedDict()  # admitted, then lost/expelled
        self._strangers: dict[bytes, None] = {}  # admission: live strangers, oldest first
        self._tickets: dict[int, Ticket] = {}

    def _ping_meta(self) -> dict[str, Any]:
        # A restarted coordinator is a new instance: its links see the change and
        # their workers join again instead of waiting for orders that never come.
        return {"hub": self.instance}

    @property
    def peers(self) -> frozenset[bytes]:
        """Identities of the peers currently alive (with ``admission``: admitted ones)."""
        if self.admission:
            return frozenset(p for p in self._last_seen if p in self._admitted)
        return frozenset(self._last_seen)

    def last_heard(self, peer: bytes) -> float | None:
        """``time.monotonic()`` when ``peer`` was last heard (any message or heartbeat);
        None if it is not a live peer."""
        return self._last_seen.get(peer)

    def admit(self, peer: bytes) -> None:
        """Make ``peer`` a full peer: any message size, liveness events (``admission``)."""
        self._admitted.add(peer)
        self._dropped.pop(peer, None)
        self._strangers.pop(peer, None)
        self._last_seen.setdefault(peer, time.monotonic())

    def expel(self, peer: bytes) -> None:
        """Drop ``peer`` (refused, or dropped by the owner): the acks it owes are
        abandoned (``wait_ack`` reports it lost at once), with ``admission`` it is a
        stranger again, and if it speaks again the hub reports it (``"returned"``, or
        ``"joined"`` without admission). No "lost" event: the owner knows."""
        admitted = peer in self._admitted
        self._admitted.discard(peer)
        if self._last_seen.pop(peer, None) is not None or admitted:
            self._strangers.pop(peer, None)  # re-tracked as a stranger if it speaks again
            self._abandon_tickets(peer)
        if admitted:
            self._remember_dropped(peer)

    def _prepare(self, socket: zmq.Socket[Any]) -> None:
        socket.setsockopt(zmq.ROUTER_MANDATORY, 1)  # unknown peer: an error, not a silent drop
        # Without CURVE a peer that reconnects takes its name back (handover). With
        # CURVE a live route is never handed over: see transports._trust.
        socket.setsockopt(zmq.ROUTER_HANDOVER, 0 if self.curve else 1)
        if self.curve:
            tighten_for_curve(socket, self.peer_timeout)
        socket.setsockopt(zmq.HANDSHAKE_IVL, max(1, int(self.handshake_timeout * 1000)))
        raise_open_files_limit()  # once per process: one descriptor per connection
        if self.disconnect_grace is not None:
            self._disconnects = DisconnectWatch(self._context, socket, self.disconnect_grace,
                                                self._probe_routes)
        socket.bind(self.endpoint)  # (on failure, _before_close stops the monitor)
        self.endpoint = socket.getsockopt_string(zmq.LAST_ENDPOINT)
        warn_if_exposed(self.endpoint, curve=self.curve is not None)

    def _start_watchers(self, tg: anyio.abc.TaskGroup) -> None:
        if self._disconnects is not None:
            tg.start_soon(self._disconnects.run)

    def _before_close(self, socket: zmq.Socket[Any]) -> None:
        if self._disconnects is not None:
            self._disconnects.close(socket)

    def _probe_routes(self) -> None:
        """After connections closed: a peer with no route left is gone (its process died)."""
        assert self._io is not None
        for peer in list(self._last_seen):
            if self._io.routable([peer, *self._ping]):
                continue
            del self._last_seen[peer]
            if peer in self._strangers:
                del self._strangers[peer]  # a stranger leaves no trace
            else:
                self._lose(peer, "disconnected")

    # -- API -------------------------------------------------------------------------
    async def recv(self) -> Message | PeerEvent:
        """The next message or peer event; ``ClosedResourceError`` once closed."""
        return await self._next_item()

    def recv_nowait(self) -> Message | PeerEvent | None:
        return self._next_item_nowait()

    def __aiter__(self) -> Hub:
        return self

    async def __anext__(self) -> Message | PeerEvent:
        return await self.recv()

    async def send(self, peer: bytes, body: Any, *, kind: str = "data",
                   meta: dict[str, Any] | None = None) -> None:
        """Queue ``body`` for ``peer``; raises :class:`PeerLostError` if it is not connected.

        Tensors travel without a copy: ZeroMQ reads their memory after this
        returns (over ``inproc://`` the receiver even gets that memory itself).
        Do not modify them in place until the peer has them (acked), or send a
        clone.
        """
        frames = encode_message(body, kind=kind, seq=self._next_seq(), meta=meta)
        await self._send_to(peer, frames)

    async def send_async(self, peers: Iterable[bytes], body: Any, *, kind: str = "data",
                         meta: dict[str, Any] | None = None) -> Ticket:
        """Send ``body`` to every peer in ``peers`` and return a :class:`Ticket` for the acks.

        The body is encoded once, whatever the number of peers. Returns once the
        message is queued for all of them; a peer that is not connected counts as
        lost on the ticket.
        """
        targets = frozenset(peers)
        seq = self._next_seq()
        frames = encode_message(body, kind=kind, seq=seq, meta=meta, ack=True)
        ticket = Ticket(seq=seq, peers=targets)
        if not targets:
            ticket.done.set()
            return ticket
        self._register(ticket)
        for peer in targets:
            try:
                await self._send_to(peer, frames)
            except PeerLostError:
                ticket.resolve(peer, lost=True)
        if not ticket.pending:
            self._tickets.pop(seq, None)  # nothing more can arrive for it
        return ticket

    async def wait_ack(self, ticket: Ticket, timeout: float | None = None) -> dict[bytes, Any]:
        """Wait until every peer of ``ticket`` acknowledged; return ``{peer: result}``.

        Raises :class:`RemoteError` when a peer answered with an error,
        :class:`PeerLostError` when a peer went silent and ``TimeoutError``
        naming the peers that did not answer within ``timeout`` seconds.
        """
        with anyio.move_on_after(timeout):
            await ticket.done.wait()
        pending = ticket.pending
        if pending and self._closing:
            raise self._closed_error()
        if pending:
            names = ", ".join(sorted(peer_name(p) for p in pending))
            raise TimeoutError(
                f"no acknowledgement of message {ticket.seq} within {timeout} s from "
                f"peer(s) {names}; they may be busy, stuck or gone"
            )
        return ticket.outcome()

    def statistics(self) -> ChannelStatistics:
        return ChannelStatistics(len(self.peers), self._received, self._sent, self._bad,
                                 len(self._inbox), len(self._tickets))

    # -- internals ------------------------------------------------------------------------
    def _register(self, ticket: Ticket) -> None:
        if len(self._tickets) >= MAX_PENDING_TICKETS:
            # Nobody is waiting for the oldest tickets any more: forget them.
            del self._tickets[next(iter(self._tickets))]
        self._tickets[ticket.seq] = ticket

    async def _send_to(self, peer: bytes, frames: list[Any]) -> None:
        try:
            await self._send_frames([peer, *frames])
        except _Unreachable:
            raise PeerLostError([peer], "(not connected to this hub)") from None

    def _translate_send_error(self, exc: zmq.ZMQError) -> Exception:
        if exc.errno == errno.EHOSTUNREACH:
            return _Unreachable()
        return super()._translate_send_error(exc)

    def _handle(self, frames: list[Any]) -> Message | None:
        if len(frames) < 2:
            return None
        if self._trust is not None:  # CURVE: the identity must come with its own key
            peer = self._trust.screen(frames[0])
            if peer is None:
                self._bad += 1
                return None
        else:
            peer = frames[0]
        stranger = self.admission and peer not in self._admitted
        if stranger and not self._small(frames):
            return None  # before any decoding: an unknown peer's bulk is never looked at
        message = self._decode(frames[1:], origin=repr(peer))
        if message is None:
            return None  # garbage does not make a peer (nor keep one alive)
        if message.kind == BYE:
            if self._last_seen.pop(peer, None) is not None:
                self._strangers.pop(peer, None)
                if not stranger:
                    self._lose(peer, "goodbye")
            return None
        if peer in self._last_seen:
            self._last_seen[peer] = time.monotonic()
            if stranger:
                self._strangers[peer] = self._strangers.pop(peer, None)  # newest last
        elif stranger:
            self._meet(peer)
        else:
            self._join(peer)
        if message.kind == PING:
            return None
        if message.kind == ACK:
            if not stranger:  # a stranger has nothing to acknowledge
                self._on_ack(peer, message.seq, message.body, message.meta)
            return None
        return Message(peer, message.kind, message.seq, message.body, message.meta,
                       message.needs_ack)

    def _small(self, frames: list[Any]) -> bool:
        size = sum(len(frame) for frame in frames[1:])
        if size <= self.stranger_max_bytes:
            return True
        self._bad += 1
        self._limited_log.warning(
            "stranger-size", "dropped a %d-byte message from %r, a peer that was not "
            "admitted (at most %d bytes until a hello is accepted)", size, frames[0],
            self.stranger_max_bytes)
        return False

    def _meet(self, peer: bytes) -> None:
        """A stranger's first message: tracked (bounded table), pinged, no event."""
        if len(self._strangers) >= self.max_strangers:
            oldest = next(iter(self._strangers))  # the longest silent one
            del self._strangers[oldest]
            self._last_seen.pop(oldest, None)
        self._strangers[peer] = None
        self._last_seen[peer] = time.monotonic()
        assert self._io is not None
        self._io.try_send([peer, *self._ping], from_handle=True)
        if self._dropped.pop(peer, 0) is None:
            # Admitted once, dropped, heard again: its owner may ask it to join again.
            self._inbox.put_nowait(PeerEvent(peer, "returned"), force=True)

    def _join(self, peer: bytes) -> None:
        self._last_seen[peer] = time.monotonic()
        # A ping at once tells the newcomer our instance before any answer of ours
        # (one pipe keeps its order): a link that was answered by us knows who we
        # were, and sees a successor as a restart, even if we die before our first
        # heartbeat. A hub that died that early was seen as the first instance of
        # its successor, and the link waited for orders that never came.
        assert self._io is not None
        self._io.try_send([peer, *self._ping], from_handle=True)
        # Like "lost", never held back by a full queue: one event per peer.
        self._inbox.put_nowait(PeerEvent(peer, "joined"), force=True)

    def _on_ack(self, peer: bytes, seq: int, body: Any, meta: dict[str, Any]) -> None:
        ticket = self._tickets.get(seq)
        if ticket is None:
            return  # late or unsolicited: nothing waits for it
        if meta.get("error"):
            ticket.resolve(peer, error=_remote_error(peer, body))
        else:
            ticket.resolve(peer, result=body)
        if not ticket.pending:
            del self._tickets[seq]

    def _send_pings(self, ping: list[Any]) -> None:
        assert self._io is not None
        for peer in list(self._last_seen):
            # Unroutable or full: the liveness check decides, from what the peer sends.
            self._io.try_send([peer, *ping])

    def _check_liveness(self, now: float) -> None:
        if self._trust is not None:
            self._expel_revoked()
        for peer, seen in list(self._last_seen.items()):
            if self._silence(seen, now) > self.peer_timeout:
                del self._last_seen[peer]
                if peer in self._strangers:
                    del self._strangers[peer]  # a stranger leaves no trace
                else:
                    self._lose(peer, "silent")

    def _expel_revoked(self) -> None:
        """Peers whose CURVE key was revoked since they joined: told goodbye, lost."""
        assert self._trust is not None and self._io is not None
        for peer in self._trust.revoked(self._last_seen):
            del self._last_seen[peer]
            stranger = peer in self._strangers
            self._strangers.pop(peer, None)
            # A polite one leaves; it is told why: a refusal, not a closed hub.
            self._io.try_send([peer, *encode_message(BYE_REVOKED, kind=BYE)])
            key = self._trust.key_of(peer) or b""
            log.warning("disconnected %r: its CURVE key (%s) was revoked", peer,
                        self._trust.keys.name_of(key))
            if not stranger:
                self._lose(peer, "revoked")
        self._trust.forget_unless(
            lambda p: p in self._last_seen or p in self._admitted or p in self._dropped)

    def finish(self) -> None:
        """Say at close that this hub's owner is done for good (its run is over).

        Every peer heard from, admitted or not yet, gets a goodbye that says so
        (:attr:`Link.hub_finished`): a worker still asking to join goes home
        instead of taking the silence for a trainer it failed to reach.
        """
        self._finished = True

    def _farewell(self, socket: zmq.Socket[Any]) -> None:
        # Links report the hub lost at once instead of after their peer timeout.
        bye = encode_message(BYE_FINISHED if self._finished else None, kind=BYE)
        for peer in self._last_seen:
            try:
                socket.send_multipart([peer, *bye], zmq.NOBLOCK)
            except zmq.ZMQError:
                pass

    def _on_close(self) -> None:
        # Wake every wait_ack(): it raises ClosedResourceError instead of waiting forever.
        for ticket in self._tickets.values():
            ticket.done.set()
        self._tickets.clear()

    def _lose(self, peer: bytes, reason: str) -> None:
        if peer in self._admitted:
            self._remember_dropped(peer)
        self._admitted.discard(peer)  # it must be admitted again (a new hello)
        self._abandon_tickets(peer)
        # Not held back by a full queue: events are few (one per peer) and must not wait.
        self._inbox.put_nowait(PeerEvent(peer, "lost", reason), force=True)


    def _remember_dropped(self, peer: bytes) -> None:
        # Bounded: only to tell the owner that a peer it had admitted speaks again.
        self._dropped[peer] = None
        self._dropped.move_to_end(peer)
        while len(self._dropped) > self.max_strangers:
            self._dropped.popitem(last=False)

    def _abandon_tickets(self, peer: bytes) -> None:
        for seq, ticket in list(self._tickets.items()):
            ticket.resolve(peer, lost=True)
            if not ticket.pending:
                del self._tickets[seq]


class _Unreachable(Exception):
    pass


def _remote_error(peer: bytes, body: Any) -> RemoteError:
    try:
        payload = ErrorPayload.from_body(body, "error acknowledgement")
    except ProtocolError as exc:  # the peer failed and said so badly: still its failure
        payload = ErrorPayload("transports.ProtocolError", f"a malformed error: {exc}")
    return payload.to_remote_error(peer)
