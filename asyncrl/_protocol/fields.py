"""The bounds and field types the message declarations share (see :mod:`.decoding`).

A body came from the network: its kind's declaration checks each field's type
and bounds (:func:`~.decoding.read`), and the texts it marks are made printable
(see :mod:`transports._printable`): every log line, event, ``statistics()`` field
and metric label downstream gets safe text without having to remember.
"""

from __future__ import annotations

from typing import Annotated, Any

from msgspec import Meta

from transports import ProtocolError, printable

#: Most workers one relay may speak for (a relay is one host's worker processes).
MAX_RELAY_MEMBERS = 1024
#: Longest model id (an attribute path such as ``"actor.module"``) a message may name.
MAX_MODEL_ID = 1024
#: Longest tensor key (a dotted state-dict path) a chunk may name.
MAX_KEY = 1024
#: Longest string (a key or a value) a nested map from a peer (env specs, scheme configs) keeps.
MAX_TREE_TEXT = 1024

#: A peer identity in a message's declaration (see :mod:`.decoding`): 1 to 255 bytes.
Peer = Annotated[bytes, Meta(min_length=1, max_length=255)]


def _map(body: Any, what: str) -> dict[str, Any]:
    """``body`` if it is a map: a peer may send any msgpack value as a message body."""
    if not isinstance(body, dict):
        raise ProtocolError(f"{what} message body must be a map, got {type(body).__name__}")
    return body


def required(body: Any, name: str, kind: type | tuple[type, ...], what: str) -> Any:
    """``body[name]``, which must be a ``kind`` (a bool is no int)."""
    value = _map(body, what).get(name)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ProtocolError(
            f"{what} message field {name!r} must be {getattr(kind, '__name__', kind)}, "
            f"got {type(value).__name__}"
        )
    return value


def printable_tree(value: Any, *, limit: int = MAX_TREE_TEXT) -> Any:
    """A nested map or list from a peer (env specs, scheme configs) with every string
    in it, key or value, made printable (other values as they came).

    >>> printable_tree({"obs\\x1b[2J": ["float32", 4]})
    {'obs\\\\x1b[2J': ['float32', 4]}
    """
    if isinstance(value, str):
        return printable(value, limit=limit)
    if isinstance(value, dict):
        return {printable_tree(k, limit=limit): printable_tree(v, limit=limit)
                for k, v in value.items()}
    if isinstance(value, list):
        return [printable_tree(v, limit=limit) for v in value]
    return value


#: Most named options (rollout options) a hello or a welcome may carry, and their longest name.
MAX_OPTIONS = 64
MAX_OPTION_NAME = 64


__all__ = ["MAX_KEY", "MAX_MODEL_ID", "MAX_OPTIONS", "MAX_OPTION_NAME", "MAX_RELAY_MEMBERS",
           "MAX_TREE_TEXT", "Peer", "printable_tree", "required"]
