"""What the coordinator runs by: the collector's arguments it reads, one frozen object.

A collector checks its constructor's arguments once
(:class:`~asyncrl.collectors.multi.config.MultiConfig`) and hands the coordinator
its part whole, as one :class:`CoordinatorConfig`: the coordinator, its state and
each part of the state (:class:`~.admission.Admission`, :class:`~.rounds.Rounds`,
:class:`~.losses.Losses`, :class:`~.batch_sink.BatchSink`) read the fields they
need from it; none of them takes the fields one by one, so an option added here
reaches every reader without a layer in between naming it. The rollout's options
(:class:`~asyncrl._rollout.options.RolloutOptions`) are nested as they are, and
every welcome carries them.

What is only known once the run opened (the spawn token, the reference specs,
the weight schemes' configs) is :class:`~.admission.AdmissionTerms`, passed whole
the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .._protocol import Role
from .._rollout.options import RolloutOptions
from .loss_policy import LossPolicy

__all__ = ["CoordinatorConfig"]


@dataclass(frozen=True)
class CoordinatorConfig:
    """The run's rules, as the coordinator reads them (checked by the collector, once).

    >>> config = CoordinatorConfig(sync=True, share_frames=[8, 8], accept_remote=True)
    >>> config.share_frames, config.share_of(3), config.remote_start
    ((8, 8), 8, 2)
    """

    #: Sync rounds (one share of every worker per batch) or async credits.
    sync: bool
    #: Each worker's frames per batch, by index (remote indices wrap around).
    share_frames: tuple[int, ...]
    #: Async: batches a worker may run ahead of the trainer (credits); sync: slots - 1.
    prefetch: int = 1
    #: Sync: the fraction of workers after which the others are cut short (None: never).
    preemptive_threshold: float | None = None
    #: Sync: how a round's shares are joined (``"stack"`` or a dim; see ``assemble``).
    cat_results: str | int = "stack"
    #: Each worker's frames with random actions before its policy is used.
    init_random_frames: int = 0
    #: What a lost worker does to the run (``on_worker_loss``).
    loss_policy: LossPolicy = field(default_factory=LossPolicy)
    #: Whether a peer that was not spawned here may join (``remote_workers > 0``).
    accept_remote: bool = False
    #: Remote workers (and relays) alive at once (None: any number).
    max_remote_workers: int | None = None
    #: The first index a remote worker gets (None: after the shares' local slots).
    first_remote_index: int | None = None
    #: Async: batches the run may still grant (``total_frames`` / ``frames_per_batch``).
    batch_budget: int | None = None
    #: TorchRL's ``compact_obs``: batches without the ``("next", K)`` twins.
    compact_obs: bool = False
    #: Local workers' batches through shared memory (remote ones always on the socket).
    shared_memory_batches: bool = False
    #: The options every worker's rollout runs with; its welcome carries them.
    rollout: RolloutOptions = field(default_factory=RolloutOptions)
    #: The role of the workers this run admits (:attr:`~asyncrl._protocol.Hello.role`):
    #: ``"rollout"`` (a MultiCollector's) or ``"env"`` (central inference's env workers).
    role: Role = "rollout"

    def __post_init__(self) -> None:
        # Frozen all the way down: a share list changed later would change no one's welcome.
        object.__setattr__(self, "share_frames", tuple(self.share_frames))

    @property
    def remote_start(self) -> int:
        """The first index a remote worker gets: local slots are ``0 .. remote_start - 1``."""
        if self.first_remote_index is None:
            return len(self.share_frames)
        return self.first_remote_index

    def share_of(self, index: int) -> int:
        """The share (frames per batch it sends) of the worker admitted with ``index``."""
        return self.share_frames[index % len(self.share_frames)]
