"""The transports exception tree.

``TransportError`` is the root. A bad message is a ``ProtocolError``; a peer
that reported a failure is a ``RemoteError``; a peer that went silent is a
``PeerLostError``. Waiting too long raises the builtin ``TimeoutError`` with
the silent peers named in the message.
"""

from __future__ import annotations

import anyio


class TransportError(Exception):
    """Base class of every error raised by :mod:`transports`."""


class ProtocolError(TransportError):
    """A message broke the wire protocol (malformed, too large, unknown dtype...).

    The receiving loop survives: it drops the message and counts it.
    """


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
        names = ", ".join(p.decode(errors="replace") for p in self.peers)
        super().__init__(
            f"peer(s) {names} went silent (no heartbeat) {what}".rstrip()
            + "; check that the process is alive and the network path is up"
        )


class RemoteError(TransportError):
    """A peer reported that handling our message failed.

    ``peer`` names the peer, ``remote_type`` is ``"module.QualName"`` of the
    exception raised over there and ``remote_traceback`` its traceback text.
    """

    def __init__(
        self,
        message: str,
        *,
        peer: bytes | str | None = None,
        remote_type: str = "Exception",
        remote_traceback: str = "",
    ) -> None:
        self.peer = peer.decode(errors="replace") if isinstance(peer, bytes) else peer
        self.remote_type = remote_type
        self.remote_message = message
        self.remote_traceback = remote_traceback
        where = f" on peer {self.peer!r}" if self.peer is not None else ""
        text = f"{remote_type}{where}: {message}"
        if remote_traceback:
            text += f"\n--- remote traceback ---\n{remote_traceback.rstrip()}"
        super().__init__(text)

    def __reduce__(self):  # keep it picklable between our own processes
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
