"""What every collector shares: iteration, frame accounting, post-processing, free run."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Self

import anyio
from tensordict import TensorDictBase

from transports import TaskGroupResource

from .._batches import split_trajectories
from .._errors import CollectorError, CollectorStopped
from ._config import normalise_total_frames
from ._operations import CollectorOperations
from ._torchrl_habits import TorchRLHabits


class BaseCollector(CollectorOperations, TaskGroupResource, TorchRLHabits):
    """Async iteration over batches, ``total_frames``, ``postproc``, ``start()``/``pause()``."""

    def __init__(
        self,
        *,
        total_frames: int | None,
        batch_frames: int,
        split_trajs: bool = False,
        postproc: Callable[[TensorDictBase], TensorDictBase] | None = None,
        replay_buffer: Any = None,
        update_at_each_batch: bool = False,
    ) -> None:
        self.total_frames = normalise_total_frames(total_frames, batch_frames)
        self.split_trajs = split_trajs
        self.postproc = postproc
        self.replay_buffer = replay_buffer
        self.update_at_each_batch = update_at_each_batch
        self.frames_collected = 0
        self._closed = False
        self._running_free = False
        self._free_run: anyio.CancelScope | None = None
        self._init_operations()  # statistics, events, pause

    # -- to implement --------------------------------------------------------------
    async def _open(self) -> None:
        raise NotImplementedError

    async def _close(self) -> None:
        raise NotImplementedError

    async def _next_batch(self) -> TensorDictBase:
        raise NotImplementedError

    async def update_policy_weights(self, policy_or_weights: Any = None, *, weights: Any = None,
                                    policy: Any = None, worker_ids: Any = None,
                                    model_id: str | None = None,
                                    weights_dict: dict[str, Any] | None = None) -> None:
        raise NotImplementedError

    # -- life cycle ---------------------------------------------------------------------
    def _create_async_state(self) -> None:
        """Create the anyio primitives (they need a running event loop; __init__ may not)."""

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
        try:
            with anyio.CancelScope(shield=True):
                await self._close()
        finally:
            self._events.close()  # subscriptions end once drained

    # -- iteration ---------------------------------------------------------------------
    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> TensorDictBase:
        if self._closed:
            raise StopAsyncIteration
        if 0 <= self.total_frames <= self.frames_collected:
            raise StopAsyncIteration
        await self._wait_resumed()  # paused: nothing is handed over until resume()
        if self._closed:
            raise StopAsyncIteration
        if self.update_at_each_batch:
            await self.update_policy_weights()
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
        self.frames_collected += batch.numel()
        self._note_batch(batch)  # statistics(): a few reductions per batch
        if self.split_trajs:
            batch = split_trajectories(batch)
        if self.postproc is not None:
            batch = self.postproc(batch)
        return batch

    # -- free run into a sink ---------------------------------------------------------------
    def start(self) -> None:
        """Collect in the background into ``replay_buffer`` (anything with ``.extend(td)``).

        Stops at ``total_frames``, at :meth:`aclose`, or on an error, which is
        raised out of the collector's ``async with`` block.
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
            async for batch in self:
                self.replay_buffer.extend(batch)
