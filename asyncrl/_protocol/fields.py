"""The validators every message's ``from_body`` reads its fields with.

A body came from the network: each reader checks a field's type and bounds and
raises :class:`transports.ProtocolError` naming the message and the field. The
text readers also make a peer's string printable (see
:mod:`transports._printable`): every log line, event, ``statistics()`` field and
metric label downstream gets safe text without having to remember.
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


def text(body: Any, name: str, what: str, *, limit: int) -> str:
    """``body[name]``, a string, printable and at most ``limit`` characters."""
    return printable(required(body, name, str, what), limit=limit)


def optional_int(body: Any, name: str, what: str, default: int = 0) -> int:
    value = _map(body, what).get(name, default)
    if type(value) is not int:
        raise ProtocolError(f"{what} message field {name!r} must be int, "
                            f"got {type(value).__name__}")
    return value


def optional_bool(body: Any, name: str, what: str, *, default: bool) -> bool:
    """``body[name]`` if present (else ``default``, also for a body that is no map: fields
    added later, which an older peer leaves out), which must be a bool."""
    value = body.get(name, default) if isinstance(body, dict) else default
    if not isinstance(value, bool):
        raise ProtocolError(f"{what} {name!r} must be bool, got {type(value).__name__}")
    return value


def optional_text(body: Any, name: str, what: str, *, limit: int) -> str:
    """``body[name]`` if present (else ``""``), printable and at most ``limit`` characters."""
    value = _map(body, what).get(name, "")
    if not isinstance(value, str):
        raise ProtocolError(f"{what} message field {name!r} must be str, "
                            f"got {type(value).__name__}")
    return printable(value, limit=limit)


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


def option_map(body: Any, name: str, what: str, *, most: int = MAX_OPTIONS) -> dict[str, Any]:
    """``body[name]`` if present (else ``{}``: a field added later, which an older peer
    leaves out): a map of at most ``most`` named options (rollout options), printable."""
    value = _map(body, what).get(name, {})
    if not isinstance(value, dict) or len(value) > most \
            or not all(isinstance(k, str) and 0 < len(k) <= MAX_OPTION_NAME for k in value):
        raise ProtocolError(f"{what} message field {name!r} must be a map of at most {most} "
                            f"option names (1 to 64 characters) to values, got "
                            f"{type(value).__name__}"
                            + (f" of {len(value)}" if isinstance(value, dict) else ""))
    return dict(printable_tree(value))


def read_model_id(body: Any, what: str) -> str:
    value: str = required(body, "model_id", str, what)
    if not 0 < len(value) <= MAX_MODEL_ID:
        raise ProtocolError(f"{what} message field 'model_id' must be 1 to {MAX_MODEL_ID} "
                            f"characters, got {len(value)}")
    return printable(value, limit=MAX_MODEL_ID)


def read_version(body: Any, what: str) -> int:
    value: int = required(body, "version", int, what)
    if value < 1:
        raise ProtocolError(f"{what} message field 'version' must be a positive int, "
                            f"got {value}")
    return value


def is_peer(value: Any) -> bool:
    """Whether ``value`` is a peer identity (1 to 255 bytes)."""
    return isinstance(value, bytes) and 0 < len(value) <= 255


def peer_map(body: Any, name: str, what: str) -> dict[Any, Any]:
    """``body[name]``: a map keyed by at most MAX_RELAY_MEMBERS peer identities."""
    value: dict[Any, Any] = required(body, name, dict, what)
    if len(value) > MAX_RELAY_MEMBERS:
        raise ProtocolError(f"{what} message field {name!r} has {len(value)} entries; at most "
                            f"{MAX_RELAY_MEMBERS} are allowed")
    if not all(is_peer(m) for m in value):
        raise ProtocolError(f"{what} message field {name!r} must be keyed by peer identities "
                            "(1 to 255 bytes)")
    return value


def is_int(value: Any, low: int) -> bool:
    return type(value) is int and low <= value < 1 << 62


def is_key(value: Any) -> bool:
    return isinstance(value, str) and 0 < len(value) <= MAX_KEY


def bounded_int(body: Any, name: str, low: int, high: int, what: str) -> int:
    value = _map(body, what).get(name)
    if type(value) is not int or not low <= value <= high:
        raise ProtocolError(f"{what} field {name!r} must be an int in {low}..{high}, "
                            f"got {value!r:.40}")
    return value


def bounded_list(body: Any, name: str, most: int, what: str) -> list[Any]:
    value = _map(body, what).get(name)
    if not isinstance(value, list) or len(value) > most:
        raise ProtocolError(f"{what} field {name!r} must be a list of at most {most} entries, "
                            f"got {type(value).__name__}"
                            + (f" of {len(value)}" if isinstance(value, list) else ""))
    return value


__all__ = ["MAX_KEY", "MAX_MODEL_ID", "MAX_OPTIONS", "MAX_OPTION_NAME", "MAX_RELAY_MEMBERS",
           "MAX_TREE_TEXT", "Peer", "bounded_int", "bounded_list", "is_int", "is_key", "is_peer",
           "option_map", "optional_int", "optional_text", "peer_map", "printable_tree",
           "read_model_id", "read_version", "required", "text"]
