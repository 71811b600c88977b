"""An in-memory transport with the sending half of ``Hub`` and the acking half of ``Link``.

It carries weights for collectors that run as tasks in the trainer's own
process (no socket, and no copy where the model object is shared), and it is
the fake transport of the weight tests: ``encode=True`` sends every body
through the real codec so that what works here also travels over ZeroMQ.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import anyio
import msgpack

from ._codec import decode_message, encode_message
from ._error_payload import ErrorPayload
from ._errors import PeerLostError
from ._printable import peer_name
from ._types import Message, Ticket

__all__ = ["LocalHub", "LocalLink"]

Deliver = Callable[[Message], Any]


class LocalHub:
    """In-process stand-in for :class:`transports.Hub`: ``send_async`` / ``wait_ack``.

    Each connected peer either gets messages through a ``deliver`` callback
    (called synchronously inside ``send_async``) or queues them for
    :meth:`LocalLink.recv`.

    >>> hub = LocalHub()
    >>> link = hub.connect(b"w0")
    >>> # in a task: ticket = await hub.send_async([b"w0"], {"x": 1}, kind="weights")
    >>> #            msg = await link.recv(); await link.ack(msg, {"version": 1})
    """

    def __init__(self, *, encode: bool = False) -> None:
        self.encode = encode
        self._links: dict[bytes, LocalLink] = {}
        self._tickets: dict[int, Ticket] = {}
        self._seq = 0

    @property
    def peers(self) -> frozenset[bytes]:
        """Identities of the connected links."""
        return frozenset(self._links)

    def connect(self, peer: bytes, deliver: Deliver | None = None) -> LocalLink:
        """A new link for ``peer``; messages go to ``deliver`` or to ``link.recv()``."""
        link = LocalLink(self, peer, deliver)
        self._links[peer] = link
        return link

    def lose(self, peer: bytes) -> None:
        """Declare ``peer`` gone: its pending acknowledgements fail with ``PeerLostError``."""
        self._links.pop(peer, None)
        for ticket in list(self._tickets.values()):
            ticket.resolve(peer, lost=True)

    async def send(self, peer: bytes, body: Any, *, kind: str = "data",
                   meta: dict[str, Any] | None = None) -> None:
        self._seq += 1
        self._deliver(peer, self._message(body, kind, self._seq, meta, needs_ack=False))

    async def send_async(self, peers: Iterable[bytes], body: Any, *, kind: str = "data",
                         meta: dict[str, Any] | None = None) -> Ticket:
        self._seq += 1
        ticket = Ticket(seq=self._seq, peers=frozenset(peers))
        self._tickets[ticket.seq] = ticket
        if not ticket.peers:
            ticket.done.set()
        for peer in ticket.peers:
            # Decode per peer, as each real peer would: nobody shares received tensors.
            message = self._message(body, kind, ticket.seq, meta, needs_ack=True)
            try:
                self._deliver(peer, message)
            except PeerLostError:
                ticket.resolve(peer, lost=True)
        return ticket

    async def wait_ack(self, ticket: Ticket, timeout: float | None = None) -> dict[bytes, Any]:
        with anyio.move_on_after(timeout):
            await ticket.done.wait()
        if ticket.pending:
            names = ", ".join(sorted(peer_name(p) for p in ticket.pending))
            raise TimeoutError(f"no acknowledgement of message {ticket.seq} within {timeout} s "
                               f"from peer(s) {names}")
        return ticket.outcome()

    # -- internals ------------------------------------------------------------------------
    def _message(self, body: Any, kind: str, seq: int, meta: dict[str, Any] | None,
                 needs_ack: bool) -> Message:
        meta = dict(meta or {})
        if self.encode:
            decoded = decode_message(encode_message(body, kind=kind, seq=seq, meta=meta))
            body, meta = decoded.body, decoded.meta
        return Message(b"", kind, seq, body, meta, needs_ack)

    def _deliver(self, peer: bytes, message: Message) -> None:
        link = self._links.get(peer)
        if link is None:
            raise PeerLostError([peer], "(not connected to this hub)")
        link._push(message)

    def _on_ack(self, peer: bytes, seq: int, result: Any, error: BaseException | None) -> None:
        ticket = self._tickets.get(seq)
        if ticket is None:
            return
        if error is not None:
            payload = ErrorPayload.from_exception(error)
            if self.encode:  # read back as a Hub reads it
                payload = ErrorPayload.from_body(msgpack.unpackb(msgpack.packb(payload.to_body())))
            ticket.resolve(peer, error=payload.to_remote_error(peer))
        else:
            if self.encode:
                result = msgpack.unpackb(msgpack.packb(result))
            ticket.resolve(peer, result=result)
        if not ticket.pending:
            del self._tickets[seq]


class LocalLink:
    """The worker's end of a :class:`LocalHub`: ``recv()`` and ``ack()`` like a ``Link``.

    >>> hub = LocalHub()
    >>> link = hub.connect(b"worker-0")
    >>> sorted(hub.peers)
    [b'worker-0']
    >>> message = await link.recv()           # doctest: +SKIP
    >>> await link.ack(message, result=1)     # doctest: +SKIP
    """

    def __init__(self, hub: LocalHub, identity: bytes, deliver: Deliver | None) -> None:
        self.identity = identity
        self._hub = hub
        self._deliver = deliver
        self._send, self._recv = anyio.create_memory_object_stream[Message](math.inf)

    def _push(self, message: Message) -> None:
        if self._deliver is not None:
            self._deliver(message)
        else:
            self._send.send_nowait(message)

    async def recv(self) -> Message:
        return await self._recv.receive()

    def recv_nowait(self) -> Message | None:
        try:
            return self._recv.receive_nowait()
        except anyio.WouldBlock:
            return None

    async def ack(self, message: Message, result: Any = None, *,
                  error: BaseException | None = None) -> None:
        self._hub._on_ack(self.identity, message.seq, result, error)
