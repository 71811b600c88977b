"""Weights: the meta of a ``weights`` message, the chunks of a streamed version, and
the acks a version gets (from a worker, or from a relay for its members).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self

from transports import ErrorPayload, ProtocolError, printable

from .fields import (
    MAX_KEY,
    MAX_RELAY_MEMBERS,
    bounded_int,
    bounded_list,
    is_int,
    is_key,
    is_peer,
    peer_map,
    read_model_id,
    read_version,
)

#: The kind of a weights message: the sender writes it, workers and relays route on it.
WEIGHTS_KIND = "weights"
#: Meta key of a relayed weight message: the members the relay delivers it to.
RELAY_TO = "relay_to"
#: Longest coordinator instance name (a hub's is 16 hex digits).
MAX_INSTANCE = 64
#: Meta key of a chunk of a streamed weight version.
CHUNK = "chunk"
#: Most chunks one version may be cut into.
MAX_CHUNKS = 1 << 20
#: Most tensor pieces one chunk may carry.
MAX_CHUNK_PARTS = 4096
#: Most tensors a streamed model may have.
MAX_LAYOUT_KEYS = 1 << 16


#: The kind of a weights message: the sender writes it, workers and relays route on it.
WEIGHTS_KIND = "weights"


@dataclass(frozen=True, slots=True)
class WeightMeta:
    """The meta of a ``weights`` message (kind :data:`WEIGHTS_KIND`).

    The body is the weights; the meta says whose they are: ``version`` of
    ``model_id``, numbered by coordinator ``instance`` (``""``: not said). A
    message to a host's relay also names the members it delivers to (``relay_to``).
    """

    model_id: str
    version: int
    instance: str = ""
    relay_to: tuple[bytes, ...] = ()
    #: Set when the version travels as a stream of chunk messages (see :class:`WeightChunk`).
    chunk: WeightChunk | None = None

    def to_meta(self) -> dict[str, Any]:
        meta: dict[str, Any] = {"model_id": self.model_id, "version": self.version}
        if self.instance:
            meta["instance"] = self.instance
        if self.relay_to:
            meta[RELAY_TO] = list(self.relay_to)
        if self.chunk is not None:
            meta[CHUNK] = self.chunk.to_meta()
        return meta

    @classmethod
    def from_meta(cls, meta: Any) -> Self:
        if not isinstance(meta, dict):
            raise ProtocolError(f"weights message meta must be a map, got {type(meta).__name__}")
        model_id, version = read_model_id(meta, "weights"), read_version(meta, "weights")
        instance = meta.get("instance", "")
        if not isinstance(instance, str):
            raise ProtocolError(f"weights message field 'instance' must be str, "
                                f"got {type(instance).__name__}")
        if len(instance) > MAX_INSTANCE:
            raise ProtocolError(f"weights message field 'instance' must be at most "
                                f"{MAX_INSTANCE} characters, got {len(instance)}")
        chunk = WeightChunk.from_meta(meta[CHUNK]) if CHUNK in meta else None
        return cls(model_id, version, printable(instance, limit=MAX_INSTANCE),
                   _relay_to(meta.get(RELAY_TO, [])), chunk)


@dataclass(frozen=True, slots=True)
class WeightChunk:
    """Chunk ``index`` of ``count`` of one weight version streamed in pieces.

    The version's tensors, in the order of ``layout`` (sent with chunk 0 only:
    ``(key, dtype name, shape)`` each), are cut into byte ranges; a chunk
    carries the next ``parts``, each ``(key, byte offset in that tensor,
    bytes)``, whose bytes are the body's frames (one uint8 tensor per part).
    Only the last chunk needs an acknowledgement: ZeroMQ keeps the order of
    messages on a connection, so its ack (the version applied) covers the
    stream. Validated here for shape; the receiver checks it against its model.
    """

    index: int
    count: int
    parts: tuple[tuple[str, int, int], ...]
    layout: tuple[tuple[str, str, tuple[int, ...]], ...] = ()

    @property
    def last(self) -> bool:
        return self.index == self.count - 1

    def to_meta(self) -> dict[str, Any]:
        meta: dict[str, Any] = {"index": self.index, "count": self.count,
                                "parts": [list(p) for p in self.parts]}
        if self.layout:
            meta["layout"] = [[key, dtype, list(shape)] for key, dtype, shape in self.layout]
        return meta

    @classmethod
    def from_meta(cls, raw: Any) -> Self:
        what = "weights chunk"
        if not isinstance(raw, dict):
            raise ProtocolError(f"{what} field {CHUNK!r} must be a map, got {type(raw).__name__}")
        count = bounded_int(raw, "count", 1, MAX_CHUNKS, what)
        index = bounded_int(raw, "index", 0, count - 1, what)
        parts = bounded_list(raw, "parts", MAX_CHUNK_PARTS, what)
        if not all(isinstance(p, list) and len(p) == 3 and is_key(p[0])
                   and is_int(p[1], 0) and is_int(p[2], 1) for p in parts):
            raise ProtocolError(f"{what} field 'parts' must list [key, byte offset >= 0, "
                                f"bytes >= 1] triples (keys of 1 to {MAX_KEY} characters)")
        layout = bounded_list(raw, "layout", MAX_LAYOUT_KEYS, what) if "layout" in raw else []
        if (index == 0) != bool(layout):
            raise ProtocolError(f"{what}: the layout comes with chunk 0 and only with it "
                                f"(chunk {index}, {'a' if layout else 'no'} layout)")
        if not all(isinstance(e, list) and len(e) == 3 and is_key(e[0])
                   and isinstance(e[1], str) and len(e[1]) <= 16 and isinstance(e[2], list)
                   and len(e[2]) <= 32 and all(is_int(d, 0) for d in e[2]) for e in layout):
            raise ProtocolError(f"{what} field 'layout' must list [key, dtype name, shape] "
                                "triples")
        return cls(index, count, tuple((_key(k), o, n) for k, o, n in parts),
                   tuple((_key(k), printable(d, limit=16), tuple(s)) for k, d, s in layout))


def _key(key: str) -> str:
    return printable(key, limit=MAX_KEY)


def _relay_to(members: Any) -> tuple[bytes, ...]:
    if not isinstance(members, list):
        raise ProtocolError(f"weights message field {RELAY_TO!r} must be a list of peer "
                            f"identities, got {type(members).__name__}")
    if len(members) > MAX_RELAY_MEMBERS:
        raise ProtocolError(f"weights message field {RELAY_TO!r} lists {len(members)} members; "
                            f"at most {MAX_RELAY_MEMBERS} are allowed")
    if not all(is_peer(m) for m in members):
        raise ProtocolError(f"weights message field {RELAY_TO!r} must list peer identities "
                            "(1 to 255 bytes)")
    return tuple(members)


@dataclass(frozen=True, slots=True)
class WeightsApplied:
    """Worker -> sender, the ack of a ``weights`` message: it holds ``version`` of ``model_id``.

    The version may be newer than the message's: newest wins, so a worker that
    got version *k + 1* before applying *k* acks both with *k + 1*. ``published``:
    the worker reads later versions of this model from the word its sender
    publishes in shared memory (``LiveSharedMemWeightSyncScheme``), so they need
    no message; absent (False) from older workers and from every other scheme.
    """

    model_id: str
    version: int
    published: bool = False

    def to_body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"model_id": self.model_id, "version": self.version}
        if self.published:
            body["published"] = True
        return body

    @classmethod
    def from_body(cls, body: Any) -> Self:
        return cls(read_model_id(body, "weights ack"), read_version(body, "weights ack"),
                   body.get("published") is True)


@dataclass(frozen=True, slots=True)
class RelayAck:
    """Relay -> sender, the ack of a relayed ``weights`` message, member by member.

    ``versions[member]`` is the version that member applied; ``failed[member]``
    says why it did not: its own error, or :meth:`lost` when the relay does not
    reach it.
    """

    #: ``failed[member].type`` of a member the relay does not reach (lost, never attached).
    LOST_TYPE: ClassVar[str] = "transports.PeerLostError"
    model_id: str
    versions: Mapping[bytes, int]
    failed: Mapping[bytes, ErrorPayload] = field(default_factory=dict)

    @classmethod
    def lost(cls, why: str) -> ErrorPayload:
        """The failure of a member the relay does not reach, and ``why``."""
        return ErrorPayload(cls.LOST_TYPE, why)

    def to_body(self) -> dict[str, Any]:
        return {"model_id": self.model_id, "versions": dict(self.versions),
                "failed": {m: p.to_body() for m, p in self.failed.items()}}

    @classmethod
    def from_body(cls, body: Any) -> Self:
        versions = peer_map(body, "versions", "relay ack")
        if not all(type(v) is int for v in versions.values()):
            raise ProtocolError("relay ack message field 'versions' must map members to int "
                                "versions")
        failed = {member: ErrorPayload.from_body(failure, "relay ack failure")
                  for member, failure in peer_map(body, "failed", "relay ack").items()}
        return cls(read_model_id(body, "relay ack"), versions, failed)


@dataclass(frozen=True, slots=True)
class RelayAttached:
    """Relay -> worker: you are attached; weights for you may now come this way."""

    KIND: ClassVar[str] = "relay_attached"

    def to_body(self) -> dict[str, Any] | None:
        return None  # the kind says it all (nil on the wire, as ever)

    @classmethod
    def from_body(cls, body: Any) -> Self:
        if body is not None and not isinstance(body, dict):  # a map: fields of a later version
            raise ProtocolError(f"relay_attached message body must be nil or a map, got "
                                f"{type(body).__name__}")
        return cls()


__all__ = ["CHUNK", "MAX_CHUNKS", "MAX_CHUNK_PARTS", "MAX_INSTANCE", "MAX_LAYOUT_KEYS",
           "RELAY_TO", "WEIGHTS_KIND", "RelayAck", "RelayAttached", "WeightChunk", "WeightMeta",
           "WeightsApplied"]
