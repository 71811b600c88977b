"""What the coordinator knows: admitted workers, relays, sync rounds, and the loss policy.

Plain records, without rules: :class:`~asyncrl._coordinator.state.CoordinatorState`
changes them; the coordinator, the registry and ``statistics()`` read them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from tensordict import TensorDictBase

#: What a lost worker (dead process, or silent for ``peer_timeout``) does to the run:
#:
#: * ``"raise"``: the run fails with :class:`WorkerLostError` naming the worker (and, for a
#:   local one, its exit code or signal).
#: * ``"continue"``: the others carry on. Async mode: the lost worker's credits go to
#:   the others, so ``total_frames`` stays exact. Sync mode: rounds shrink, and later
#:   rounds ask only the workers still needed to reach ``total_frames`` (exact when the
#:   shortfall is a multiple of the shares, as with equal shares and no preemption; else
#:   the last batch exceeds it by less than one share).
#: * ``"wait"``: sync mode: the round waits for a replacement to deliver the lost
#:   share (a remote newcomer, or the same worker coming back: a worker dropped for
#:   silence that speaks again is told to rejoin). A dead local process cannot come
#:   back: without ``remote_workers`` nothing can replace it, and the run fails with a
#:   clear error instead of waiting forever (use ``"restart"``).
#: * ``"restart"``: local workers: the slot is respawned (RLlib's
#:   ``restart_failed_env_runners``); the new process gets the latest weights before
#:   its first frame; a slot that dies again before delivering a batch more than
#:   ``max_restarts`` times in a row fails the run. Rounds wait for the replacement as
#:   with ``"wait"``. A remote worker cannot be respawned from here: it is waited for
#:   as with ``"wait"`` (its host's ``--reconnect`` brings it back).
#:
#: In every mode an error a worker *reports* (its env or policy raised) fails the run
#: with the worker's exception, type and traceback: restarting would repeat it.
OnWorkerLoss = Literal["raise", "continue", "wait", "restart"]

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
    rejoin_asked: bool = False  # dropped, then told to rejoin (or refused: never to be)
    #: ``time.monotonic()`` since which it owes work (a credit, a share) and delivered
    #: nothing (None: it owes nothing); the stall watchdog reads it.
    owed_since: float | None = None

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


__all__ = ["LOSS_WORDS", "OnWorkerLoss", "RelayInfo", "Round", "WorkerInfo"]
