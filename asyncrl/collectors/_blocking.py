"""A blocking facade over any async collector, for training loops that are not async."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

from anyio.from_thread import BlockingPortal, start_blocking_portal
from tensordict import TensorDictBase

from .._spawn.threads import TrainerThreads
from ._started import starts_at_call


class BlockingCollector:
    """Use an async collector from plain code, through an anyio blocking portal.

    The collector runs on an event loop in a background thread; iteration and
    every coroutine method become blocking calls. The torch threads cap the
    collector puts on its trainer (``num_threads``: the cores its local workers
    do not use) is applied to the thread that enters ``with``, the one that
    trains, and undone when it leaves.

    >>> from asyncrl import BlockingCollector, MultiSyncCollector     # doctest: +SKIP
    >>> with BlockingCollector(MultiSyncCollector("CartPole-v1", num_workers=2,
    ...                                           frames_per_batch=200, total_frames=1000)) as c:
    ...     for batch in c:
    ...         c.update_policy_weights()

    Parameters
    ----------
    collector
        Any asyncrl collector, not entered yet (``with`` enters and closes it).
    backend
        The anyio backend of the event loop thread: ``"asyncio"`` or ``"trio"``.
    """

    def __init__(self, collector: Any, *, backend: str = "asyncio") -> None:
        self.collector = collector
        self.backend = backend
        self._portal_cm: AbstractContextManager[BlockingPortal] | None = None
        self._portal: BlockingPortal | None = None
        self._collector_cm: AbstractContextManager[Any] | None = None
        self._threads: TrainerThreads | None = None  # the entering thread's cap

    def __enter__(self) -> BlockingCollector:
        self._portal_cm = start_blocking_portal(self.backend)
        self._portal = self._portal_cm.__enter__()
        try:
            self._collector_cm = self._portal.wrap_async_context_manager(self.collector)
            self._collector_cm.__enter__()
        except BaseException:
            self._portal_cm.__exit__(None, None, None)
            raise
        # The collector capped torch's threads on the event loop's thread; torch keeps
        # the count per thread, so the trainer's (this one) needs its own cap.
        cap_args = getattr(self.collector, "threads_cap_args", None)
        if cap_args is not None:
            self._threads = TrainerThreads.cap(*cap_args)
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close(*exc_info)

    def close(self, *exc_info: Any) -> None:
        """Close the collector and stop the event loop thread. Idempotent.

        The event loop thread stops whatever closing the collector raised: a
        surviving loop thread would keep the process alive after the error.
        """
        exc_info = exc_info or (None, None, None)
        try:
            if self._collector_cm is not None:
                cm, self._collector_cm = self._collector_cm, None
                try:
                    cm.__exit__(*exc_info)
                except BaseException as error:
                    if error is not exc_info[1]:
                        raise
                    # The body's own error, re-raised by the collector's exit: the
                    # ``with`` statement raises it again, with the body's traceback
                    # (not the frames the portal added on its way back).
                    error.__traceback__ = exc_info[2]
        finally:
            self._portal = None
            if self._portal_cm is not None:
                cm2, self._portal_cm = self._portal_cm, None
                cm2.__exit__(None, None, None)
            if self._threads is not None:
                threads, self._threads = self._threads, None
                threads.restore()

    def shutdown(self, timeout: float | None = None, close_env: bool = True,
                 raise_on_error: bool = True) -> None:
        """TorchRL's name for :meth:`close` (same arguments as the collector's ``shutdown``)."""
        try:
            if self._portal is not None and self._collector_cm is not None:
                self._portal.call(_outcome, functools.partial(self.collector.shutdown, timeout,
                                                              close_env, raise_on_error))
        finally:
            self.close()

    def update_policy_weights_(self, policy_or_weights: Any = None, **kwargs: Any) -> None:
        """TorchRL's blocking call: send the weights, return once the workers applied them.

        Same arguments as the collector's ``update_policy_weights`` (``weights=``,
        ``policy=``, ``worker_ids=``, ``model_id=``, ``weights_dict=``).
        """
        self._require_portal().call(_outcome, functools.partial(
            self.collector.update_policy_weights, policy_or_weights, **kwargs))

    def __iter__(self) -> Iterator[TensorDictBase]:
        portal = self._require_portal()
        while True:
            try:
                yield portal.call(self.collector.__anext__)
            except StopAsyncIteration:
                return

    # -- operations (see CollectorOperations): plain calls, run on the collector's loop --------
    def pause(self) -> _BlockingPause:
        """Pause now (returns once paused); ``with c.pause():`` resumes after the block."""
        self._require_portal().call(_outcome, self.collector.pause)  # returns once paused
        return _BlockingPause(self)

    def resume(self) -> None:
        """Resume after :meth:`pause` (idempotent)."""
        self._require_portal().call(self.collector.resume)

    def wait_ready(self, timeout: float | None = None) -> None:
        """Block until every expected worker joined (``TimeoutError`` after ``timeout``)."""
        self._require_portal().call(self.collector.wait_ready, timeout)

    def statistics(self) -> Any:
        """The collector's :class:`~asyncrl.CollectorStatistics`, read on its loop."""
        return self._require_portal().call(self._statistics)

    async def _statistics(self) -> Any:
        return self.collector.statistics()

    def events(self, maxlen: int = 1024) -> Iterator[Any]:
        """Subscribe now; iterating blocks for each event and ends when the collector closes."""
        portal = self._require_portal()
        return self._iterate(portal, portal.call(self._subscribe, maxlen))

    def _iterate(self, portal: BlockingPortal, stream: Any) -> Iterator[Any]:
        try:
            while True:
                try:
                    yield portal.call(stream.__anext__)
                except StopAsyncIteration:
                    return
        finally:
            if self._portal_cm is not None:  # still open (else the subscription ended)
                portal.call(stream.aclose)

    async def _subscribe(self, maxlen: int) -> Any:
        return self.collector.events(maxlen)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.collector, name)
        if inspect.iscoroutinefunction(attr) or starts_at_call(attr):
            portal = self._require_portal()

            @functools.wraps(attr)
            def call(*args: Any, **kwargs: Any) -> Any:
                # Called on the loop (a started call needs its task group), then awaited.
                return portal.call(_outcome, functools.partial(attr, *args, **kwargs))

            return call
        return attr

    def _require_portal(self) -> BlockingPortal:
        if self._portal is None:
            raise RuntimeError("use BlockingCollector inside a 'with' block")
        return self._portal



class _BlockingPause:
    """What ``BlockingCollector.pause()`` returns: already paused; ``with`` resumes at exit."""

    def __init__(self, owner: BlockingCollector) -> None:
        self._owner = owner

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc_info: object) -> None:
        self._owner.resume()


async def _outcome(call: Callable[[], Awaitable[Any]]) -> Any:
    """Make the call on the event loop and wait for its result."""
    return await call()
