"""The coordinator's state and rules, without I/O: each event returns the sends it takes.

As httpcore's connection pool (``_assign_requests_to_connections``) does, every
state change is a plain synchronous method: it updates the state at once and
returns the actions to take afterwards, in order: :class:`Send` a typed message,
:class:`Expel` a peer from the hub, :class:`CatchUp` a newcomer with the latest
weights. The async :class:`~asyncrl._coordinator.coordinator.Coordinator` reads the hub, calls
these methods and performs what they return; so admission, credits, rounds and
loss are decided in one place, and are tested without a hub or a socket.

:class:`CoordinatorState` composes one part per concern, over one
:class:`~asyncrl._coordinator.records.Roster` of admitted workers and relays:
:class:`~asyncrl._coordinator.admission.Admission` (who joins, with which index),
:class:`~asyncrl._coordinator.rounds.Rounds` (sync rounds, async credits: what each
worker owes) and :class:`~asyncrl._coordinator.losses.Losses` (losses, departures,
vacancies and the run's failure, by the
:class:`~asyncrl._coordinator.loss_policy.LossPolicy`). An event that concerns more
than one (a hello that fills a vacancy and a round's missing share) is put together
here.

The state is current before a send goes out, so a send may find its worker lost
meanwhile (another task handled an event while an earlier send awaited): an order
carries the admission it is for (``Send.worker``) and is dropped if that worker is
no longer alive; whatever it owed was released by the loss itself.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any

from tensordict import TensorDictBase

from .._errors import WorkerLostError
from .._protocol import Batch, Hello, Progress, RelayHello, drop_twins
from .actions import Action, CatchUp, Expel, Outbound, Send
from .admission import Admission, AdmissionTerms
from .config import CoordinatorConfig
from .loss_policy import LossPolicy
from .losses import Losses
from .records import RelayInfo, Roster, Round, WorkerInfo
from .rounds import Rounds


class CoordinatorState:
    """Who is admitted, what each worker owes, and what each event changes.

    Peers are hostile until admitted (protocol, spawn token or ``accept_remote``,
    free slot, ``check_specs``, ``max_remote_workers``); only a live admitted
    worker's batch counts, once :class:`BatchChecker` found it to be what was asked.

    >>> state = CoordinatorState(CoordinatorConfig(sync=True, share_frames=[8, 8],
    ...                                            loss_policy=LossPolicy("continue")))
    >>> state.live_workers, state.loss_policy.fails_run
    ([], False)
    """

    def __init__(self, config: CoordinatorConfig, terms: AdmissionTerms | None = None, *,
                 instance: str = "", peer_timeout: float | None = None) -> None:
        """``config``: the run's rules, read whole by each part; ``terms``: what newcomers
        are checked against (see :class:`AdmissionTerms`); ``instance`` and
        ``peer_timeout``: the hub's."""
        self.config = config
        self.roster = Roster()
        self.rounds = Rounds(self.roster, config)
        self.admission = Admission(self.roster, config, terms, instance=instance)
        self.losses = Losses(self.roster, self.rounds, config.loss_policy,
                             peer_timeout=peer_timeout)

    # -- what peers say ------------------------------------------------------------------------
    def hello(self, peer: bytes, hello: Hello) -> list[Action]:
        """A worker's hello: welcome it (with its orders) or refuse it, naming why."""
        admission = self.admission
        repeated = admission.repeated(peer, hello)
        if repeated is not None:  # its welcome was late: the same admission
            return admission.welcome_again(repeated, hello) + self.rounds.owed_orders(repeated)
        refusal = admission.refusal(peer, hello)
        if refusal:
            return refusal
        actions: list[Action] = []
        previous = self.roster.live(peer)
        if previous is not None:
            actions += self.losses.forget(previous)  # it restarted before its silence was noticed
        worker = admission.admit(peer, hello)
        self.losses.fill_vacancy(worker.index)
        actions += [admission.welcome(worker, hello), CatchUp(worker)]
        # on_worker_loss="wait": the newcomer delivers a lost worker's share.
        return actions + self.rounds.newcomer(worker)

    def relay_hello(self, peer: bytes, hello: RelayHello) -> list[Action]:
        """A host's relay: register it for the members that name it, or refuse it."""
        return self.admission.relay_hello(peer, hello)

    def batch(self, peer: bytes, batch: Batch) -> list[Action]:
        """A batch: counted if it is what its live worker was asked for, else refused."""
        worker = self.roster.live(peer)
        if worker is None:
            return []  # a stranger's, or a lost worker's late batch: never half-delivered
        if not self.rounds.expects(worker, batch):
            return []  # collected before this worker was (re)admitted: never half-delivered
        compact_obs = self.config.compact_obs
        if compact_obs and not worker.drops_next_obs:  # an earlier release sends them
            batch.frames = drop_twins(batch.frames)
        problems = self.rounds.batch_problems(worker, batch, self.admission.specs,
                                              dropped=compact_obs)
        if problems:
            return self.losses.bad_batch(worker, batch.request, problems)  # never counted
        return self.rounds.deliver(worker, batch)

    def bad_batch(self, peer: bytes, request: int, problem: str) -> list[Action]:
        """A live worker's batch that could not be read whole: not decodable (a
        :class:`ProtocolError` from :func:`~asyncrl._protocol.decode`), or its shared-memory
        slot shrunk or written during the trainer's copy. Refused as any bad batch, never
        counted (``request``: -1 when the body named none)."""
        worker = self.roster.live(peer)
        if worker is None:
            return []
        return self.losses.bad_batch(worker, request, [problem])

    def progress(self, peer: bytes, progress: Progress) -> list[Action]:
        """A live worker's step count (see :mod:`asyncrl._protocol.progress`): it steps,
        for the share it owes; a count beyond what its batches hold refuses it."""
        worker = self.roster.live(peer)
        if worker is None:
            return []
        problem = self.rounds.progressed(worker, progress)
        return self.losses.refused(worker, problem) if problem else []

    def returned(self, peer: bytes) -> list[Action]:
        """A peer the hub had lost speaks again: if it was our worker, tell it to rejoin."""
        return self.losses.returned(peer)

    def lost(self, peer: bytes, reason: str = "") -> list[Action]:
        """The hub lost ``peer``: apply ``on_worker_loss`` (see :meth:`Losses.lost`)."""
        return self.losses.lost(peer, reason)

    def stalled(self, peer: bytes, seconds: float) -> list[Action]:
        """``peer`` owed work and delivered nothing for ``seconds``: a loss."""
        return self.losses.stalled(peer, seconds)

    def exited(self, peer: bytes, error: WorkerLostError, *, replaceable: bool) -> list[Action]:
        """A local worker's process ended without being told to (see :meth:`Losses.exited`)."""
        return self.losses.exited(peer, error, replaceable=replaceable)

    def departed(self, peer: bytes) -> list[Action]:
        """A worker leaves cleanly: no failure (see :meth:`Losses.departed`)."""
        return self.losses.departed(peer)

    # -- what the trainer asks -------------------------------------------------------------
    def start_round(self, max_frames: int | None = None) -> tuple[Round, list[Action]]:
        """Sync mode: a new round asking one share of each live worker, in index order,
        and waiting for the replacements of workers lost before it (``"wait"``)."""
        return self.rounds.start_round(max_frames, self.losses.awaited_replacements())

    def end_round(self, round_: Round) -> list[tuple[WorkerInfo, TensorDictBase]]:
        """The shares of a complete round, ordered by worker index."""
        return self.rounds.end_round(round_)

    def take(self) -> tuple[WorkerInfo, TensorDictBase, list[Action]] | None:
        """Async mode: the oldest delivered batch (None: none yet), and its worker's new credit."""
        return self.rounds.take()

    def resume(self) -> list[Action]:
        """Async mode: hand the credits withheld while ``paused`` back to every worker."""
        return self.rounds.resume()

    def fail(self, error: BaseException) -> None:
        """The run's failure (the first one stays)."""
        self.losses.fail(error)

    def missing_workers(self) -> int:
        """Workers still to join of the ``expected`` ones (less those lost before joining)."""
        return self.losses.missing_workers()

    def waiting_for(self) -> list[WorkerInfo]:
        """The lost workers the trainer is blocked on (see :meth:`Losses.waiting_for`)."""
        return self.losses.waiting_for()

    def stalled_workers(self, now: float, timeout: float,
                        awake_since: float = 0.0) -> list[tuple[WorkerInfo, float]]:
        """Live workers that owe work and delivered nothing for more than ``timeout`` s."""
        return self.losses.stalled_workers(now, timeout, awake_since)

    def has_left(self, peer: bytes) -> bool:
        """``peer`` left the run cleanly (a departure, not a loss)."""
        return self.losses.has_left(peer)

    def worker_peers(self) -> dict[int, bytes]:
        """``{worker index: peer}`` of the live workers (whom a weight sender serves)."""
        return self.roster.worker_peers()

    def relay_routes(self) -> dict[int, bytes]:
        """``{worker index: relay peer}``: live workers whose weights go through a relay."""
        return self.roster.relay_routes()

    # -- the books, read (and a few set) by the coordinator and the tests -----------------------
    @property
    def live_workers(self) -> list[WorkerInfo]:
        return self.roster.live_workers

    @property
    def workers(self) -> dict[bytes, WorkerInfo]:
        return self.roster.workers

    @property
    def relays(self) -> dict[bytes, RelayInfo]:
        return self.roster.relays

    @property
    def loss_policy(self) -> LossPolicy:
        return self.losses.policy

    @property
    def sync(self) -> bool:
        return self.config.sync

    @property
    def prefetch(self) -> int:
        return self.config.prefetch

    @property
    def specs(self) -> dict[str, Any] | None:
        return self.admission.specs

    @property
    def round(self) -> Round | None:
        return self.rounds.round

    @property
    def ready(self) -> deque[tuple[WorkerInfo, TensorDictBase]]:
        return self.rounds.ready

    @property
    def budget(self) -> int | None:
        return self.rounds.budget

    @property
    def paused(self) -> bool:
        return self.rounds.paused

    @paused.setter
    def paused(self, value: bool) -> None:
        self.rounds.paused = value

    @property
    def clock(self) -> Callable[[], float]:
        return self.rounds.clock

    @clock.setter
    def clock(self, value: Callable[[], float]) -> None:
        self.rounds.clock = value

    @property
    def failure(self) -> BaseException | None:
        return self.losses.failure

    @property
    def gone(self) -> OrderedDict[bytes, None]:
        return self.losses.gone

    @property
    def left(self) -> OrderedDict[bytes, None]:
        return self.losses.left

    @property
    def vacant(self) -> OrderedDict[int, WorkerInfo]:
        return self.losses.vacant

    @property
    def written_off(self) -> int:
        return self.losses.written_off

    @property
    def departures(self) -> int:
        return self.losses.departures

    @property
    def expected(self) -> int:
        return self.losses.expected

    @expected.setter
    def expected(self, value: int) -> None:
        self.losses.expected = value


# The records and actions live in their own modules; importers of this one still find them.
__all__ = ["Action", "CatchUp", "CoordinatorState", "Expel", "Outbound", "RelayInfo", "Round",
           "Send", "WorkerInfo"]
