"""Every asyncrl message, typed and validated.

Coordinator <-> worker and coordinator <-> relay messages, the meta of a
weight message and the acks it gets (from a worker, or from a relay for its
members). Each message is a small dataclass; ``to_body()`` gives the msgpack
body sent with ``kind=<KIND>`` (``to_meta()`` for :class:`WeightMeta`);
``from_body()`` validates a body that came from the network and raises
:class:`transports.ProtocolError` naming the bad field.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, Self

from tensordict import TensorDictBase

from transports import ErrorPayload, ProtocolError

PROTOCOL = 2  # 2: the welcome says share_frames (was frames_per_batch)


def _field(body: Any, name: str, kind: type | tuple[type, ...], what: str) -> Any:
    if not isinstance(body, dict):
        raise ProtocolError(f"{what} message body must be a map, got {type(body).__name__}")
    value = body.get(name)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ProtocolError(
            f"{what} message field {name!r} must be {getattr(kind, '__name__', kind)}, "
            f"got {type(value).__name__}"
        )
    return value


@dataclass(slots=True)
class Hello:
    """Worker -> coordinator, first message: who I am and what my envs look like."""

    KIND: ClassVar[str] = "hello"
    protocol: int
    name: str
    host: str
    pid: int
    specs: dict[str, Any]
    slot: int = -1  # the index a locally spawned worker was started for; -1: any
    token: str = ""  # proves a local worker was spawned by this coordinator
    #: The upstream identity of this host's relay ("": none). Weights go through it
    #: only if that relay also lists this worker (see :class:`RelayHello`).
    relay: str = ""
    #: Counts the hellos of one join: a hello that reached a coordinator which died
    #: before answering is said again, and only the welcome for the latest counts.
    attempt: int = 0

    def to_body(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_body(cls, body: Any) -> Self:
        return cls(
            protocol=_field(body, "protocol", int, "hello"),
            name=_field(body, "name", str, "hello")[:200],
            host=_field(body, "host", str, "hello")[:200],
            pid=_field(body, "pid", int, "hello"),
            specs=_field(body, "specs", dict, "hello"),
            slot=_field(body, "slot", int, "hello"),
            token=_field(body, "token", str, "hello")[:200],
            relay=_optional_str(body, "relay", "hello")[:255],
            attempt=_optional_int(body, "attempt", "hello"),
        )


def _optional_int(body: dict[str, Any], name: str, what: str, default: int = 0) -> int:
    value = body.get(name, default)
    if type(value) is not int:
        raise ProtocolError(f"{what} message field {name!r} must be int, "
                            f"got {type(value).__name__}")
    return value


def _optional_str(body: dict[str, Any], name: str, what: str) -> str:
    value = body.get(name, "")
    if not isinstance(value, str):
        raise ProtocolError(f"{what} message field {name!r} must be str, "
                            f"got {type(value).__name__}")
    return value


#: Most workers one relay may speak for (a relay is one host's worker processes).
MAX_RELAY_MEMBERS = 1024


@dataclass(slots=True)
class RelayHello:
    """Relay -> coordinator: I am host ``host``'s relay and these workers are mine.

    ``members`` are the workers' peer identities. The coordinator then sends each
    weight version once to the relay for those of them that name this relay in
    their own hello; everything else still goes to the workers directly.
    """

    KIND: ClassVar[str] = "relay_hello"
    protocol: int
    name: str
    host: str
    pid: int
    members: list[bytes]

    def to_body(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_body(cls, body: Any) -> Self:
        members = _field(body, "members", list, "relay_hello")
        if len(members) > MAX_RELAY_MEMBERS:
            raise ProtocolError(f"relay_hello lists {len(members)} members; at most "
                                f"{MAX_RELAY_MEMBERS} are allowed")
        if not all(isinstance(m, bytes) and 0 < len(m) <= 255 for m in members):
            raise ProtocolError("relay_hello members must be peer identities (1 to 255 bytes)")
        return cls(
            protocol=_field(body, "protocol", int, "relay_hello"),
            name=_field(body, "name", str, "relay_hello")[:255],
            host=_field(body, "host", str, "relay_hello")[:200],
            pid=_field(body, "pid", int, "relay_hello"),
            members=members,
        )


@dataclass(slots=True)
class RelayWelcome:
    """Coordinator -> relay: registered; weights for your members may come through you."""

    KIND: ClassVar[str] = "relay_welcome"
    members: int
    #: The coordinator's hub instance: weight versions are numbered per instance.
    instance: str = ""

    def to_body(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_body(cls, body: Any) -> Self:
        return cls(members=_field(body, "members", int, "relay_welcome"),
                   instance=_optional_str(body, "instance", "relay_welcome")[:64])


@dataclass(slots=True)
class Welcome:
    """Coordinator -> worker: your index and configuration."""

    KIND: ClassVar[str] = "welcome"
    index: int
    #: This worker's share of a batch: the frames it collects per batch it sends.
    share_frames: int
    init_random_frames: int = 0
    #: ``{model_id: scheme.to_config()}``: how weights reach this worker (remote hosts
    #: build their receivers from it; code never travels).
    schemes: dict[str, Any] = field(default_factory=dict)
    attempt: int = 0  # the hello's attempt this welcome answers
    #: The coordinator's hub instance. Weight versions are numbered per instance: a
    #: worker welcomed by a new one (a restarted trainer) starts counting afresh.
    instance: str = ""

    def to_body(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_body(cls, body: Any) -> Self:
        frames = _field(body, "share_frames", int, "welcome")
        if not 0 < frames <= 1 << 31:
            raise ProtocolError(f"welcome share_frames must be in 1..2**31, got {frames}")
        schemes = _field(body, "schemes", dict, "welcome")
        if not all(isinstance(k, str) and isinstance(v, dict) for k, v in schemes.items()):
            raise ProtocolError("welcome schemes must map model ids to scheme configs")
        return cls(
            index=_field(body, "index", int, "welcome"),
            share_frames=frames,
            init_random_frames=_field(body, "init_random_frames", int, "welcome"),
            schemes=schemes,
            attempt=_optional_int(body, "attempt", "welcome"),
            instance=_optional_str(body, "instance", "welcome")[:64],
        )


@dataclass(slots=True)
class Refuse:
    """Coordinator -> worker: you may not join, and why.

    ``full``: the only reason is that the run has no free place (``remote_workers``
    reached): a worker may ask again later (a place frees as soon as a worker leaves
    or is lost); any other refusal (keys, specs, protocol) is final.
    """

    KIND: ClassVar[str] = "refuse"
    reason: str
    full: bool = False

    def to_body(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_body(cls, body: Any) -> Self:
        full = body.get("full", False) if isinstance(body, dict) else False
        if not isinstance(full, bool):
            raise ProtocolError(f"refuse message field 'full' must be bool, "
                                f"got {type(full).__name__}")
        return cls(reason=_field(body, "reason", str, "refuse"), full=full)


@dataclass(slots=True)
class Rejoin:
    """Coordinator -> worker: I dropped you (silent too long); say hello again.

    A worker that was frozen (SIGSTOP, a long GC pause, a swapped-out host) past
    ``peer_timeout`` was forgotten by the coordinator but does not know it; its
    next heartbeat gets it this message, and it joins again (a local worker for
    the same slot) with fresh credits and the latest weights.
    """

    KIND: ClassVar[str] = "rejoin"
    reason: str = ""

    def to_body(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_body(cls, body: Any) -> Self:
        return cls(reason=_optional_str(body, "reason", "rejoin")[:1000])


@dataclass(slots=True)
class Collect:
    """Coordinator -> worker: collect ``credits`` batches for request ``request``."""

    KIND: ClassVar[str] = "collect"
    request: int
    credits: int = 1

    def to_body(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_body(cls, body: Any) -> Self:
        credits = _field(body, "credits", int, "collect")
        if not 0 < credits <= 1 << 20:
            raise ProtocolError(f"collect credits must be in 1..2**20, got {credits}")
        return cls(request=_field(body, "request", int, "collect"), credits=credits)


@dataclass(slots=True)
class Preempt:
    """Coordinator -> worker: stop the batch for ``request`` now and send what you have."""

    KIND: ClassVar[str] = "preempt"
    request: int

    def to_body(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_body(cls, body: Any) -> Self:
        return cls(request=_field(body, "request", int, "preempt"))


@dataclass(slots=True)
class Batch:
    """Worker -> coordinator: the frames of one batch."""

    KIND: ClassVar[str] = "batch"
    request: int
    frames: TensorDictBase

    def to_body(self) -> dict[str, Any]:
        return {"request": self.request, "frames": self.frames}

    @classmethod
    def from_body(cls, body: Any) -> Self:
        return cls(request=_field(body, "request", int, "batch"),
                   frames=_field(body, "frames", TensorDictBase, "batch"))


@dataclass(slots=True)
class ErrorReport:
    """Worker -> coordinator: an exception in the env, the policy or the worker.

    On the wire the :class:`transports.ErrorPayload` fields (``type``,
    ``message``, ``traceback``) sit beside the report's own.
    """

    KIND: ClassVar[str] = "error"
    error: ErrorPayload
    fatal: bool = True
    #: A local worker that fails before its hello (building its env or policy) is not
    #: admitted yet: its slot and spawn token vouch for the report instead.
    slot: int = -1
    token: str = ""

    def to_body(self) -> dict[str, Any]:
        return {**self.error.to_body(), "fatal": self.fatal, "slot": self.slot,
                "token": self.token}

    @classmethod
    def from_body(cls, body: Any) -> Self:
        return cls(
            error=ErrorPayload.from_body(body, "error message"),
            fatal=_field(body, "fatal", bool, "error"),
            slot=_optional_int(body, "slot", "error", default=-1),
            token=_optional_str(body, "token", "error")[:200],
        )


@dataclass(slots=True)
class Leaving:
    """Worker -> coordinator: I am stopping on my own (a signal asked me to), not failing.

    Sent before the worker says goodbye, so that the coordinator hears why
    before it sees the worker gone: a local worker that got SIGTERM (systemd
    stops a service's whole process group) ends the run as a normal stop.
    """

    KIND: ClassVar[str] = "leaving"
    reason: str = ""

    def to_body(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_body(cls, body: Any) -> Self:
        return cls(reason=_optional_str(body, "reason", "leaving")[:1000])


#: Most records one ``log`` message may carry; the worker sends more as more messages.
MAX_LOG_RECORDS = 64
#: Longest message (and logger name, traceback) text a forwarded record keeps.
MAX_LOG_MESSAGE = 4096
MAX_LOG_LOGGER = 200
MAX_LOG_TRACEBACK = 16384
#: C0 control characters but tab and newline: a record cannot rewrite a terminal.
_LOG_CONTROLS = {c: None for c in range(32) if c not in (9, 10)} | {127: None}


@dataclass(frozen=True, slots=True)
class LogEntry:
    """One worker log record, as it travels: level, logger name, message, traceback."""

    level: int
    logger: str
    message: str
    traceback: str = ""

    @classmethod
    def from_wire(cls, item: Any) -> Self:
        if not isinstance(item, list) or len(item) != 4:
            raise ProtocolError("log message records must be [level, logger, message, "
                                f"traceback] lists, got {type(item).__name__}")
        level, logger, message, traceback = item
        if type(level) is not int or not 0 <= level <= 100:
            raise ProtocolError(f"log record level must be an int in 0..100, got {level!r}"[:200])
        if not all(isinstance(v, str) for v in (logger, message, traceback)):
            raise ProtocolError("log record logger, message and traceback must be strings")
        return cls(level, _clean(logger, MAX_LOG_LOGGER), _clean(message, MAX_LOG_MESSAGE),
                   _clean(traceback, MAX_LOG_TRACEBACK))

    def to_wire(self) -> list[Any]:
        return [self.level, self.logger, self.message, self.traceback]


def _clean(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters (said so), without control characters."""
    if len(text) > limit:
        text = text[:limit] + f" [... {len(text) - limit} characters cut]"
    return text.translate(_LOG_CONTROLS)


@dataclass(slots=True)
class WorkerLog:
    """Worker -> coordinator: log records of the worker's process (see
    :mod:`asyncrl._worker.log_forward`), and how many it dropped (rate, queue)."""

    KIND: ClassVar[str] = "log"
    records: list[LogEntry]
    dropped: int = 0

    def to_body(self) -> dict[str, Any]:
        return {"records": [r.to_wire() for r in self.records], "dropped": self.dropped}

    @classmethod
    def from_body(cls, body: Any) -> Self:
        records = _field(body, "records", list, "log")
        if len(records) > MAX_LOG_RECORDS:
            raise ProtocolError(f"log message carries {len(records)} records; at most "
                                f"{MAX_LOG_RECORDS} are allowed")
        dropped = _optional_int(body, "dropped", "log")
        if dropped < 0:
            raise ProtocolError(f"log message field 'dropped' must be >= 0, got {dropped}")
        return cls([LogEntry.from_wire(r) for r in records], dropped)


@dataclass(slots=True)
class Control:
    """Coordinator -> worker, acknowledged: an operation and its arguments.

    Operations: ``seed``, ``reset``, ``state_dict``, ``load_state_dict``,
    ``getattr_policy``, ``getattr_env``, ``close``.
    """

    KIND: ClassVar[str] = "control"
    OPS: ClassVar[frozenset[str]] = frozenset(
        {"seed", "reset", "state_dict", "load_state_dict", "getattr_policy", "getattr_env",
         "close"}
    )
    op: str
    args: dict[str, Any] = field(default_factory=dict)

    def to_body(self) -> dict[str, Any]:
        return {"op": self.op, "args": self.args}

    @classmethod
    def from_body(cls, body: Any) -> Self:
        op = _field(body, "op", str, "control")
        if op not in cls.OPS:
            raise ProtocolError(f"unknown control operation {op!r}; expected one of "
                                f"{sorted(cls.OPS)}")
        return cls(op=op, args=_field(body, "args", dict, "control"))


# -- weights: the meta of a weight message, and the acks it gets ---------------------------
#: Meta key of a relayed weight message: the members the relay delivers it to.
RELAY_TO = "relay_to"
#: Longest model id (an attribute path such as ``"actor.module"``) a message may name.
MAX_MODEL_ID = 1024
#: Longest coordinator instance name (a hub's is 16 hex digits).
MAX_INSTANCE = 64


def _model_id(body: Any, what: str) -> str:
    model_id: str = _field(body, "model_id", str, what)
    if not 0 < len(model_id) <= MAX_MODEL_ID:
        raise ProtocolError(f"{what} message field 'model_id' must be 1 to {MAX_MODEL_ID} "
                            f"characters, got {len(model_id)}")
    return model_id


def _version(body: Any, what: str) -> int:
    version: int = _field(body, "version", int, what)
    if version < 1:
        raise ProtocolError(f"{what} message field 'version' must be a positive int, "
                            f"got {version}")
    return version


def _peer_map(body: Any, name: str, what: str) -> dict[Any, Any]:
    """``body[name]``: a map keyed by at most MAX_RELAY_MEMBERS peer identities."""
    value: dict[Any, Any] = _field(body, name, dict, what)
    if len(value) > MAX_RELAY_MEMBERS:
        raise ProtocolError(f"{what} message field {name!r} has {len(value)} entries; at most "
                            f"{MAX_RELAY_MEMBERS} are allowed")
    if not all(isinstance(m, bytes) and 0 < len(m) <= 255 for m in value):
        raise ProtocolError(f"{what} message field {name!r} must be keyed by peer identities "
                            "(1 to 255 bytes)")
    return value


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
        model_id, version = _model_id(meta, "weights"), _version(meta, "weights")
        instance = _optional_str(meta, "instance", "weights")
        if len(instance) > MAX_INSTANCE:
            raise ProtocolError(f"weights message field 'instance' must be at most "
                                f"{MAX_INSTANCE} characters, got {len(instance)}")
        chunk = WeightChunk.from_meta(meta[CHUNK]) if CHUNK in meta else None
        return cls(model_id, version, instance, _relay_to(meta.get(RELAY_TO, [])), chunk)


#: Meta key of a chunk of a streamed weight version.
CHUNK = "chunk"
#: Most chunks one version may be cut into.
MAX_CHUNKS = 1 << 20
#: Most tensor pieces one chunk may carry.
MAX_CHUNK_PARTS = 4096
#: Most tensors a streamed model may have.
MAX_LAYOUT_KEYS = 1 << 16
#: Longest tensor key (a dotted state-dict path) a chunk may name.
MAX_KEY = 1024


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
        count = _int(raw, "count", 1, MAX_CHUNKS, what)
        index = _int(raw, "index", 0, count - 1, what)
        parts = _list(raw, "parts", MAX_CHUNK_PARTS, what)
        if not all(isinstance(p, list) and len(p) == 3 and _is_key(p[0])
                   and _is_int(p[1], 0) and _is_int(p[2], 1) for p in parts):
            raise ProtocolError(f"{what} field 'parts' must list [key, byte offset >= 0, "
                                f"bytes >= 1] triples (keys of 1 to {MAX_KEY} characters)")
        layout = _list(raw, "layout", MAX_LAYOUT_KEYS, what) if "layout" in raw else []
        if (index == 0) != bool(layout):
            raise ProtocolError(f"{what}: the layout comes with chunk 0 and only with it "
                                f"(chunk {index}, {'a' if layout else 'no'} layout)")
        if not all(isinstance(e, list) and len(e) == 3 and _is_key(e[0])
                   and isinstance(e[1], str) and len(e[1]) <= 16 and isinstance(e[2], list)
                   and len(e[2]) <= 32 and all(_is_int(d, 0) for d in e[2]) for e in layout):
            raise ProtocolError(f"{what} field 'layout' must list [key, dtype name, shape] "
                                "triples")
        return cls(index, count, tuple((k, o, n) for k, o, n in parts),
                   tuple((k, d, tuple(s)) for k, d, s in layout))


def _is_int(value: Any, low: int) -> bool:
    return type(value) is int and low <= value < 1 << 62


def _is_key(value: Any) -> bool:
    return isinstance(value, str) and 0 < len(value) <= MAX_KEY


def _int(body: dict[str, Any], name: str, low: int, high: int, what: str) -> int:
    value = body.get(name)
    if type(value) is not int or not low <= value <= high:
        raise ProtocolError(f"{what} field {name!r} must be an int in {low}..{high}, "
                            f"got {value!r:.40}")
    return value


def _list(body: dict[str, Any], name: str, most: int, what: str) -> list[Any]:
    value = body.get(name)
    if not isinstance(value, list) or len(value) > most:
        raise ProtocolError(f"{what} field {name!r} must be a list of at most {most} entries, "
                            f"got {type(value).__name__}"
                            + (f" of {len(value)}" if isinstance(value, list) else ""))
    return value


def _relay_to(members: Any) -> tuple[bytes, ...]:
    if not isinstance(members, list):
        raise ProtocolError(f"weights message field {RELAY_TO!r} must be a list of peer "
                            f"identities, got {type(members).__name__}")
    if len(members) > MAX_RELAY_MEMBERS:
        raise ProtocolError(f"weights message field {RELAY_TO!r} lists {len(members)} members; "
                            f"at most {MAX_RELAY_MEMBERS} are allowed")
    if not all(isinstance(m, bytes) and 0 < len(m) <= 255 for m in members):
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
        return cls(_model_id(body, "weights ack"), _version(body, "weights ack"),
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
        versions = _peer_map(body, "versions", "relay ack")
        if not all(type(v) is int for v in versions.values()):
            raise ProtocolError("relay ack message field 'versions' must map members to int "
                                "versions")
        failed = {member: ErrorPayload.from_body(failure, "relay ack failure")
                  for member, failure in _peer_map(body, "failed", "relay ack").items()}
        return cls(_model_id(body, "relay ack"), versions, failed)


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
