"""The transports exception tree.

``TransportError`` is the root. A bad message is a ``ProtocolError``; a peer
that reported a failure is a ``RemoteError``; a peer that went silent is a
``PeerLostError``. Waiting too long raises the builtin ``TimeoutError`` with
the silent peers named in the message.

An exception crosses the wire as an :class:`ErrorPayload`: written once
(:meth:`ErrorPayload.from_exception`), read once (:meth:`ErrorPayload.from_body`
then :meth:`ErrorPayload.to_remote_error`).
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from typing import Any, ClassVar

import anyio

from ._printable import peer_name, printable, printable_block, printable_lines


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
    (what its :class:`ErrorPayload` carried; see :meth:`ErrorPayload.to_remote_error`).
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
        self.remote_type = printable(remote_type, limit=ErrorPayload.MAX_TYPE)
        self.remote_message = printable_lines(message, limit=ErrorPayload.MAX_MESSAGE)
        self.remote_traceback = printable_lines(remote_traceback, indent="", keep="tail",
                                                limit=ErrorPayload.MAX_TRACEBACK)
        where = f" on peer {self.peer!r}" if self.peer is not None else ""
        text = f"{self.remote_type}{where}: {self.remote_message}"
        if self.remote_traceback:
            # Each of its lines indented: none can pass for a line of the trainer's log.
            text += "\n--- remote traceback ---\n" + printable_block(
                self.remote_traceback.rstrip(), limit=2 * ErrorPayload.MAX_TRACEBACK)
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


@dataclass(frozen=True, slots=True)
class ErrorPayload:
    """An exception as it travels: its type path, message and traceback text.

    ``type`` is spelled ``"module.QualName"`` (``"builtins.ValueError"``); it is
    a name to show and to look up in what the reader already imported, never
    something to import. The texts are bounded (longer ones are cut: the
    message keeps its head, the traceback its tail, where the raise is) and
    printable: control, format and line-separator characters are escaped, the
    message's continuation lines indented (see :mod:`transports._printable`).

    >>> payload = ErrorPayload.from_exception(ValueError("bad shape"))
    >>> payload.type, payload.message
    ('builtins.ValueError', 'bad shape')
    >>> ErrorPayload.from_body(payload.to_body()) == payload
    True
    >>> str(payload.to_remote_error(b"w0")).splitlines()[0]
    "builtins.ValueError on peer 'w0': bad shape"
    """

    MAX_TYPE: ClassVar[int] = 500
    MAX_MESSAGE: ClassVar[int] = 65536
    MAX_TRACEBACK: ClassVar[int] = 262144

    type: str
    message: str
    traceback: str = ""

    def __post_init__(self) -> None:
        # Bounded and printable however it was made: a payload is stored, logged and sent
        # on. Escaping twice changes nothing, so a payload relayed reads as sent.
        object.__setattr__(self, "type", printable(self.type, limit=self.MAX_TYPE))
        object.__setattr__(self, "message", printable_lines(self.message, limit=self.MAX_MESSAGE))
        tail = printable_lines(self.traceback[-self.MAX_TRACEBACK:], indent="", keep="tail",
                               limit=self.MAX_TRACEBACK)
        if len(self.traceback) > self.MAX_TRACEBACK:
            tail = "(traceback cut)\n" + tail
        object.__setattr__(self, "traceback", tail)

    @classmethod
    def from_exception(cls, error: BaseException) -> ErrorPayload:
        """The one writer: what ``error`` becomes on the wire.

        A :class:`RemoteError` passed on (a relay forwarding a worker's failure)
        keeps the original's type, message and traceback.
        """
        if isinstance(error, RemoteError):
            return cls(error.remote_type, error.remote_message, error.remote_traceback)
        kind = type(error)
        return cls(f"{kind.__module__}.{kind.__qualname__}", str(error),
                   "".join(traceback.format_exception(error)))

    def to_body(self) -> dict[str, str]:
        return {"type": self.type, "message": self.message, "traceback": self.traceback}

    @classmethod
    def from_body(cls, body: Any, what: str = "error payload") -> ErrorPayload:
        """Read a payload that came from the network; :class:`ProtocolError` names a bad field.

        ``what`` names the message that carries it, for the error text.
        """
        if not isinstance(body, dict):
            raise ProtocolError(f"{what} must be a map with 'type', 'message' and "
                                f"'traceback', got {type(body).__name__}")
        texts = []
        for name in ("type", "message", "traceback"):
            value = body.get(name)
            if not isinstance(value, str):
                raise ProtocolError(f"{what} field {name!r} must be str, "
                                    f"got {type(value).__name__}")
            texts.append(value)
        return cls(*texts)

    def to_remote_error(self, peer: bytes | str | None = None) -> RemoteError:
        """The one reader: the failure as :class:`RemoteError`, raised on this side."""
        return RemoteError(self.message, peer=peer, remote_type=self.type,
                           remote_traceback=self.traceback)
