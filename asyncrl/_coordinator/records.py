"""What the coordinator knows: admitted workers and relays (the roster), sync rounds.

Plain records, without rules: :class:`~asyncrl._coordinator.state.CoordinatorState`
(its admission, rounds and losses) changes them; the coordinator, the registry and
``statistics()`` read them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tensordict import TensorDictBase

from .._observe.statistics import BatchArrivals
from .._protocol import Role

#: How a worker the hub lost went, by :class:`transports.PeerEvent` reason.
LOSS_WORDS = {
    "silent": "stopped answering (silent for peer_timeout)",
    "disconnected": "closed its connection without a word (its process died, or its host "
                    "did)",
    "goodbye": "closed its connection without being told to",
    "revoked": "was disconnected: its CURVE key was revoked (asyncrl keys revoke)",
}


@dataclass(eq=False)
class WorkerInfo:
    """What the coordinator knows of one admitted worker."""

    index: int
    peer: bytes
    name: str
    host: str
    pid: int
    alive: bool = True
    credits: int = 0  # batches asked for and not delivered yet
    queued: int = 0  # async: delivered, not yet taken by the trainer
    delivered: int = 0
    relay: bytes | None = None  # the relay its hello named (weights go through it if it agrees)
    group: str = ""  # its worker host's group ("": none): a host joins whole (host_groups)
    drops_next_obs: bool = False  # its hello: it drops the ("next", K) twins when told
    #: What it does (its hello's): ``"rollout"`` (a MultiCollector's worker: it owes
    #: batches) or ``"env"`` (central inference's env worker: it steps while admitted).
    role: Role = "rollout"
    rejoin_asked: bool = False  # dropped, then told to rejoin (or refused: never to be)
    #: ``time.monotonic()`` since which it owes work (a credit, a share) and delivered
    #: nothing (None: it owes nothing); the stall watchdog reads it.
    owed_since: float | None = None
    #: Progress reports (see :mod:`asyncrl._protocol.progress`): the env steps it reported
    #: last, and when that count last grew (None: never reported; judged on batches).
    steps: int = -1
    stepped_at: float | None = None
    #: Its count at its first report for the share it owes now (-1: none yet): the steps
    #: of that share, and their rate, are counted from it (the stall watchdog's due time).
    steps_from: int = -1
    #: When its last delivered batch was owed from and delivered (the slow-batch warning).
    last_batch: tuple[float, float] | None = None
    #: How it was lost (the loss text): a slot's respawn names it, not a signal's causes.
    lost_because: str = ""
    #: Its batches that came through shared memory and over the socket (statistics()).
    arrivals: BatchArrivals = field(default_factory=BatchArrivals)

    @property
    def ahead(self) -> int:
        """Batches this worker is ahead of the trainer (bounded by ``prefetch``)."""
        return self.credits + self.queued


@dataclass(frozen=True)
class RelayInfo:
    """A host's relay: it receives each weight version once for ``members``."""

    peer: bytes
    host: str
    pid: int
    members: frozenset[bytes]


@dataclass(eq=False)
class Round:
    """One sync round: the workers asked for a share, and the shares delivered so far."""

    request: int
    targets: dict[bytes, WorkerInfo]
    shares: dict[bytes, TensorDictBase] = field(default_factory=dict)
    preempted: bool = False
    replacements: int = 0  # shares of lost workers a newcomer must deliver ("wait")
    complete: bool = False
    #: Shares of departed workers re-planned onto these targets (one more each).
    owed: dict[bytes, int] = field(default_factory=dict)
    extras: list[tuple[WorkerInfo, TensorDictBase]] = field(default_factory=list)

    def missing(self) -> list[WorkerInfo]:
        return [w for peer, w in self.targets.items()
                if peer not in self.shares or self.owed.get(peer)]

    def unfinished(self, peer: bytes) -> int:
        """The shares ``peer`` was asked for in this round and has not delivered."""
        return int(peer in self.targets and peer not in self.shares) + self.owed.get(peer, 0)


@dataclass(eq=False)
class Roster:
    """Every admission (live and lost workers, by peer) and the live relays.

    Admission adds to it, losses mark its workers lost; rounds, credits and the
    weight senders read who is live.
    """

    workers: dict[bytes, WorkerInfo] = field(default_factory=dict)
    relays: dict[bytes, RelayInfo] = field(default_factory=dict)

    def live(self, peer: bytes) -> WorkerInfo | None:
        """The live worker admitted as ``peer`` (None: a stranger, or lost)."""
        worker = self.workers.get(peer)
        return worker if worker is not None and worker.alive else None

    @property
    def live_workers(self) -> list[WorkerInfo]:
        """The live workers, in index order."""
        return sorted((w for w in self.workers.values() if w.alive), key=lambda w: w.index)

    def worker_peers(self) -> dict[int, bytes]:
        """``{worker index: peer}`` of the live workers (whom a weight sender serves)."""
        return {w.index: w.peer for w in self.live_workers}

    def relay_routes(self) -> dict[int, bytes]:
        """``{worker index: relay peer}``: live workers whose weights go through a relay.

        A worker is routed through a relay only when both agree: its hello names
        the relay and the relay's hello lists it. Anyone else gets weights directly.
        """
        routes = {}
        for worker in self.workers.values():
            relay = self.relays.get(worker.relay) if worker.relay is not None else None
            if worker.alive and relay is not None and worker.peer in relay.members:
                routes[worker.index] = relay.peer
        return routes


__all__ = ["LOSS_WORDS", "RelayInfo", "Roster", "Round", "WorkerInfo"]
