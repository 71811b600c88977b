"""What every collector shares: iteration, frame accounting, post-processing, free run."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Generic, Self, overload

import anyio
from tensordict import TensorDictBase
from typing_extensions import TypeVar

from transports import TaskGroupResource

from .._errors import CollectorError, CollectorStopped, translated_errors
from .._observe.tracing import span, trace_batch
from .._protocol import drop_twins
from .._spawn.threads import TrainerThreads
from ._assemble import MASK_KEY, split_trajectories
from ._config import compact_obs_option, normalise_total_frames
from ._operations import CollectorOperations
from ._staleness import StalePolicyWatch
from ._started import Kind, Started, StartedCalls, not_open, started_at_call
from ._torchrl_habits import TorchRLHabits
from ._trajectories import TrajectoryAssembler, check_trajectory_options

T = TypeVar("T")
#: The type of a collector's ``replay_buffer`` (None: it has none). Only for type
#: checkers: ``async for batch in collector`` gives a ``TensorDictBase`` when it is
#: None (the default), and None when a replay buffer is given (it was filled).
RB = TypeVar("RB", default=None)


class BaseCollector(CollectorOperations, TaskGroupResource, TorchRLHabits, Generic[RB]):
    """Async iteration over batches, ``total_frames``, ``postproc``, ``start()``/``pause()``.

    The base of every collector: code that takes any of them is typed with it.

    >>> from asyncrl import BaseCollector, Collector, MultiSyncCollector
    >>> issubclass(Collector, BaseCollector), issubclass(MultiSyncCollector, BaseCollector)
    (True, True)
    """

    #: A weight update started without ``await`` is applied before the next batch is
    #: asked for (False in async mode: batches carry the version that made them).
    sync_updates: bool = True
    #: Warns once when the trainer's policy changes but its workers' does not (`_staleness`).
    _stale_watch: StalePolicyWatch | None = None
    _compact_obs = False

    @property
    def compact_obs(self) -> bool:
        """TorchRL's ``compact_obs``: batches without the ``("next", K)`` twins of
        observation / state keys (:func:`~asyncrl._protocol.compact_frames.drop_twins`).

        Set after construction, it takes effect from the next batch, by the same rule
        (iteration drops the twins); except that a collector whose workers were told
        ``compact_obs=True`` cannot give the twins back: setting it False there is refused.
        """
        return self._compact_obs

    @compact_obs.setter
    def compact_obs(self, value: bool) -> None:
        name = type(self).__name__
        value = compact_obs_option(name, value)
        if not value and self._workers_drop_twins():
            raise CollectorError(
                f"{name}.compact_obs = False after {name}(compact_obs=True): its workers "
                "were told in their welcome to drop the ('next', K) twins, which cannot be "
                f"rebuilt; pass compact_obs=False to {name}(...) instead")
        self._compact_obs = value

    def _workers_drop_twins(self) -> bool:
        """Workers were told ``compact_obs=True`` when they were admitted (multi-process)."""
        return False

    def __init__(
        self,
        *,
        total_frames: int | None,
        frames_per_batch: int,
        split_trajs: bool = False,
        postproc: Callable[[TensorDictBase], TensorDictBase] | None = None,
        replay_buffer: RB | None = None,
        update_at_each_batch: bool = False,
        trajs_per_batch: int | None = None,
        traj_format: str | None = None,
        extend_buffer: bool = True,
        discard_partial_trajs: bool = False,
    ) -> None:
        self.total_frames = normalise_total_frames(total_frames, frames_per_batch)
        self.traj_format = check_trajectory_options(
            trajs_per_batch, traj_format, replay_buffer=replay_buffer,
            split_trajs=split_trajs, extend_buffer=extend_buffer)
        self.trajs_per_batch = trajs_per_batch
        self.extend_buffer = extend_buffer
        # reset_at_each_iter: a batch's unfinished trajectories never finish (TorchRL drops them).
        self._discard_partial = discard_partial_trajs
        self._trajs = TrajectoryAssembler(trajs_per_batch, self.traj_format) \
            if trajs_per_batch is not None else None
        self.split_trajs = split_trajs
        self.postproc = postproc
        self.replay_buffer: Any = replay_buffer
        self.update_at_each_batch = update_at_each_batch
        self.frames_collected = 0
        self._closed = False
        self._running_free = False
        self._free_run: anyio.CancelScope | None = None
        self._calls = StartedCalls()  # TorchRL-named calls, started when made
        self._init_operations()  # statistics, events, pause

    # -- to implement --------------------------------------------------------------
    async def _open(self) -> None:
        raise NotImplementedError

    async def _close(self) -> None:
        raise NotImplementedError

    async def _next_batch(self) -> TensorDictBase:
        raise NotImplementedError

    @started_at_call("update")
    async def update_policy_weights(self, policy_or_weights: Any = None, *, weights: Any = None,
                                    policy: Any = None, worker_ids: Any = None,
                                    model_id: str | None = None,
                                    weights_dict: dict[str, Any] | None = None) -> None:
        raise NotImplementedError

    def _start_call(self, name: str, work: Callable[[], Awaitable[T]], *,
                    before_next_batch: bool, kind: Kind = "barrier",
                    in_order: bool = True) -> Started[T]:
        """Start a TorchRL-named call now, on the collector's task group (``_started.py``)."""
        if self._task_group is None or self._closed:
            raise not_open(self, name)
        return self._calls.start(self._task_group, name, work, before_next_batch=before_next_batch,
                                 kind=kind, in_order=in_order)

    def _pause_at_call(self) -> Started[None] | None:
        if self._task_group is None or self._closed or self._paused:
            return None  # not open (paused when awaited), or already paused
        self._mark_paused()  # from now on, nothing is handed over

        async def tell_workers() -> None:
            # The state now, not at the call: a resume() in between must win.
            await self._set_paused(self._paused)

        return self._start_call("pause", tell_workers, before_next_batch=False)

    # -- life cycle ---------------------------------------------------------------------
    _threads_cap: TrainerThreads | None = None  # set by _open_with_workers, undone by aclose
    #: ``(num_threads, local_workers)`` of the trainer's thread cap (None: no cap).
    threads_cap_args: tuple[int | None, int] | None = None

    def _create_async_state(self) -> None:
        """Create the anyio primitives (they need a running event loop; __init__ may not)."""

    async def _open_with_workers(self, run: Callable[..., Awaitable[Any]], *,
                                 num_threads: int | None, local_workers: int) -> None:
        """Open a collector whose workers are processes: cap the trainer's threads, start ``run``.

        As TorchRL: the trainer (and a policy that runs in it) keeps the cores its
        local workers do not use (``num_threads``; None: the machine's minus
        ``local_workers``); a policy whose OpenMP pool spans cores busy with workers
        waits for descheduled threads at every call (measured: 50x slower).
        :meth:`aclose` restores the count. ``run`` is started in the task group
        (``task_status.started()`` once it serves).
        """
        self._threads_cap = TrainerThreads.cap(num_threads, local_workers)
        self.threads_cap_args = (num_threads, local_workers)  # BlockingCollector's thread too
        await self._task_group.start(run)

    async def __aenter__(self) -> Self:
        if self._closed or self._task_group is not None:
            state = "closed" if self._closed else "open"
            raise CollectorError(
                f"this {type(self).__name__} was already entered and is {state}: a collector "
                "is single-use (its workers and sockets are gone once closed); make a new one "
                "for another run")
        self._create_async_state()
        return await super().__aenter__()

    async def aclose(self) -> None:
        """Stop workers and release everything. Idempotent; bounded even when cancelled."""
        if self._closed:
            return
        self._closed = True
        if self._free_run is not None:
            self._free_run.cancel()
        if self._resumed is not None:
            self._resumed.set()  # a trainer call waiting for resume() ends
        self._calls.close()  # started calls still running end (shutdown() itself goes on)
        try:
            with anyio.CancelScope(shield=True):
                await self._close()
        finally:
            if self._threads_cap is not None:
                self._threads_cap.restore()  # idempotent
            self._events.close()  # subscriptions end once drained

    # -- iteration ---------------------------------------------------------------------
    def __aiter__(self) -> Self:
        return self

    @overload
    async def __anext__(self: BaseCollector[None]) -> TensorDictBase: ...
    @overload
    async def __anext__(self) -> None: ...

    async def __anext__(self) -> TensorDictBase | None:
        """The next batch; None when ``replay_buffer`` was given (TorchRL): it was filled.

        With ``trajs_per_batch``, batches of whole trajectories (see
        :mod:`asyncrl.collectors._trajectories`); into a replay buffer, each batch's complete
        trajectories, flat.
        """
        with translated_errors():  # a wire error reaches the user as an AsyncRLError
            return await self._anext()

    async def _anext(self) -> TensorDictBase | None:
        trajs = self._trajs
        while True:
            if trajs is not None and self.replay_buffer is None and trajs.ready:
                return trajs.pop_batch()
            batch = await self._next_frames()
            if trajs is None:
                if self.replay_buffer is None:
                    return batch
                self.replay_buffer.extend(batch.reshape(-1))  # frames, not rows
                return None
            trajs.ingest(batch)
            if self._discard_partial:
                trajs.drop_partial()
            if self.replay_buffer is not None:
                done = trajs.pop_all()
                if done is not None:
                    self.replay_buffer.extend(done)
                return None

    def getattr_rb(self, attr: str) -> Any:
        """An attribute of ``replay_buffer`` (TorchRL's name)."""
        if self.replay_buffer is None:
            raise CollectorError(f"getattr_rb({attr!r}): this collector has no replay_buffer")
        return getattr(self.replay_buffer, attr)

    def _trajectories_reset(self, *, partial: bool) -> None:
        """After a reset: a full one forgets every trajectory being assembled (TorchRL).

        A partial one keeps them: the reset envs' unfinished trajectories never
        finish, and the other envs' go on.
        """
        if self._trajs is not None and not partial:
            self._trajs.flush()

    async def _next_frames(self) -> TensorDictBase:
        """One batch as collected, counted, split and post-processed."""
        # Calls started without await: weights (sync mode), seeds, resets come first,
        # and one that failed with nobody awaiting it raises here.
        await self._calls.settle()
        if self._closed:
            raise StopAsyncIteration
        if 0 <= self.total_frames <= self.frames_collected:
            raise StopAsyncIteration
        await self._wait_resumed()  # paused: nothing is handed over until resume()
        if self._closed:
            raise StopAsyncIteration
        if self.update_at_each_batch:
            await self.update_policy_weights()
        if self._stale_watch is not None:
            self._stale_watch.check(self.policy_version)
        with span("asyncrl.batch") as current:  # a shared no-op without the otel extra
            try:
                batch = await self._next_batch()
            except CollectorStopped:  # a stop (SIGTERM), not a failure: the iteration ends
                raise StopAsyncIteration from None
            except Exception:
                if self._closed:  # closed from another task while this one waited
                    raise StopAsyncIteration from None
                raise
            await self._wait_resumed()  # paused meanwhile: held until resume()
            if self._closed:
                raise StopAsyncIteration
            # Padding of a preempted round is not frames (TorchRL counts the mask).
            frames = int(batch.get(MASK_KEY).sum()) \
                if MASK_KEY in batch.keys(include_nested=True) else batch.numel()
            self.frames_collected += frames
            self._note_batch(batch, frames)  # statistics(): a few reductions per batch
            if current is not None and current.is_recording():
                trace_batch(current, batch, frames, self.policy_version, self._lag)
            if self.compact_obs:  # the next frame's K (TorchRL rebuilds it when sampling)
                # The compact-frame rule's last call site (``compact_frames.py`` lists the
                # three): the in-process and batched collectors' batches, and a multi-process
                # one's when compact_obs was set after construction; a no-op on the batches
                # of workers told compact_obs (they dropped the twins before sending).
                batch = drop_twins(batch)
            if self.split_trajs:
                batch = split_trajectories(batch)
            if self.postproc is not None:
                batch = self.postproc(batch)
            return batch

    # -- free run into a sink ---------------------------------------------------------------
    def start(self) -> None:
        """Collect in the background into ``replay_buffer`` (anything with ``.extend(td)``).

        Frames are written as iteration writes them (flat: ``len(rb)`` grows by
        the frames collected; whole trajectories with ``trajs_per_batch``). Stops
        at ``total_frames``, at :meth:`aclose`, or on an error, which is raised out
        of the collector's ``async with`` block.
        """
        if self.replay_buffer is None:
            raise CollectorError("start() needs a replay_buffer (any object with .extend(td))")
        if self._task_group is None:
            raise CollectorError("start() needs an open collector: use 'async with' first")
        if self._running_free:
            return
        self._running_free = True
        self._task_group.start_soon(self._run_free)

    async def _run_free(self) -> None:
        with anyio.CancelScope() as self._free_run:  # aclose() ends it
            async for _ in self:  # each step extends replay_buffer; pause() holds it
                pass
