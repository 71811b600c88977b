"""Weights: the meta of a ``weights`` message, the chunks of a streamed version, and
the acks a version gets (from a worker, or from a relay for its members).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Required, Self

from msgspec import Meta

from transports import ErrorPayload, ProtocolError, printable

from .decoding import Text, read, read_fields
from .fields import MAX_KEY, MAX_MODEL_ID, MAX_RELAY_MEMBERS, Peer

#: The kind of a weights message: the sender writes it, workers and relays route on it.
WEIGHTS_KIND = "weights"
#: Meta key of a relayed weight message: the members the relay delivers it to.
RELAY_TO = "relay_to"
#: Longest coordinator instance name (a hub's is 16 hex digits).
MAX_INSTANCE = 64
#: Longest codec name in a weights meta (``WeightMeta.codec``).
MAX_CODEC = 32
#: Meta key of a chunk of a streamed weight version.
CHUNK = "chunk"
#: Most chunks one version may be cut into.
MAX_CHUNKS = 1 << 20
#: Most tensor pieces one chunk may carry.
MAX_CHUNK_PARTS = 4096
#: Most tensors a streamed model may have.
MAX_LAYOUT_KEYS = 1 << 16

#: A model id (an attribute path such as ``"actor.module"``), printable once read.
ModelId = Annotated[str, Meta(min_length=1, max_length=MAX_MODEL_ID), Text(MAX_MODEL_ID)]
#: A weight version: versions count from 1 (0 is "none yet" and never travels).
Version = Annotated[int, Meta(ge=1)]
#: A tensor's key (a dotted state-dict path) in a chunk.
Key = Annotated[str, Meta(min_length=1, max_length=MAX_KEY)]
#: A byte offset or a size in a chunk: below 2**62, as every size this side computes.
Offset = Annotated[int, Meta(ge=0, lt=1 << 62)]
#: ``[key, byte offset in that tensor, bytes]``: one piece of a chunk.
Part = tuple[Key, Offset, Annotated[int, Meta(ge=1, lt=1 << 62)]]
#: ``[key, dtype name, shape]``: one tensor of a streamed version's layout.
Entry = tuple[Key, Annotated[str, Meta(max_length=16)],
              Annotated[tuple[Offset, ...], Meta(max_length=32)]]


@dataclass(frozen=True, slots=True)
class WeightMeta:
    """The meta of a ``weights`` message (kind :data:`WEIGHTS_KIND`).

    The body is the weights; the meta says whose they are: ``version`` of
    ``model_id``, numbered by coordinator ``instance`` (``""``: not said). A
    message to a host's relay also names the members it delivers to (``relay_to``).
    """

    KIND: ClassVar[str] = WEIGHTS_KIND
    model_id: ModelId
    version: Version
    instance: Annotated[str, Meta(max_length=MAX_INSTANCE), Text(MAX_INSTANCE)] = ""
    relay_to: Annotated[tuple[Peer, ...], Meta(max_length=MAX_RELAY_MEMBERS)] = ()
    #: Set when the version travels as a stream of chunk messages (see :class:`WeightChunk`).
    chunk: WeightChunk | None = None
    #: The codec the tensors are in (``asyncrl.weights._codec``); ``""``: full tensors.
    codec: Annotated[str, Meta(max_length=MAX_CODEC), Text(MAX_CODEC)] = ""

    def to_meta(self) -> dict[str, Any]:
        meta: dict[str, Any] = {"model_id": self.model_id, "version": self.version}
        if self.instance:
            meta["instance"] = self.instance
        if self.relay_to:
            meta[RELAY_TO] = list(self.relay_to)
        if self.chunk is not None:
            meta[CHUNK] = self.chunk.to_meta()
        if self.codec:
            meta["codec"] = self.codec
        return meta

    @classmethod
    def from_meta(cls, meta: Any) -> Self:
        weights = read(cls, meta, WEIGHTS_KIND)
        if weights.chunk is not None:
            object.__setattr__(weights, "chunk", weights.chunk.checked())
        return weights


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

    KIND: ClassVar[str] = "weights chunk"
    index: Annotated[int, Meta(ge=0, le=MAX_CHUNKS - 1)]
    count: Annotated[int, Meta(ge=1, le=MAX_CHUNKS)]
    parts: Annotated[tuple[Part, ...], Meta(max_length=MAX_CHUNK_PARTS)]
    layout: Annotated[tuple[Entry, ...], Meta(max_length=MAX_LAYOUT_KEYS)] = ()

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
        return read(cls, raw, cls.KIND).checked()

    def checked(self) -> Self:
        """This chunk (as its declaration read it) if its fields agree, its keys printable."""
        what = self.KIND
        if self.index >= self.count:
            raise ProtocolError(f"{what} message field 'index' must be an int in "
                                f"0..{self.count - 1} (its count is {self.count}), "
                                f"got {self.index}")
        if (self.index == 0) != bool(self.layout):
            raise ProtocolError(f"{what}: the layout comes with chunk 0 and only with it "
                                f"(chunk {self.index}, {'a' if self.layout else 'no'} layout)")
        return type(self)(self.index, self.count,
                          tuple((_key(k), o, n) for k, o, n in self.parts),
                          tuple((_key(k), printable(d, limit=16), s) for k, d, s in self.layout))


def _key(key: str) -> str:
    return printable(key, limit=MAX_KEY)


@dataclass(frozen=True, slots=True)
class WeightsApplied:
    """Worker -> sender, the ack of a ``weights`` message: it holds ``version`` of ``model_id``.

    The version may be newer than the message's: newest wins, so a worker that
    got version *k + 1* before applying *k* acks both with *k + 1*. ``published``:
    the worker reads later versions of this model from the word its sender
    publishes in shared memory (``LiveSharedMemWeightSyncScheme``), so they need
    no message; absent (False) from older workers and from every other scheme.
    """

    KIND: ClassVar[str] = "weights ack"
    model_id: ModelId
    version: Version
    published: bool = False

    def to_body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"model_id": self.model_id, "version": self.version}
        if self.published:
            body["published"] = True
        return body

    @classmethod
    def from_body(cls, body: Any) -> Self:
        return read(cls, body, cls.KIND)


@dataclass(frozen=True, slots=True)
class RelayAck:
    """Relay -> sender, the ack of a relayed ``weights`` message, member by member.

    ``versions[member]`` is the version that member applied; ``failed[member]``
    says why it did not: its own error, or :meth:`lost` when the relay does not
    reach it.
    """

    #: ``failed[member].type`` of a member the relay does not reach (lost, never attached).
    LOST_TYPE: ClassVar[str] = "transports.PeerLostError"
    KIND: ClassVar[str] = "relay ack"
    #: Maps on the wire, both required; each failure is read by ErrorPayload.
    WIRE: ClassVar[dict[str, Any]] = {
        "versions": Annotated[dict[Peer, int], Meta(max_length=MAX_RELAY_MEMBERS)],
        "failed": Required[Annotated[dict[Peer, Any], Meta(max_length=MAX_RELAY_MEMBERS)]]}
    model_id: ModelId
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
        fields = read_fields(cls, body, cls.KIND)
        failed = {member: ErrorPayload.from_body(failure, "relay ack failure")
                  for member, failure in fields.pop("failed").items()}
        return cls(**fields, failed=failed)


@dataclass(frozen=True, slots=True)
class RelayAttached:
    """Relay -> worker: you are attached; weights for you may now come this way."""

    KIND: ClassVar[str] = "relay_attached"

    def to_body(self) -> dict[str, Any] | None:
        return None  # the kind says it all (nil on the wire, as ever)

    @classmethod
    def from_body(cls, body: Any) -> Self:
        # nil as ever; a map: fields of a later version (ignored, as every kind's)
        return cls() if body is None else read(cls, body, cls.KIND)


__all__ = ["CHUNK", "MAX_CHUNKS", "MAX_CHUNK_PARTS", "MAX_INSTANCE", "MAX_LAYOUT_KEYS",
           "RELAY_TO", "WEIGHTS_KIND", "RelayAck", "RelayAttached", "WeightChunk", "WeightMeta",
           "WeightsApplied"]
