"""Admission: who may join the run, with which index, and what its welcome says.

Peers are hostile until admitted (protocol, spawn token or ``accept_remote``,
free slot, ``check_specs``, ``max_remote_workers``). Plain methods that update the
:class:`~asyncrl._coordinator.records.Roster` and return the sends to make (see
:mod:`asyncrl._coordinator.state`, which composes this with rounds and losses).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from transports import peer_name

from .._protocol import Hello, Refuse, RelayHello, RelayWelcome, Role, Welcome
from .._rollout.env_ids import EnvIdSource
from .actions import Action, CatchUp, Send
from .checks import hello_problems, relay_hello_problems, rollout_problems
from .config import CoordinatorConfig
from .host_groups import HostGroups
from .records import RelayInfo, Roster, WorkerInfo

__all__ = ["Admission", "AdmissionTerms"]

log = logging.getLogger("asyncrl.coordinator")

#: Why a hello of another role than the run's is refused, by the run's role.
_ROLE_PROBLEMS: dict[str, str] = {
    "rollout": "role: this trainer runs a MultiSyncCollector / MultiAsyncCollector, whose "
               "workers step their envs with a copy of the policy; this is an env worker "
               "(role {role!r}) of central inference: start it as 'asyncrl worker' without "
               "--role env, or the trainer with AsyncBatchedCollector",
    "env": "role: this trainer runs an AsyncBatchedCollector (central inference), whose "
           "remote hosts only step envs; this is a worker of role {role!r}: start it as "
           "'asyncrl worker --role env' (or the trainer with a MultiSyncCollector / "
           "MultiAsyncCollector)",
}


@dataclass(frozen=True)
class AdmissionTerms:
    """What a newcomer is checked against and told, known once the run opened.

    ``token``: the spawn token a local worker proves itself with ("" without local
    workers); ``specs``: the env specs every worker must match (None: the first
    admitted worker's); ``check_specs``: how a hello's specs are judged against them;
    ``scheme_configs``: the weight schemes every welcome carries; ``env_source``:
    where the run's gymnasium id is registered, offered to a host that lacks it;
    ``served_routes``: how a remote worker calls each served module.

    >>> AdmissionTerms(token="secret").specs is None
    True
    """

    token: str = ""
    specs: dict[str, Any] | None = None
    check_specs: Callable[[dict[str, Any], Hello], list[str]] | None = None
    scheme_configs: Mapping[str, Any] = field(default_factory=dict)
    env_source: EnvIdSource | None = None
    #: The served modules' routes every welcome carries (``Welcome.served``).
    served_routes: Sequence[dict[str, Any]] = ()


class Admission:
    """Admits workers and relays into a :class:`Roster`, or refuses them naming why.

    It reads the run's rules from ``config`` (a :class:`~.config.CoordinatorConfig`:
    each index's share, the first remote index, ``accept_remote``,
    ``max_remote_workers``, ``compact_obs``, the rollout options) and what is known
    once the run opened from ``terms``.

    >>> from .config import CoordinatorConfig
    >>> config = CoordinatorConfig(sync=False, share_frames=[8], accept_remote=True)
    >>> admission = Admission(Roster(), config)
    >>> admission.specs is None   # the first admitted worker's specs become the reference
    True
    """

    def __init__(self, roster: Roster, config: CoordinatorConfig,
                 terms: AdmissionTerms | None = None, *, instance: str = "",
                 groups: HostGroups | None = None) -> None:
        self._roster = roster
        self.config = config
        self.terms = terms = terms or AdmissionTerms()
        self._instance = instance  # the hub's: weight versions are numbered per instance
        self.specs = terms.specs  # the reference every hello must match (None: the first one's)
        # Remote workers (and rejoining ones) get fresh indices after the local slots.
        self._next_index = self._first_remote_index = config.remote_start
        self._accept_remote = config.accept_remote
        self._max_remote = config.max_remote_workers  # None: any number
        #: Places held for the siblings of admitted workers: a host joins whole.
        self.groups = groups or HostGroups()
        #: The run's rollout options as every welcome carries them (the devices stay home).
        self._rollout = config.rollout.to_wire()
        #: The role this run admits (:attr:`Hello.role`): ``"rollout"`` workers of a
        #: MultiCollector, or ``"env"`` workers of central inference (AsyncBatchedCollector).
        self.role: Role = config.role

    # -- workers ---------------------------------------------------------------------------
    def repeated(self, peer: bytes, hello: Hello) -> WorkerInfo | None:
        """The live admission ``hello`` repeats (same peer, process and host), if any."""
        previous = self._roster.live(peer)
        if previous is not None and (previous.pid, previous.host) == (hello.pid, hello.host):
            return previous
        return None

    def refusal(self, peer: bytes, hello: Hello) -> list[Action]:
        """The refusal of a hello that may not join, naming why ([]: it may join)."""
        problems = self._admission_problems(hello)
        if not problems:
            return []
        if hello.env_missing and problems == [self._env_missing_problem(hello)]:
            return [Send(peer, self._env_refusal(hello, problems[0]))]
        reason = "; ".join(problems)
        log.warning("refused worker %s from %s: %s", hello.name, hello.host, reason)
        # Full, and nothing else: it may ask again once a place is free.
        full = hello.slot < 0 and problems == self._remote_capacity_problems(hello) \
            and not self._larger_than_the_run(hello)
        return [Send(peer, Refuse(reason, full=full))]

    def admit(self, peer: bytes, hello: Hello) -> WorkerInfo:
        """A new admission for an accepted hello: its slot, or the next remote index."""
        if self.specs is None:
            self.specs = hello.specs
        index = hello.slot if hello.slot >= 0 else self._take_index()
        if hello.slot < 0 and self._max_remote is not None:  # its siblings' places are held
            self._release_abandoned()
            self.groups.admitted(hello.group, size=hello.group_size,
                                 present=self._present(hello.group))
        worker = WorkerInfo(index, peer, hello.name, hello.host, hello.pid,
                            relay=hello.relay.encode() if hello.relay else None,
                            group=hello.group, drops_next_obs=hello.drops_next_obs,
                            role=hello.role)
        self._roster.workers[peer] = worker
        return worker

    def welcome(self, worker: WorkerInfo, hello: Hello) -> Send:
        """``worker``'s welcome: its index, share, the run's weight schemes and the
        rollout options its hello names (a host knows no others: the rest are the
        defaults, as :meth:`refusal` made sure)."""
        rollout = {name: v for name, v in self._rollout.items() if name in hello.rollout}
        return Send(worker.peer, Welcome(
            index=worker.index, share_frames=self.config.share_of(worker.index),
            init_random_frames=self.config.init_random_frames,
            schemes=dict(self.terms.scheme_configs), attempt=hello.attempt,
            instance=self._instance, compact_batches=True,
            compact_obs=self.config.compact_obs, rollout=rollout,
            served=list(self.terms.served_routes)), worker)

    def welcome_again(self, worker: WorkerInfo, hello: Hello) -> list[Action]:
        """Answer a hello from a worker this coordinator has admitted already.

        A worker says hello again when no welcome came within twice its peer
        timeout, as when this trainer's loop was held by a long training step;
        it then takes only the welcome of its latest hello and drops the orders
        that came before it (weights excepted). So the same admission is welcomed
        again, echoing the latest attempt, followed by the latest weights (a worker
        that joins again after a broken connection may have missed some; newest
        wins, so a copy it has costs one ack); what it is owed follows (its credits,
        or its share of the current round: see :meth:`Rounds.owed_orders`).
        Idempotent: repeating it leaves the worker, and this state, where one
        answer would have.
        """
        log.warning("worker %d (%s) said hello again (attempt %d) while admitted: welcoming "
                    "it again", worker.index, worker.name, hello.attempt)
        worker.relay = hello.relay.encode() if hello.relay else None
        return [self.welcome(worker, hello), CatchUp(worker)]

    # -- relays ----------------------------------------------------------------------------
    def relay_hello(self, peer: bytes, hello: RelayHello) -> list[Action]:
        """A host's relay: register it for the members that name it, or refuse it."""
        relays = self._roster.relays
        problems = relay_hello_problems(
            hello, accept_remote=self._accept_remote, max_remote=self._max_remote,
            others=len(relays) - (peer in relays))
        if problems:
            reason = "; ".join(problems)
            log.warning("refused relay %s from %s: %s", hello.name, hello.host, reason)
            # Full, and nothing else (as many relays as remote_workers): it may ask again.
            full = not relay_hello_problems(hello, accept_remote=self._accept_remote,
                                            max_remote=None, others=0)
            return [Send(peer, Refuse(reason, full=full))]
        relays[peer] = RelayInfo(peer, hello.host, hello.pid, frozenset(hello.members))
        log.info("relay %s on %s carries the weights of up to %d workers",
                 peer_name(peer), hello.host, len(hello.members))
        return [Send(peer, RelayWelcome(len(hello.members), instance=self._instance))]

    # -- rules -----------------------------------------------------------------------------
    def _admission_problems(self, hello: Hello) -> list[str]:
        if hello.role != self.role:  # nothing else of it means anything here
            return [_ROLE_PROBLEMS[self.role].format(role=hello.role)]
        taken = hello.slot >= 0 and any(
            w.index == hello.slot and w.alive for w in self._roster.workers.values())
        problems = hello_problems(hello, token=self.terms.token, accept_remote=self._accept_remote,
                                  slot_taken=taken)
        if hello.env_missing and not problems:  # no specs to judge: it had no env to build
            return [self._env_missing_problem(hello)]
        # Specs (and rollout options) are judged for peers that may join, never for an
        # impostor: a local worker's bad specs fail the run, and a stranger must not be
        # able to do that.
        if not problems:
            check_specs = self.terms.check_specs
            if check_specs is not None and self.specs is not None:
                problems += check_specs(self.specs, hello)
            problems += rollout_problems(self._rollout, hello)
        if hello.slot < 0 and not problems:
            problems += self._remote_capacity_problems(hello)
        return problems

    def _env_missing_problem(self, hello: Hello) -> str:
        return f"env: this host cannot make the gymnasium id {hello.env_missing!r}"

    def _env_refusal(self, hello: Hello, problem: str) -> Refuse:
        """A host lacks the trainer's gymnasium id: where it comes from, if this run has it.

        Offered only to a peer that may otherwise join (protocol, ``accept_remote``),
        and only for the id this collector makes; a script's own env (``__main__``)
        cannot be imported elsewhere: the refusal says what to do instead.
        """
        source = self.terms.env_source
        if source is None or source.env_id != hello.env_missing:
            reason = (f"{problem}: it is not this collector's id or the trainer does not know "
                      "where it is registered; start the host with --env 'pkg.mod:factory' "
                      "or a gymnasium id its installed packages register")
        elif source.in_main:
            reason = f"{problem}: {source.main_advice()}"
        else:
            log.info("worker %s from %s lacks gymnasium id %r: told to import %r",
                     hello.name, hello.host, source.env_id, source.module)
            return Refuse(f"{problem}: import {source.module!r} first",
                          env_source=source.with_package().to_body())
        log.warning("refused worker %s from %s: %s", hello.name, hello.host, reason)
        return Refuse(reason)

    def _remote_capacity_problems(self, hello: Hello) -> list[str]:
        """``remote_workers`` is a limit: who gets the weights is the trainer's choice.

        A host's workers join together or not at all: the first one admitted needs
        places for its siblings still to come too, which are then held for them (once
        per group, and only while one of them is alive: see :mod:`.host_groups`).
        """
        if self._max_remote is None:
            return []
        self._release_abandoned()
        if self.groups.holds_for(hello.group):
            return []
        if self._larger_than_the_run(hello):
            return [f"remote_workers: this host brings {hello.group_size} workers and this "
                    f"collector takes at most {self._max_remote} remote worker(s); start the "
                    f"host with --workers {self._max_remote} or fewer, or the trainer with a "
                    "larger remote_workers"]
        remote = sum(1 for w in self._roster.workers.values()
                     if w.alive and w.index >= self._first_remote_index)
        held = self.groups.held(besides=hello.group)
        # A group that held places before holds none again: it needs its own place only.
        need = 1 if self.groups.held_before(hello.group) \
            else max(1, hello.group_size - self._present(hello.group))
        if remote + held + need <= self._max_remote:
            return []
        free = max(0, self._max_remote - remote - held)
        whole = (f"this host's {need} workers still to join need {need} free places at once "
                 f"(a host joins whole or not at all), and {free} are free; ") if need > 1 \
            else ""
        holding = f" and {held} place(s) are held for the workers of hosts joining now" \
            if held else ""
        return [f"remote_workers: this collector takes at most {self._max_remote} remote "
                f"worker(s) and {remote} already joined{holding}; {whole}stop one or start "
                "the trainer with a larger remote_workers"]

    def _release_abandoned(self) -> None:
        """Free the places held for groups none of whose workers is alive any more."""
        self.groups.keep_only({w.group for w in self._roster.workers.values()
                               if w.alive and w.group})

    def _larger_than_the_run(self, hello: Hello) -> bool:
        return self._max_remote is not None and hello.group_size > self._max_remote

    def _present(self, group: str) -> int:
        """Live workers of the host ``group`` (none without one)."""
        if not group:
            return 0
        return sum(1 for w in self._roster.workers.values() if w.alive and w.group == group)

    def _take_index(self) -> int:
        # Never reuse an index: traj ids and batch tags of a lost worker stay unique.
        taken = {w.index for w in self._roster.workers.values()}
        index = self._next_index
        while index in taken:
            index += 1
        self._next_index = index + 1
        return index
