"""An exception as it travels: the one error report of the wire layer.

Written once (:meth:`ErrorPayload.from_exception`), read once
(:meth:`ErrorPayload.from_body`, declared and checked by :mod:`._declared` like
every asyncrl message, then :meth:`ErrorPayload.to_remote_error`).
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from typing import Any, ClassVar, Required

from ._declared import read_fields
from ._errors import (
    PAYLOAD_MAX_MESSAGE,
    PAYLOAD_MAX_TRACEBACK,
    PAYLOAD_MAX_TYPE,
    ProtocolError,
    RemoteError,
)
from ._printable import printable, printable_lines

__all__ = ["ErrorPayload"]


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

    MAX_TYPE: ClassVar[int] = PAYLOAD_MAX_TYPE
    MAX_MESSAGE: ClassVar[int] = PAYLOAD_MAX_MESSAGE
    MAX_TRACEBACK: ClassVar[int] = PAYLOAD_MAX_TRACEBACK
    #: On the wire all three are required, the traceback too (an empty text if none).
    WIRE: ClassVar[dict[str, Any]] = {"traceback": Required[str]}

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

        ``what`` names the message that carries it, for the error text. Its three
        fields are required (every writer sends them; :meth:`from_exception`).
        """
        if not isinstance(body, dict):  # worded here: the fields a payload needs
            raise ProtocolError(f"{what} must be a map with 'type', 'message' and "
                                f"'traceback', got {type(body).__name__}")
        return cls(**read_fields(cls, body, what))

    def to_remote_error(self, peer: bytes | str | None = None) -> RemoteError:
        """The one reader: the failure as :class:`RemoteError`, raised on this side."""
        return RemoteError(self.message, peer=peer, remote_type=self.type,
                           remote_traceback=self.traceback)
