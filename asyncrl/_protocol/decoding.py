"""The one place a peer's message body becomes a typed message: :func:`decode`.

Whatever a body holds, decoding it either returns the message or raises
:class:`transports.ProtocolError` naming the kind, what was expected and what
came: an exception of any other type raised while decoding (a TensorDict
refusing a key path, a torch error on a hostile shape) is a bug in a check, and
must still cost the peer its message, never the loop that read it. Only the
decoding is covered: what the caller does with a decoded message is its own
logic, and its errors stay errors.

>>> from asyncrl._protocol import Progress
>>> decode(Progress, {"request": 3, "steps": 120})
Progress(request=3, steps=120)
>>> decode(Progress, {"request": 3, "steps": -1})
Traceback (most recent call last):
...
transports._errors.ProtocolError: progress steps must be in 0..2**63-1, got -1
"""

from __future__ import annotations

from typing import Any, Protocol, Self, TypeVar

from transports import ProtocolError, printable

__all__ = ["Decodable", "decode"]


class Decodable(Protocol):
    KIND: str

    @classmethod
    def from_body(cls, body: Any) -> Self: ...


M = TypeVar("M", bound=Decodable)


def decode(kind: type[M], body: Any, **bounds: Any) -> M:
    """``kind.from_body(body, **bounds)``: a ``kind`` message, or :class:`ProtocolError`.

    ``bounds`` are what this side asked for (a batch's ``max_frames``): sizes a
    peer claims are checked against them before anything is allocated from them.
    """
    try:
        message: M = kind.from_body(body, **bounds)
    except ProtocolError:
        raise
    except Exception as exc:  # a hostile body, whatever tripped on it
        raise ProtocolError(f"{kind.KIND} message could not be decoded: "
                            f"{type(exc).__name__}: {printable(str(exc), limit=300)} "
                            f"(expected a well-formed {kind.KIND} body)") from exc
    return message
