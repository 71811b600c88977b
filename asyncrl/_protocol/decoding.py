"""The one place a peer's message body becomes a typed message.

Each message kind is declared once, as its dataclass: the fields' types are
what the wire must hold, ``Annotated[int, msgspec.Meta(ge=..., le=...)]`` bounds
them, and two markers say what happens to a peer's text after it is checked:
:class:`Text` (made printable, cut at a limit: see :mod:`transports._printable`)
and :class:`Tree` (a nested map whose every string is made printable). The
mechanism is transports' (``transports.declared``: its error payload is declared
the same way): :func:`read` checks a body against a kind's declaration (with
msgspec, strictly: a bool is no int, a string no bytes; unknown fields are
ignored, so a newer peer may add some), runs the dataclass's ``__post_init__``
(its cross-field rules) and turns msgspec's complaint into a
:class:`transports.ProtocolError` naming the kind, the field, what was expected
and what came. A kind whose wire form differs from its fields (a log record
travels as a list) says so in its ``WIRE`` class variable: ``{field: wire type}``,
``None`` for a field read elsewhere (an error report's payload), ``Required[T]`` for
a field the wire must carry though its dataclass has a default (a relay ack's failures).

:func:`decode` is what a receiving loop calls: ``kind.from_body(body, **bounds)``,
and whatever a body trips on while it is decoded (a TensorDict refusing a key
path, a torch error on a hostile shape) is a :class:`ProtocolError` too: it
costs the peer its message, never the loop that read it. Only the decoding is
covered: what the caller does with a decoded message is its own logic, and its
errors stay errors. ``bounds`` are what this side asked for (a batch's
``max_frames``): sizes a peer claims are checked against them before anything
is allocated from them.

>>> from asyncrl._protocol import Collect, Hello
>>> decode(Collect, {"request": 3, "credits": 2})
Collect(request=3, credits=2)
>>> try:
...     decode(Collect, {"request": 3, "credits": 0})
... except ProtocolError as exc:
...     print(exc)
collect message field 'credits' must be an int in 1..1048576, got 0
>>> print(decode(Hello, {"protocol": 2, "name": "w\\x1b[2J", "host": "h", "pid": 1,
...                      "specs": {}}).name)  # printable: the escape is shown, not run
w\\x1b[2J

"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

from transports import ProtocolError, declared, printable

from .fields import printable_tree

__all__ = ["Text", "Tree", "clean", "decode", "read", "read_fields"]

#: A string field from a peer: printable, cut at a limit (transports' marker).
Text = declared.Text


@dataclasses.dataclass(frozen=True, slots=True)
class Tree(declared.Marker):
    """A nested map from a peer (env specs, scheme configs): every string in it printable."""

    limit: int = 1024

    def clean(self, value: Any) -> Any:
        return printable_tree(value, limit=self.limit)


M = TypeVar("M")
#: How a kind reads a peer's body: its own ``from_body``; a weights meta (which travels
#: beside a body) ``from_meta``; a control's arguments ``from_args``.
_READERS = ("from_body", "from_meta", "from_args")
T = TypeVar("T")


def decode(kind: type[M], body: Any, **bounds: Any) -> M:
    """``kind.from_body(body, **bounds)``: a ``kind`` message, or :class:`ProtocolError`
    (a weights meta is read by ``from_meta``, a control's arguments by ``from_args``)."""
    from_body: Callable[..., M] = next(getattr(kind, reader) for reader in _READERS
                                       if hasattr(kind, reader))
    name = getattr(kind, "KIND", kind.__name__)
    try:
        return from_body(body, **bounds)
    except ProtocolError:
        raise
    except Exception as exc:  # a hostile body, whatever tripped on it
        raise ProtocolError(f"{name} message could not be decoded: "
                            f"{type(exc).__name__}: {printable(str(exc), limit=300)} "
                            f"(expected a well-formed {name} body)") from exc


def read(cls: type[T], body: Any, what: str) -> T:
    """``body`` checked against ``cls``'s declaration, its texts made printable (a kind
    without a ``WIRE`` form: see :func:`read_fields` for those); errors name the
    ``"<what> message"``."""
    return declared.read(cls, body, f"{what} message")


def read_fields(cls: type, body: Any, what: str) -> dict[str, Any]:
    """For a kind with a ``WIRE`` form: ``{field: value}`` of ``body`` checked against
    the declaration (the fields ``WIRE`` names as it declares them, left to the
    caller; the others as ``cls`` declares them, their texts made printable)."""
    return declared.read_fields(cls, body, f"{what} message")


clean = declared.clean
