"""What a collector reports about itself: exported dataclasses, and the meters behind them.

:class:`CollectorStatistics` is one frozen snapshot (``collector.statistics()``);
its ``workers`` are :class:`WorkerStatistics`, one per worker ever admitted (lost
ones too, with their exit code) and per local process still joining, by index. The meters
(:class:`RateMeter`, :class:`EpisodeReturns`) run in the trainer once per
delivered batch, on whole tensors: nothing is added to the workers' hot loop.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal, get_args

import torch
from tensordict import TensorDictBase

#: A worker's life cycle as the coordinator sees it:
#:
#: * ``"joining"``: a local process was started and has not been admitted yet;
#: * ``"collecting"``: admitted, with work asked of it (async: a credit; sync: a share
#:   of the current round) that it has not delivered yet;
#: * ``"idle"``: admitted, nothing asked of it (between rounds, at ``prefetch`` batches
#:   ahead of the trainer, or while the collector is paused);
#: * ``"lost"``: its process ended (``exit_code``), it went silent for ``peer_timeout``,
#:   it delivered nothing for ``sample_timeout``, or it was refused for a bad batch; it
#:   never comes back under this entry;
#: * ``"waiting"``: a line of its own, beside a lost worker's, while the trainer is
#:   blocked waiting for that worker's replacement (``on_worker_loss="wait"`` or
#:   ``"restart"``; bounded by ``replacement_timeout``).
#: * ``"left"``: a remote worker that left cleanly (its host stopped on SIGTERM); its
#:   unfinished work went to the others.
WorkerState = Literal["joining", "collecting", "idle", "lost", "waiting", "left"]
#: A collector's state as a whole (``statistics().state``), see :class:`CollectorStatistics`.
CollectorState = Literal["starting", "running", "waiting", "paused", "failed", "closed"]
#: Why a remote host's call to a served module was refused: the keys of
#: :attr:`CollectorStatistics.served_refusals` (``asyncrl.served`` counts them; every one
#: is a labelled series of ``asyncrl_served_refusals_total``, 0 until it happens).
ServedRefusalReason = Literal["not admitted", "malformed", "unknown module", "busy"]
SERVED_REFUSAL_REASONS: tuple[ServedRefusalReason, ...] = get_args(ServedRefusalReason)


@dataclass(frozen=True)
class WorkerStatistics:
    """One worker as the coordinator sees it (see :meth:`MultiCollector.statistics`).

    >>> s = WorkerStatistics(0, "worker-0", "host", 4242, "collecting")
    >>> (s.state, s.frames, s.exit_code)
    ('collecting', 0, None)
    """

    index: int  #: its worker index (a respawned local slot keeps its index)
    name: str
    host: str
    pid: int  #: its process id, on ``host``
    state: WorkerState
    frames: int = 0  #: frames of its batches handed to the trainer
    batches: int = 0  #: batches (async) or shares (sync) it delivered to the coordinator
    ahead: int = 0  #: batches asked of it or waiting for the trainer (at most ``prefetch``)
    last_batch_age: float | None = None  #: seconds since its last batch (None: none yet)
    heartbeat_age: float | None = None  #: seconds since it was last heard (None: not live)
    exit_code: int | None = None  #: a local process's exit code (negative: the signal)
    relay: str = ""  #: the relay its weight updates go through ("": sent to it directly)
    #: Batches (and their tensor bytes) that reached the trainer through shared memory
    #: (a local worker after its first batch) and over its socket (docs/data_plane.md).
    shared_memory_batches: int = 0
    shared_memory_bytes: int = 0
    socket_batches: int = 0
    socket_bytes: int = 0

    @property
    def delivered(self) -> int:
        """Alias of :attr:`batches` (its name before 0.2)."""
        return self.batches


@dataclass(frozen=True)
class CollectorStatistics:
    """A snapshot of a collector: what it delivered, how fast, how fresh, and its workers.

    ``policy_lag`` is ``policy_version`` (the newest version sent, at the time the last
    batch was handed over) minus the *oldest* ``("collector", "policy_version")`` among
    that batch's frames: 0 when every frame was collected with the newest weights (sync
    mode after ``await update_policy_weights()``), ``k`` when some frames are ``k``
    versions behind; 0 before the first batch and for batches without that key.

    ``episode_return_mean`` is the mean undiscounted return (sum of ``("next",
    "reward")``) of the last ``episode_window`` episodes that ended (``("next",
    "done")``) in delivered batches, episodes that span several batches included
    (joined by ``("collector", "traj_ids")``); None until one ended. With
    ``info_keys=["episode"]`` and gymnasium's ``RecordEpisodeStatistics``, it is the
    env's own ``episode.r`` (the raw return, before ``NormalizeReward``).

    >>> async with MultiSyncCollector("CartPole-v1", num_workers=2,          # doctest: +SKIP
    ...                               frames_per_batch=200) as c:
    ...     await c.__anext__()
    ...     s = c.statistics()
    ...     print(s.frames, s.frames_per_second, [w.state for w in s.workers])
    """

    frames: int = 0  #: frames handed to the trainer (``frames_collected``)
    frames_per_second: float = 0.0  #: over the batches of the last ``RateMeter.window`` s
    batches: int = 0  #: batches handed to the trainer
    policy_version: int = 0  #: newest ``"policy"`` weights version sent (0: initial)
    policy_lag: int = 0  #: see the class docstring
    paused: bool = False
    episodes: int = 0  #: episodes that ended in delivered batches
    episode_return_mean: float | None = None  #: see the class docstring
    workers: tuple[WorkerStatistics, ...] = ()
    #: ``"starting"`` (not open yet), ``"running"``, ``"waiting"`` (for expected workers
    #: to join, or for a lost worker's replacement), ``"paused"``, ``"failed"`` (the run
    #: failed: the next call raises why; it stays so once closed), ``"closed"``.
    state: CollectorState = "running"
    #: Batches (and tensor bytes) of every worker that reached the trainer through shared
    #: memory and over the socket, since the collector opened (docs/data_plane.md).
    shared_memory_batches: int = 0
    shared_memory_bytes: int = 0
    socket_batches: int = 0
    socket_bytes: int = 0
    #: Local workers kept on the socket because ``/dev/shm`` was full.
    shared_memory_fallbacks: int = 0
    #: Remote hosts' calls to served modules refused, by reason (``"not admitted"``,
    #: ``"malformed"``, ``"unknown module"``, ``"busy"``: :data:`SERVED_REFUSAL_REASONS`);
    #: see ``asyncrl.served``.
    served_refusals: Mapping[str, int] = field(default_factory=dict)


@dataclass
class BatchArrivals:
    """How batches reached the trainer, counted at receipt: shared memory or the socket.

    Bytes are the tensor bytes a batch carried: what was copied out of a slot, or what
    crossed the socket (a compact batch's compact form).

    >>> arrivals = BatchArrivals()
    >>> arrivals.add(shared_memory=True, nbytes=512)
    >>> arrivals.as_dict()["shared_memory_batches"], arrivals.socket_batches
    (1, 0)
    """

    shared_memory_batches: int = 0
    shared_memory_bytes: int = 0
    socket_batches: int = 0
    socket_bytes: int = 0

    def add(self, *, shared_memory: bool, nbytes: int) -> None:
        if shared_memory:
            self.shared_memory_batches += 1
            self.shared_memory_bytes += nbytes
        else:
            self.socket_batches += 1
            self.socket_bytes += nbytes

    def as_dict(self) -> dict[str, Any]:
        """The counts by field name (``WorkerStatistics``' and ``CollectorStatistics``')."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


class RateMeter:
    """Frames per second delivered over the last ``window`` seconds; 0 once frames stop.

    The rate is the frames delivered in ``(now - window, now]`` over ``window``;
    during the first window after the first delivery, the frames after it over
    the time since (the first delivery only opens the interval). When deliveries
    stop, the rate falls to 0 within ``window`` seconds (a gauge that kept the
    last rate would say a stalled run is collecting).

    >>> now = [0.0]
    >>> meter = RateMeter(window=10.0, clock=lambda: now[0])
    >>> meter.add(100); now[0] = 1.0; meter.add(100); meter.rate()
    100.0
    >>> now[0] = 12.0; meter.rate()
    0.0
    """

    def __init__(self, window: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.window = window
        self._clock = clock
        self._samples: deque[tuple[float, int]] = deque()
        self._frames = 0  # frames in _samples
        self._first: float | None = None  # when the first delivery came

    def add(self, frames: int) -> None:
        now = self._clock()
        if self._first is None:
            self._first = now
        self._samples.append((now, frames))
        self._frames += frames
        self._trim(now)

    def rate(self) -> float:
        now = self._clock()
        self._trim(now)
        if self._first is None or not self._samples:
            return 0.0
        if now - self._first < self.window:  # still in the first window
            opened = self._samples[0][1] if self._samples[0][0] == self._first else 0
            elapsed = now - self._first
            return float((self._frames - opened) / elapsed) if elapsed > 0 else 0.0
        return float(self._frames / self.window)

    def _trim(self, now: float) -> None:
        samples = self._samples
        while samples and (now - samples[0][0] >= self.window or len(samples) > 4096):
            _, frames = samples.popleft()  # bounded, whatever the batch rate
            self._frames -= frames


#: Where RecordEpisodeStatistics' return lands with ``info_keys=["episode"]``.
RAW_RETURN_KEY = ("next", "episode", "r")


class EpisodeReturns:
    """Returns of the episodes that end in delivered batches, a few tensor ops per batch.

    Rewards are summed per ``("collector", "traj_ids")``; an id whose episode did
    not end in this batch is carried to the next one (at most ``max_open`` ids:
    a lost worker's unfinished episodes are forgotten, oldest first). A batch that
    carries the env's own returns (RecordEpisodeStatistics' ``("next", "episode",
    "r")``, read with ``info_keys=["episode"]``) gives those instead: the raw
    returns, before a ``NormalizeReward`` the rewards went through.
    """

    def __init__(self, window: int = 100, max_open: int = 65_536) -> None:
        self.recent: deque[float] = deque(maxlen=window)
        self.episodes = 0
        self._open: OrderedDict[int, float] = OrderedDict()
        self._max_open = max_open

    def add(self, batch: TensorDictBase) -> None:
        reward = batch.get(("next", "reward"), None)
        done = batch.get(("next", "done"), None)
        ids = batch.get(("collector", "traj_ids"), None)
        if reward is None or done is None or ids is None:
            return
        raw = batch.get(RAW_RETURN_KEY, None)
        if isinstance(raw, torch.Tensor) and raw.numel() == ids.numel():
            self._add_raw(raw.reshape(-1), done.reshape(ids.numel(), -1).any(-1))
            return
        ids = ids.reshape(-1)
        reward = reward.reshape(ids.shape[0], -1).sum(-1).double()
        done = done.reshape(ids.shape[0], -1).any(-1)
        unique, inverse = torch.unique(ids, return_inverse=True)
        # On the batch's device (a CUDA batch stays there): one transfer, by tolist().
        sums = torch.zeros(unique.shape[0], dtype=torch.float64,
                           device=ids.device).index_add_(0, inverse, reward)
        ended = torch.zeros(unique.shape[0], dtype=torch.bool, device=ids.device).index_fill_(
            0, inverse[done], True)
        for traj, total, end in zip(unique.tolist(), sums.tolist(), ended.tolist(), strict=True):
            total += self._open.pop(traj, 0.0)
            if end:
                self.recent.append(total)
                self.episodes += 1
            else:
                self._open[traj] = total
        while len(self._open) > self._max_open:
            self._open.popitem(last=False)

    def _add_raw(self, raw: torch.Tensor, done: torch.Tensor) -> None:
        ended = raw[done].double().tolist()  # one transfer
        self.recent.extend(ended)
        self.episodes += len(ended)

    def mean(self) -> float | None:
        return sum(self.recent) / len(self.recent) if self.recent else None


def policy_lag(batch: TensorDictBase, version: int) -> int:
    """``version`` minus the oldest policy version among ``batch``'s frames (0 without one)."""
    versions = batch.get(("collector", "policy_version"), None)
    if versions is None or versions.numel() == 0:
        return 0
    return max(0, version - int(versions.min()))


__all__ = [
    "RAW_RETURN_KEY",
    "SERVED_REFUSAL_REASONS",
    "BatchArrivals",
    "CollectorState",
    "CollectorStatistics",
    "EpisodeReturns",
    "RateMeter",
    "ServedRefusalReason",
    "WorkerState",
    "WorkerStatistics",
    "policy_lag",
]
