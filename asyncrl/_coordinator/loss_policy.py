"""What a lost worker does to the run (``on_worker_loss``): every decision, in one place.

The collector's ``on_worker_loss`` word is read here and nowhere else: the
coordinator's state, its watchdogs, the collector's process watcher and its
weight updates ask a :class:`LossPolicy` what a loss means (fail the run, write
the worker off, wait for a replacement, respawn a local slot) and which weight
schemes can serve such a run. A clean departure (a worker that says it leaves) is
no loss under any policy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, get_args

from .._errors import BadBatchError, WorkerLostError

if TYPE_CHECKING:
    from ..weights import WeightSyncScheme
    from .records import WorkerInfo

__all__ = ["ON_WORKER_LOSS", "LossOutcome", "LossPolicy", "OnWorkerLoss"]

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

#: The words ``on_worker_loss`` takes, in the order the docs list them.
ON_WORKER_LOSS: tuple[OnWorkerLoss, ...] = get_args(OnWorkerLoss)


@dataclass(frozen=True)
class LossOutcome:
    """What one loss does to the run: at most one of the three.

    ``failure``: the run fails with it; ``written_off``: the others carry on and
    nobody waits for this worker; ``vacancy``: the run expects a replacement.
    """

    failure: BaseException | None = None
    written_off: bool = False
    vacancy: bool = False


@dataclass(frozen=True)
class LossPolicy:
    """The run's answers to a lost worker, from the collector's ``on_worker_loss``.

    >>> policy = LossPolicy.check("restart")
    >>> policy.waits_for_replacements, policy.respawns, policy.fails_run
    (True, True, False)
    >>> LossPolicy.check("retry")
    Traceback (most recent call last):
    ...
    ValueError: on_worker_loss must be one of 'raise', 'continue', 'wait', 'restart'; got 'retry'
    """

    on_worker_loss: OnWorkerLoss = "raise"

    @classmethod
    def check(cls, value: Any) -> LossPolicy:
        """The policy ``value`` names, or a ValueError listing the words it may be."""
        if not isinstance(value, str) or value not in ON_WORKER_LOSS:
            raise ValueError(f"on_worker_loss must be one of "
                             f"{', '.join(map(repr, ON_WORKER_LOSS))}; got {value!r}")
        return cls(value)  # checked against ON_WORKER_LOSS above

    # -- what kind of run it is ------------------------------------------------------------
    @property
    def fails_run(self) -> bool:
        """``"raise"``: any loss fails the run."""
        return self.on_worker_loss == "raise"

    @property
    def waits_for_replacements(self) -> bool:
        """``"wait"`` / ``"restart"``: a lost worker's place (and its share of a sync
        round) is kept for a replacement, and the trainer may block on it."""
        return self.on_worker_loss in ("wait", "restart")

    @property
    def respawns(self) -> bool:
        """``"restart"``: a lost local worker's slot is respawned (a silent one killed first)."""
        return self.on_worker_loss == "restart"

    def check_scheme(self, model_id: str, scheme: WeightSyncScheme) -> None:
        """A weight scheme whose membership is fixed serves only runs that fail on a loss."""
        if self.fails_run or not scheme.fixed_membership:
            return
        name = type(scheme).__name__
        raise ValueError(
            f"{name} (weight_sync_schemes[{model_id!r}]) cannot serve on_worker_loss="
            f"{self.on_worker_loss!r}: its process group has a fixed membership, a lost "
            "worker breaks every later broadcast and no replacement can join. Use "
            "on_worker_loss='raise', or ZmqWeightSyncScheme (any host) / "
            "SharedMemWeightSyncScheme (one host), whose workers may come and go")

    # -- what one loss does ----------------------------------------------------------------
    def lost(self, worker: WorkerInfo, what: str) -> LossOutcome:
        """``worker`` was lost (silent, disconnected, stalled: ``what`` says how)."""
        if self.fails_run:
            return LossOutcome(failure=WorkerLostError(
                f"worker {worker.index} ({worker.name}, pid {worker.pid} on {worker.host}) "
                f"{what}; pass on_worker_loss='continue', 'wait' or 'restart' to carry on"))
        if self.waits_for_replacements:
            return LossOutcome(vacancy=True)
        return LossOutcome(written_off=True)

    def exited(self, error: WorkerLostError, *, replaceable: bool) -> LossOutcome:
        """A local worker's process ended (``error`` says how). ``replaceable``: something
        can take its place (a respawn, a remote worker); without it a wait would never end."""
        if self.fails_run:
            return LossOutcome(failure=error)
        if self.waits_for_replacements and not replaceable:
            return LossOutcome(failure=WorkerLostError(
                f"{error}. on_worker_loss={self.on_worker_loss!r} waits for a replacement, "
                "but nothing can replace a dead local worker here (no respawn, no remote "
                "workers accepted): pass on_worker_loss='restart' to respawn it, or "
                "'continue' to go on without it"))
        if self.waits_for_replacements:
            return LossOutcome(vacancy=True)
        return LossOutcome(written_off=True)

    def bad_batch(self, worker: WorkerInfo, what: str) -> BadBatchError | None:
        """The run's failure for a batch that is not what was asked (None: go on)."""
        if not self.fails_run:
            return None
        return BadBatchError(
            f"worker {worker.index} ({worker.name}, pid {worker.pid} on {worker.host}) "
            f"sent a batch that is not what was asked: {what}; it was dropped and none "
            "of its frames were counted. Check that every worker runs the same asyncrl "
            "and env version, or pass on_worker_loss='continue' to carry on without it")

    def fails_weight_update(self, *, departed: bool) -> bool:
        """A worker went away while weights were sent to it: does the update fail?
        ``departed``: every such worker left cleanly, which fails nothing, whatever
        ``on_worker_loss``."""
        return self.fails_run and not departed

    def lost_during_update(self, lost: list[str], error: Exception) -> WorkerLostError:
        """The run's failure when the workers ``lost`` names went while weights were sent
        (``error``: the sender's, e.g. a :class:`~transports.PeerLostError`), whatever the
        coordinator has learnt of them by then."""
        return WorkerLostError(
            f"{', '.join(lost)} was lost while weights were sent to it ({error}); the "
            "update did not reach it. Pass on_worker_loss='continue', 'wait' or 'restart' "
            "to carry on without it")

    def restart_refused(self, slot: int, streak: int, max_restarts: int,
                        last: WorkerLostError) -> WorkerLostError | None:
        """``"restart"``: the run's failure when ``slot`` died ``streak`` + 1 times in a row
        without a batch, more than ``max_restarts`` allows (a crash loop); None: respawn it."""
        if not self.respawns or streak < max_restarts:
            return None
        return WorkerLostError(
            f"worker slot {slot} died {streak + 1} times in a row without delivering a "
            f"batch (on_worker_loss='restart', max_restarts={max_restarts}); its "
            f"last process: {last}")

    def replacement_timed_out(self, slots: str, timeout: float,
                              waited: float) -> WorkerLostError:
        """The run's failure when no replacement of ``slots`` came within ``timeout`` s."""
        return WorkerLostError(
            f"{slots} was lost and no replacement joined within replacement_timeout="
            f"{timeout} s (on_worker_loss={self.on_worker_loss!r}, "
            f"waited {waited:.1f} s): start a worker host (`asyncrl worker --connect "
            "...`), or pass on_worker_loss='continue' to go on without it")
