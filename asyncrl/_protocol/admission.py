"""Joining and leaving: hello, welcome, refuse, rejoin, leaving, closing, a relay's hello.

A worker (or a host's relay) says hello; the coordinator welcomes or refuses
it, asks a worker it dropped to say hello again (rejoin), and hears a worker
that stops on its own (leaving). Every text a peer sends here is made
printable where it is read (see :mod:`.fields`): a hostile host name cannot
write into the trainer's log.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, Self

from transports import ProtocolError

from .env_source import read_env_source
from .fields import (
    MAX_RELAY_MEMBERS,
    is_peer,
    option_map,
    optional_bool,
    optional_int,
    optional_text,
    printable_tree,
    required,
    text,
)

PROTOCOL = 2  # 2: the welcome says share_frames (was frames_per_batch)
#: Longest refusal reason a worker keeps (every problem the coordinator found, joined).
MAX_REASON = 16384
#: Longest host group name a hello may carry.
MAX_GROUP = 64
#: Longest gymnasium id a hello may name.
MAX_ENV_ID = 200


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
    #: The worker host this worker belongs to ("": none) and how many workers it
    #: brings: the coordinator admits a host's workers together or not at all (see
    #: asyncrl._coordinator.host_groups). Optional: a coordinator before it ignores them.
    group: str = ""
    group_size: int = 0
    #: This worker drops the ``("next", K)`` twins itself when its welcome says
    #: ``compact_obs``; the coordinator then refuses a batch that carries one. A worker
    #: before it lacks the field (False): the coordinator drops them on receipt.
    drops_next_obs: bool = False
    #: A remote host's gymnasium id that it could not make (unknown to its registry:
    #: registered by the trainer at run time), its ``specs`` then empty: the refusal
    #: carries where the trainer's id comes from (``Refuse.env_source``). "": none.
    env_missing: str = ""
    #: This host's own rollout options (``RolloutOptions.to_wire()``: what its command
    #: line set): it runs with the welcome's value of each option named here. A host
    #: before it lacks the field ({}): the coordinator refuses it when the run's options
    #: are not the defaults, and a host flag that differs from the run's is refused.
    rollout: dict[str, Any] = field(default_factory=dict)

    def to_body(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_body(cls, body: Any) -> Self:
        group = optional_text(body, "group", "hello", limit=MAX_GROUP)
        group_size = optional_int(body, "group_size", "hello")
        if not 0 <= group_size <= MAX_RELAY_MEMBERS or bool(group) != (group_size > 0):
            raise ProtocolError(f"hello group_size must be 1 to {MAX_RELAY_MEMBERS} with a "
                                f"group (0 without), got {group_size} with group {group!r}")
        return cls(
            protocol=required(body, "protocol", int, "hello"),
            name=text(body, "name", "hello", limit=200),
            host=text(body, "host", "hello", limit=200),
            pid=required(body, "pid", int, "hello"),
            specs=printable_tree(required(body, "specs", dict, "hello")),
            slot=required(body, "slot", int, "hello"),
            token=text(body, "token", "hello", limit=200),
            relay=optional_text(body, "relay", "hello", limit=255),
            attempt=optional_int(body, "attempt", "hello"),
            group=group, group_size=group_size,
            drops_next_obs=optional_bool(body, "drops_next_obs", "hello field", default=False),
            env_missing=optional_text(body, "env_missing", "hello", limit=MAX_ENV_ID),
            rollout=option_map(body, "rollout", "hello"),
        )


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
        members = required(body, "members", list, "relay_hello")
        if len(members) > MAX_RELAY_MEMBERS:
            raise ProtocolError(f"relay_hello lists {len(members)} members; at most "
                                f"{MAX_RELAY_MEMBERS} are allowed")
        if not all(is_peer(m) for m in members):
            raise ProtocolError("relay_hello members must be peer identities (1 to 255 bytes)")
        return cls(
            protocol=required(body, "protocol", int, "relay_hello"),
            name=text(body, "name", "relay_hello", limit=255),
            host=text(body, "host", "relay_hello", limit=200),
            pid=required(body, "pid", int, "relay_hello"),
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
        return cls(members=required(body, "members", int, "relay_welcome"),
                   instance=optional_text(body, "instance", "relay_welcome", limit=64))


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
    #: The coordinator rebuilds compact batches (``compact_frames.py``): a worker sends
    #: them only when told so, so a worker and a coordinator of the releases before
    #: (which lack the field) still talk, each way round, during a rolling update.
    compact_batches: bool = False
    #: TorchRL's ``compact_obs=True``: send batches without the ``("next", K)`` twins of
    #: observation and state keys (:func:`~asyncrl._protocol.compact_frames.drop_twins`).
    #: Optional as ``compact_batches``: a worker before it sends them, and the
    #: coordinator drops them on receipt (it knows from the hello's ``drops_next_obs``).
    compact_obs: bool = False
    #: The run's rollout options this worker runs with (``RolloutOptions.to_wire()``,
    #: the options its hello names; checked by ``RolloutOptions.from_wire``). Data,
    #: never code; without the field (a coordinator before it) a worker keeps its own.
    rollout: dict[str, Any] = field(default_factory=dict)

    def to_body(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_body(cls, body: Any) -> Self:
        frames = required(body, "share_frames", int, "welcome")
        if not 0 < frames <= 1 << 31:
            raise ProtocolError(f"welcome share_frames must be in 1..2**31, got {frames}")
        schemes = required(body, "schemes", dict, "welcome")
        if not all(isinstance(k, str) and isinstance(v, dict) for k, v in schemes.items()):
            raise ProtocolError("welcome schemes must map model ids to scheme configs")
        return cls(
            index=required(body, "index", int, "welcome"),
            share_frames=frames,
            init_random_frames=required(body, "init_random_frames", int, "welcome"),
            schemes=printable_tree(schemes),
            attempt=optional_int(body, "attempt", "welcome"),
            instance=optional_text(body, "instance", "welcome", limit=64),
            compact_batches=optional_bool(body, "compact_batches", "welcome field",
                                          default=False),
            compact_obs=optional_bool(body, "compact_obs", "welcome field", default=False),
            rollout=option_map(body, "rollout", "welcome"),
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
    #: The answer to a hello's ``env_missing``: where the trainer's id is registered
    #: (:func:`~asyncrl._protocol.env_source.read_env_source`'s fields); the worker
    #: imports it and says hello again. None: nothing to offer.
    env_source: dict[str, Any] | None = None

    def to_body(self) -> dict[str, Any]:
        body = asdict(self)
        if self.env_source is None:
            del body["env_source"]  # as a coordinator before it sent it
        return body

    @classmethod
    def from_body(cls, body: Any) -> Self:
        full = optional_bool(body, "full", "refuse message field", default=False)
        source = body.get("env_source") if isinstance(body, dict) else None
        return cls(reason=text(body, "reason", "refuse", limit=MAX_REASON), full=full,
                   env_source=None if source is None else read_env_source(source))


@dataclass(slots=True)
class Closing:
    """The arguments of the coordinator's ``close`` control: does the run go on without you?

    ``finished``: the run is over (``total_frames`` reached, or the trainer closed
    after its end): every worker goes home. False: only this trainer stops (SIGTERM,
    an error, a close before the end), and a worker started with ``reconnect`` waits
    for the next one. A close without the field (from a trainer before it) means
    finished, as a close always did; an older worker ignores the field and exits.

    >>> Closing.from_args(Closing(finished=False).to_args()), Closing.from_args({})
    (Closing(finished=False), Closing(finished=True))
    """

    finished: bool = True

    def to_args(self) -> dict[str, Any]:
        return {"finished": self.finished}

    @classmethod
    def from_args(cls, args: Any) -> Self:
        return cls(optional_bool(args, "finished", "control close argument", default=True))


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
        return cls(reason=optional_text(body, "reason", "rejoin", limit=1000))


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
        return cls(reason=optional_text(body, "reason", "leaving", limit=1000))


__all__ = ["MAX_REASON", "PROTOCOL", "Closing", "Hello", "Leaving", "Refuse", "Rejoin",
           "RelayHello", "RelayWelcome", "Welcome"]
