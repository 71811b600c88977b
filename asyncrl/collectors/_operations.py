"""What an operator does with a running collector: state, events, readiness, pause.

:class:`CollectorOperations` is mixed into every collector. It counts what is
handed to the trainer (frames, batches, rate, episode returns, policy lag: a
few tensor reductions per batch, nothing per env step), fans events out to
subscribers, and pauses and resumes collection. Subclasses add their workers
(:meth:`_worker_statistics`), readiness (:meth:`_wait_ready`) and what pausing
means to them (:meth:`_set_paused`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from typing import Any

import anyio
from tensordict import TensorDictBase

from .._errors import CollectorError, translated_errors
from .._observe.events import CollectorEvent, EventFanout, EventStream
from .._observe.statistics import (
    CollectorState,
    CollectorStatistics,
    EpisodeReturns,
    RateMeter,
    WorkerStatistics,
    policy_lag,
)


class Pausing:
    """What ``collector.pause()`` returns: await it, or use it as ``async with``.

    ``await collector.pause()`` pauses and returns once paused; ``async with
    collector.pause():`` pauses for the block and resumes after it. On an open
    collector the pause starts at the call (no batch is handed over from then
    on), awaited or not; TorchRL's plain ``with collector.pause():`` raises a
    ``TypeError`` naming ``async with``.

    >>> async def train_without_collecting(collector):            # doctest: +SKIP
    ...     async with collector.pause():   # no batch is handed over in this block
    ...         await evaluate(policy)
    """

    def __init__(self, *, pause: Callable[[], Awaitable[None]],
                 resume: Callable[[], Awaitable[None]], undo: Callable[[], None],
                 started: Awaitable[None] | None = None) -> None:
        self._pause = pause  # pauses when awaited (a collector not open at the call)
        self._resume = resume
        self._undo = undo  # ends a pause this call started (a plain ``with``: wrong)
        self._started = started

    def __await__(self) -> Generator[Any, None, None]:
        return self._wait().__await__()

    async def _wait(self) -> None:
        if self._started is not None:
            await self._started
        else:
            await self._pause()

    async def __aenter__(self) -> None:
        await self._wait()

    async def __aexit__(self, *exc_info: object) -> None:
        await self._resume()

    def __enter__(self) -> None:
        if self._started is not None:  # this call paused: undo it (an earlier pause stays)
            self._undo()
        raise TypeError("on an async collector, pause() is entered with 'async with "
                        "collector.pause():' (or 'await collector.pause()' ... 'await "
                        "collector.resume()'); BlockingCollector's pause() takes a plain "
                        "'with'")

    def __exit__(self, *exc_info: object) -> None:
        return None


class CollectorOperations:
    """``statistics()``, ``events()``, ``wait_ready()``, ``pause()`` / ``resume()``."""

    #: How many recent episodes ``episode_return_mean`` averages.
    episode_window: int = 100

    def _init_operations(self) -> None:
        self._events = EventFanout()
        self._rate = RateMeter()
        self._returns = EpisodeReturns(self.episode_window)
        self._batches = 0
        self._lag = 0
        self._paused = False
        self._resumed: anyio.Event | None = None  # set while not paused (made in the loop)

    # -- counting what is handed over -----------
    def _note_batch(self, batch: TensorDictBase, frames: int) -> None:
        self._batches += 1
        self._rate.add(frames)
        self._returns.add(batch)
        self._lag = policy_lag(batch, self.policy_version)

    @property
    def policy_version(self) -> int:
        return 0

    def statistics(self) -> CollectorStatistics:
        """A snapshot: frames, frames/s, batches, policy version and lag, episode
        returns, and one :class:`WorkerStatistics` per worker (lost ones too).

        See :class:`~asyncrl.CollectorStatistics` for the exact meaning of each field.
        """
        return CollectorStatistics(
            frames=int(getattr(self, "frames_collected", 0)),
            frames_per_second=self._rate.rate(), batches=self._batches,
            policy_version=self.policy_version, policy_lag=self._lag, paused=self._paused,
            episodes=self._returns.episodes, episode_return_mean=self._returns.mean(),
            workers=tuple(self._worker_statistics()), state=self._state(),
            served_refusals=self._served_refusals())

    def _state(self) -> CollectorState:
        """The collector's state as a whole: failed first (it stays so once closed)."""
        if self._run_failed():
            return "failed"
        if getattr(self, "_closed", False):
            return "closed"
        if getattr(self, "_task_group", None) is None:
            return "starting"
        if self._paused:
            return "paused"
        return "waiting" if self._waiting_for_workers() else "running"

    def _run_failed(self) -> bool:
        """The run failed (a collector with workers: a fatal worker error, say)."""
        return False

    def _waiting_for_workers(self) -> bool:
        """No progress until workers join (expected ones, or lost ones' replacements)."""
        return False

    def continue_counts(self, *, frames: int, batches: int) -> None:
        """Go on counting from a checkpointed run's ``frames`` (``frames_collected``) and
        ``batches`` (``statistics().batches``); ``total_frames`` counts them too."""
        if frames < 0 or batches < 0:
            raise ValueError(f"expected counts >= 0, got frames={frames}, batches={batches}")
        self.frames_collected = frames
        self._batches = batches

    def episode_returns(self, last: int | None = None) -> list[float]:
        """Returns of the most recent episodes that ended in delivered batches, oldest first
        (at most ``episode_window``; ``last``: only that many)."""
        recent = list(self._returns.recent)
        return recent if last is None else recent[max(0, len(recent) - last):]

    def _worker_statistics(self) -> list[WorkerStatistics]:
        return []

    def _served_refusals(self) -> dict[str, int]:
        """Remote calls to served modules refused, by reason (a collector with remote
        hosts that serves modules: see ``asyncrl.served``)."""
        return {}

    # -- events -----------
    def events(self, maxlen: int = 1024) -> EventStream:
        """Subscribe to this collector's events: ``async for event in collector.events()``.

        Each call is a new subscription that sees the events from then on (several
        may run at once; subscribe before ``async with`` to see every join) and ends
        when the collector closes. Publishing never waits
        for a subscriber: a subscription holds at most ``maxlen`` events and, when
        it is full, drops the oldest and counts it in ``stream.dropped``.
        Unsubscribe with ``await stream.aclose()`` (or ``async with``).
        """
        return self._events.subscribe(maxlen)

    def _publish(self, event: CollectorEvent) -> None:
        self._events.publish(event)

    def _weight_senders(self) -> dict[str, Any]:
        """The collector's weight senders by model id (metrics read their latency)."""
        return {}

    def _on_weights_applied(self, model_id: str, version: int, seconds: float) -> None:
        self._publish(CollectorEvent("weights_applied", version=version, model_id=model_id,
                                     seconds=seconds))

    # -- readiness -----------
    async def wait_ready(self, timeout: float | None = None) -> None:
        """Return once every expected worker joined (local and ``remote_workers``).

        Raises the run's error if it failed meanwhile, and ``TimeoutError`` naming
        the workers still missing after ``timeout`` seconds (None: no limit).
        """
        try:
            with anyio.fail_after(timeout), translated_errors():
                await self._wait_ready()
        except TimeoutError:
            raise TimeoutError(self._not_ready_message(timeout)) from None

    async def _wait_ready(self) -> None:
        pass

    def _not_ready_message(self, timeout: float | None) -> str:
        return f"the collector was not ready within {timeout} s"

    # -- pause -----------
    @property
    def paused(self) -> bool:
        """True between ``pause()`` and ``resume()``."""
        return self._paused

    def pause(self) -> Pausing:
        """Stop handing batches over and asking workers for more; ``await`` it or ``async with``.

        Once ``await collector.pause()`` returned, no batch is handed to the trainer
        (``__anext__`` waits, ``start()`` stops filling its buffer) until
        :meth:`resume`: zero frames arrive. Workers get no new credit (async) and
        no new round (sync); what they were already asked for (async: at most
        ``prefetch`` batches each; sync: their share of the round in progress) is
        collected, held in the trainer, and handed over after ``resume()`` —
        never dropped. A batch already handed over when ``pause()`` was called is
        still returned. Idempotent.
        """
        return Pausing(pause=self._pause, resume=self.resume, undo=self._undo_pause,
                       started=self._pause_at_call())

    def _pause_at_call(self) -> Awaitable[None] | None:
        """Pause now, on an open collector (None: ``_pause`` runs when awaited)."""
        return None

    def _undo_pause(self) -> None:
        """A pause started by a call that turned out wrong (plain ``with``): hand over again."""
        if self._paused:
            self._paused = False
            if self._resumed is not None:
                self._resumed.set()

    async def _pause(self) -> None:
        if self._paused:
            return
        self._mark_paused()
        await self._set_paused(True)

    def _mark_paused(self) -> None:
        self._paused = True
        self._resumed = anyio.Event()

    async def resume(self) -> None:
        """Resume after :meth:`pause`: held batches are handed over, workers get work again.

        Idempotent (resuming a collector that is not paused does nothing).
        """
        if not self._paused:
            return
        self._paused = False
        if self._resumed is not None:
            self._resumed.set()
        await self._set_paused(False)

    async def _wait_resumed(self) -> None:
        while self._paused and self._resumed is not None:
            await self._resumed.wait()

    async def _set_paused(self, paused: bool) -> None:
        pass

    # -- env state: Collector and MultiCollector have it; the others refuse, saying so ------
    def state_dict(self) -> Any:
        """Refused here (env-stepper processes): see ``docs/gymnasium.md``."""
        raise self._no_env_state("state_dict()")

    def load_state_dict(self, state_dict: dict[str, Any]) -> Any:
        """Refused here (env-stepper processes): see ``docs/gymnasium.md``."""
        raise self._no_env_state("load_state_dict()")

    def getattr_env(self, attr: str, worker_ids: Any = None) -> Any:
        """Refused here (env-stepper processes): see ``docs/gymnasium.md``."""
        raise self._no_env_state(f"getattr_env({attr!r})")

    def sync_env_statistics(self) -> Any:
        """Refused here (env-stepper processes): see ``docs/gymnasium.md``."""
        raise self._no_env_state("sync_env_statistics()")

    def _no_env_state(self, call: str) -> CollectorError:
        return CollectorError(
            f"{type(self).__name__} has no {call}: its envs step in env-stepper processes "
            "that answer no control messages. For wrappers' state (NormalizeObservation's "
            "obs_rms) use MultiSyncCollector / MultiAsyncCollector or Collector, or build "
            "the env with fixed statistics (docs/gymnasium.md)")


__all__ = ["CollectorOperations", "Pausing"]
