"""The transports exception tree.

``TransportError`` is the root. A bad message is a ``ProtocolError``; a peer
that reported a failure is a ``RemoteError``; a peer that went silent is a
``PeerLostError``. Waiting too long raises the builtin ``TimeoutError`` with
the silent peers named in the message.

An exception crosses the wire as an :class:`~transports.ErrorPayload`
(:mod:`._error_payload`); a :class:`RemoteError` holds what one carried, bounded
as it is (:data:`PAYLOAD_MAX_TYPE`, :data:`PAYLOAD_MAX_MESSAGE`, :data:`PAYLOAD_MAX_TRACEBACK`).
"""

from __future__ import annotations

from typing import Any, ClassVar

import anyio

from ._printable import peer_name, printable, printable_block, printable_lines

#: The bounds of a peer's error texts (an :class:`~transports.ErrorPayload`'s, a
#: :class:`RemoteError`'s): its exception type's name, its message, its traceback.
PAYLOAD_MAX_TYPE = 500
PAYLOAD_MAX_MESSAGE = 65536
PAYLOAD_MAX_TRACEBACK = 262144


class TransportError(Exception):
    """Base class of every error raised by :mod:`transports`."""


class ProtocolError(TransportError):
    """A message broke the wire protocol (malformed, too large, unknown dtype...).

    The receiving loop survives: it drops the message and counts it. Its text
    often quotes what the peer sent and is logged: it is made printable
    (see :mod:`transports._printable`) and bounded to ``MAX_MESSAGE`` characters.
    """

    MAX_MESSAGE: ClassVar[int] = 8192

    def __init__(self, message: object = "", *args: object) -> None:
        if isinstance(message, str):
            message = printable_lines(message, limit=self.MAX_MESSAGE)
        super().__init__(message, *args)


class ClosedResourceError(TransportError, anyio.ClosedResourceError):
    """The channel was closed by this process (``aclose()`` was called).

    It is also an :class:`anyio.ClosedResourceError`, so code written against
    anyio's streams catches it with the exception it already knows ("you
    closed it"), kept apart from :class:`PeerLostError` ("the peer broke it").
    """


class PeerLostError(TransportError):
    """A peer stopped answering heartbeats before it acknowledged a message."""

    def __init__(self, peers: list[bytes], what: str = "") -> None:
        self.peers = list(peers)
        names = ", ".join(peer_name(p) for p in self.peers)
        super().__init__(
            f"peer(s) {names} went silent (no heartbeat) {what}".rstrip()
            + "; check that the process is alive and the network path is up"
        )


class RemoteError(TransportError):
    """A peer reported that handling our message failed.

    ``peer`` names the peer, ``remote_type`` is ``"module.QualName"`` of the
    exception raised over there and ``remote_traceback`` its traceback text
    (what its :class:`~transports.ErrorPayload` carried; see its ``to_remote_error``).
    """

    def __init__(
        self,
        message: str,
        *,
        peer: bytes | str | None = None,
        remote_type: str = "Exception",
        remote_traceback: str = "",
    ) -> None:
        # A peer's words, printable however this was made (see transports._printable).
        self.peer = (peer_name(peer) if isinstance(peer, bytes)
                     else None if peer is None else printable(peer, limit=255))
        self.remote_type = printable(remote_type, limit=PAYLOAD_MAX_TYPE)
        self.remote_message = printable_lines(message, limit=PAYLOAD_MAX_MESSAGE)
        self.remote_traceback = printable_lines(remote_traceback, indent="", keep="tail",
                                                limit=PAYLOAD_MAX_TRACEBACK)
        where = f" on peer {self.peer!r}" if self.peer is not None else ""
        text = f"{self.remote_type}{where}: {self.remote_message}"
        if self.remote_traceback:
            # Each of its lines indented: none can pass for a line of the trainer's log.
            text += "\n--- remote traceback ---\n" + printable_block(
                self.remote_traceback.rstrip(), limit=2 * PAYLOAD_MAX_TRACEBACK)
        super().__init__(text)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:  # picklable between our processes
        return (
            _rebuild_remote_error,
            (self.remote_message, self.peer, self.remote_type, self.remote_traceback),
        )


def _rebuild_remote_error(
    message: str, peer: str | None, remote_type: str, remote_traceback: str
) -> RemoteError:
    return RemoteError(
        message, peer=peer, remote_type=remote_type, remote_traceback=remote_traceback
    )
