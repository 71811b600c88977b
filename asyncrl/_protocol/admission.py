"""Joining and leaving: hello, welcome, refuse, rejoin, leaving, closing, a relay's hello.

A worker (or a host's relay) says hello; the coordinator welcomes or refuses
it, asks a worker it dropped to say hello again (rejoin), and hears a worker
that stops on its own (leaving). Every text a peer sends here is made
printable where it is read (see :mod:`.fields`): a hostile host name cannot
write into the trainer's log.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Annotated, Any, ClassVar, Literal, Self

from msgspec import Meta

from transports import ProtocolError

from .central_inference import MAX_SERVED
from .decoding import Text, Tree, read
from .env_source import read_env_source
from .fields import (
    MAX_OPTION_NAME,
    MAX_OPTIONS,
    MAX_RELAY_MEMBERS,
    Peer,
)

PROTOCOL = 2  # 2: the welcome says share_frames (was frames_per_batch)
#: Longest refusal reason a worker keeps (every problem the coordinator found, joined).
MAX_REASON = 16384
#: Longest host group name a hello may carry.
MAX_GROUP = 64
#: Longest gymnasium id a hello may name.
MAX_ENV_ID = 200
#: Rollout options by name (``RolloutOptions.to_wire()``), in a hello or a welcome: a small
#: map whose names are short; the values are ``RolloutOptions.from_wire``'s to check.
#: What a peer does once admitted (:attr:`Hello.role`).
Role = Literal["rollout", "env"]
RolloutMap = Annotated[dict[Annotated[str, Meta(min_length=1, max_length=MAX_OPTION_NAME)], Any],
                       Meta(max_length=MAX_OPTIONS), Tree()]


@dataclass(slots=True)
class Hello:
    """Worker -> coordinator, first message: who I am and what my envs look like."""

    KIND: ClassVar[str] = "hello"
    protocol: int
    name: Annotated[str, Text(200)]
    host: Annotated[str, Text(200)]
    pid: int
    specs: Annotated[dict[str, Any], Tree()]
    slot: int = -1  # the index a locally spawned worker was started for; -1: any
    token: Annotated[str, Text(200)] = ""  # proves a local worker was spawned by this coordinator
    #: The upstream identity of this host's relay ("": none). Weights go through it
    #: only if that relay also lists this worker (see :class:`RelayHello`).
    relay: Annotated[str, Text(255)] = ""
    #: Counts the hellos of one join: a hello that reached a coordinator which died
    #: before answering is said again, and only the welcome for the latest counts.
    attempt: int = 0
    #: The worker host this worker belongs to ("": none) and how many workers it
    #: brings: the coordinator admits a host's workers together or not at all (see
    #: asyncrl._coordinator.host_groups). Optional: a coordinator before it ignores them.
    group: Annotated[str, Text(MAX_GROUP)] = ""
    group_size: int = 0  # bounded with group, in from_body: one message says the pair
    #: This worker drops the ``("next", K)`` twins itself when its welcome says
    #: ``compact_obs``; the coordinator then refuses a batch that carries one. A worker
    #: before it lacks the field (False): the coordinator drops them on receipt.
    drops_next_obs: bool = False
    #: A remote host's gymnasium id that it could not make (unknown to its registry:
    #: registered by the trainer at run time), its ``specs`` then empty: the refusal
    #: carries where the trainer's id comes from (``Refuse.env_source``). "": none.
    env_missing: Annotated[str, Text(MAX_ENV_ID)] = ""
    #: This host's own rollout options (``RolloutOptions.to_wire()``: what its command
    #: line set): it runs with the welcome's value of each option named here. A host
    #: before it lacks the field ({}): the coordinator refuses it when the run's options
    #: are not the defaults, and a host flag that differs from the run's is refused.
    rollout: RolloutMap = field(default_factory=dict)
    #: What this peer does once admitted: ``"rollout"`` (a worker of a MultiCollector: it
    #: steps its envs with its own copy of the policy) or ``"env"`` (an env worker of
    #: central inference, AsyncBatchedCollector: it steps envs and asks the trainer's
    #: policy; its ``specs`` are then :class:`~.central_inference.EnvLayout`'s). A peer
    #: before the field lacks it: a rollout worker, as every peer then was.
    role: Role = "rollout"

    def to_body(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_body(cls, body: Any) -> Self:
        hello = read(cls, body, "hello")
        if not 0 <= hello.group_size <= MAX_RELAY_MEMBERS \
                or bool(hello.group) != (hello.group_size > 0):
            raise ProtocolError(f"hello group_size must be 1 to {MAX_RELAY_MEMBERS} with a "
                                f"group (0 without), got {hello.group_size} with group "
                                f"{hello.group!r}")
        return hello


@dataclass(slots=True)
class RelayHello:
    """Relay -> coordinator: I am host ``host``'s relay and these workers are mine.

    ``members`` are the workers' peer identities. The coordinator then sends each
    weight version once to the relay for those of them that name this relay in
    their own hello; everything else still goes to the workers directly.
    """

    KIND: ClassVar[str] = "relay_hello"
    protocol: int
    name: Annotated[str, Text(255)]
    host: Annotated[str, Text(200)]
    pid: int
    members: Annotated[list[Peer], Meta(max_length=MAX_RELAY_MEMBERS)]

    def to_body(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_body(cls, body: Any) -> Self:
        return read(cls, body, "relay_hello")


@dataclass(slots=True)
class RelayWelcome:
    """Coordinator -> relay: registered; weights for your members may come through you."""

    KIND: ClassVar[str] = "relay_welcome"
    members: int
    #: The coordinator's hub instance: weight versions are numbered per instance.
    instance: Annotated[str, Text(64)] = ""

    def to_body(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_body(cls, body: Any) -> Self:
        return read(cls, body, "relay_welcome")


@dataclass(slots=True)
class Welcome:
    """Coordinator -> worker: your index and configuration."""

    KIND: ClassVar[str] = "welcome"
    index: int
    #: This worker's share of a batch: the frames it collects per batch it sends.
    share_frames: Annotated[int, Meta(ge=1, le=1 << 31)]
    init_random_frames: int = 0
    #: ``{model_id: scheme.to_config()}``: how weights reach this worker (remote hosts
    #: build their receivers from it; code never travels).
    schemes: Annotated[dict[str, dict[str, Any]], Tree()] = field(default_factory=dict)
    attempt: int = 0  # the hello's attempt this welcome answers
    #: The coordinator's hub instance. Weight versions are numbered per instance: a
    #: worker welcomed by a new one (a restarted trainer) starts counting afresh.
    instance: Annotated[str, Text(64)] = ""
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
    rollout: RolloutMap = field(default_factory=dict)
    #: The served modules this worker may call over its link: each a
    #: :class:`~asyncrl._protocol.served.ServedRoute`'s config (the worker checks each).
    #: Not among ``schemes``: a worker of a release before served modules ignores this
    #: field (unknown fields are) and joins; it fails only if its env calls one. Left out
    #: of the body when empty.
    served: Annotated[list[dict[str, Any]], Meta(max_length=MAX_SERVED)] = field(
        default_factory=list)

    def to_body(self) -> dict[str, Any]:
        body = asdict(self)
        if not self.served:
            del body["served"]
        return body

    @classmethod
    def from_body(cls, body: Any) -> Self:
        return read(cls, body, "welcome")


@dataclass(slots=True)
class Refuse:
    """Coordinator -> worker: you may not join, and why.

    ``full``: the only reason is that the run has no free place (``remote_workers``
    reached): a worker may ask again later (a place frees as soon as a worker leaves
    or is lost); any other refusal (keys, specs, protocol) is final.
    """

    KIND: ClassVar[str] = "refuse"
    reason: Annotated[str, Text(MAX_REASON)]
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
        refuse = read(cls, body, "refuse")
        if refuse.env_source is not None:
            refuse.env_source = read_env_source(refuse.env_source)
        return refuse


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

    KIND: ClassVar[str] = "control close"
    finished: bool = True

    def to_args(self) -> dict[str, Any]:
        return {"finished": self.finished}

    @classmethod
    def from_args(cls, args: Any) -> Self:
        """``args``: the control's arguments (None: none, finished as ever)."""
        return cls() if args is None else read(cls, args, "control close")


@dataclass(slots=True)
class Rejoin:
    """Coordinator -> worker: I dropped you (silent too long); say hello again.

    A worker that was frozen (SIGSTOP, a long GC pause, a swapped-out host) past
    ``peer_timeout`` was forgotten by the coordinator but does not know it; its
    next heartbeat gets it this message, and it joins again (a local worker for
    the same slot) with fresh credits and the latest weights.
    """

    KIND: ClassVar[str] = "rejoin"
    reason: Annotated[str, Text(1000)] = ""

    def to_body(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_body(cls, body: Any) -> Self:
        return read(cls, body, "rejoin")


@dataclass(slots=True)
class Leaving:
    """Worker -> coordinator: I am stopping on my own (a signal asked me to), not failing.

    Sent before the worker says goodbye, so that the coordinator hears why
    before it sees the worker gone: a local worker that got SIGTERM (systemd
    stops a service's whole process group) ends the run as a normal stop.
    """

    KIND: ClassVar[str] = "leaving"
    reason: Annotated[str, Text(1000)] = ""

    def to_body(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_body(cls, body: Any) -> Self:
        return read(cls, body, "leaving")


__all__ = [
    "MAX_REASON",
    "PROTOCOL",
    "Closing",
    "Hello",
    "Leaving",
    "Refuse",
    "Rejoin",
    "RelayHello",
    "RelayWelcome",
    "Role",
    "Welcome",
]
