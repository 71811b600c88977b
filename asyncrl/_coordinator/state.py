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
:class:`~asyncrl._coordinator.loss_policy.LossPolicy`), each built from the one
:class:`~asyncrl._coordinator.config.CoordinatorConfig`. The parts are its public
attributes: an event that concerns one part is that part's method
(``state.losses.lost(peer)``, ``state.rounds.take()``, ``state.roster.live_workers``),
with no forwarding method here; only an event that concerns more than one (a hello
that fills a vacancy and a round's missing share, a batch checked by the rounds and
refused by the losses, a round that waits for replacements) is put together here.

The state is current before a send goes out, so a send may find its worker lost
meanwhile (another task handled an event while an earlier send awaited): an order
carries the admission it is for (``Send.worker``) and is dropped if that worker is
no longer alive; whatever it owed was released by the loss itself.
"""

from __future__ import annotations

from .._protocol import Batch, Hello, Progress
from .actions import Action, CatchUp, Expel, Outbound, Send
from .admission import Admission, AdmissionTerms
from .config import CoordinatorConfig
from .losses import Losses
from .records import RelayInfo, Roster, Round, WorkerInfo
from .rounds import Rounds


class CoordinatorState:
    """Who is admitted, what each worker owes, and what each event changes.

    Peers are hostile until admitted (protocol, spawn token or ``accept_remote``,
    free slot, ``check_specs``, ``max_remote_workers``); only a live admitted
    worker's batch counts, once :class:`BatchChecker` found it to be what was asked.

    >>> from .loss_policy import LossPolicy
    >>> state = CoordinatorState(CoordinatorConfig(sync=True, share_frames=[8, 8],
    ...                                            loss_policy=LossPolicy("continue")))
    >>> state.roster.live_workers, state.losses.policy.fails_run
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

    def batch(self, peer: bytes, batch: Batch) -> list[Action]:
        """A batch: counted if it is what its live worker was asked for, else refused."""
        worker = self.roster.live(peer)
        if worker is None:
            return []  # a stranger's, or a lost worker's late batch: never half-delivered
        if not self.rounds.expects(worker, batch):
            return []  # collected before this worker was (re)admitted: never half-delivered
        # compact_obs: the batch sink dropped the twins of a worker that did not.
        problems = self.rounds.batch_problems(worker, batch, self.admission.specs,
                                              dropped=self.config.compact_obs)
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

    # -- what the trainer asks -------------------------------------------------------------
    def start_round(self, max_frames: int | None = None) -> tuple[Round, list[Action]]:
        """Sync mode: a new round asking one share of each live worker, in index order,
        and waiting for the replacements of workers lost before it (``"wait"``)."""
        return self.rounds.start_round(max_frames, self.losses.awaited_replacements())


# The records and actions live in their own modules; importers of this one still find them.
__all__ = ["Action", "CatchUp", "CoordinatorState", "Expel", "Outbound", "RelayInfo", "Round",
           "Send", "WorkerInfo"]
