"""A blocking facade over any async collector, for training loops that are not async."""

from __future__ import annotations

import atexit
import functools
import inspect
import logging
import threading
import warnings
import weakref
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

from anyio.from_thread import BlockingPortal, start_blocking_portal
from tensordict import TensorDictBase

from .._spawn.threads import TrainerThreads
from ._started import starts_at_call

log = logging.getLogger("asyncrl.collectors")


class BlockingCollector:
    """Use an async collector from plain code, through an anyio blocking portal.

    The collector runs on an event loop in a background thread; iteration and
    every coroutine method become blocking calls. As TorchRL's collectors, it
    needs no ``with``: it starts on first use (iteration,
    ``update_policy_weights_()``, ``state_dict()``, any collector call) and
    closes on ``shutdown()``, at interpreter exit, or, with a
    ``ResourceWarning``, when garbage-collected while open. ``with`` closes it
    at the end of the block. The torch threads cap the collector puts on its
    trainer (``num_threads``: the cores its local workers do not use) is
    applied to the thread that starts it, the one that trains, and undone at
    the close.

    >>> from asyncrl import BlockingCollector, MultiSyncCollector     # doctest: +SKIP
    >>> c = BlockingCollector(MultiSyncCollector("CartPole-v1", num_workers=2,
    ...                                          frames_per_batch=200, total_frames=1000))
    >>> for batch in c:
    ...     c.update_policy_weights_()
    >>> c.shutdown()

    Parameters
    ----------
    collector
        Any asyncrl collector, not entered yet (the facade enters and closes it).
    backend
        The anyio backend of the event loop thread: ``"asyncio"`` or ``"trio"``.
    """

    def __init__(self, collector: Any, *, backend: str = "asyncio") -> None:
        self.collector = collector
        self.backend = backend
        self._session: _Session | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None
        self._closed = False

    def __enter__(self) -> BlockingCollector:
        self._require_portal()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close(*exc_info)

    def close(self, *exc_info: Any) -> None:
        """Close the collector and stop the event loop thread. Idempotent.

        The event loop thread stops whatever closing the collector raised: a
        surviving loop thread would keep the process alive after the error.
        """
        self._closed = True
        session, self._session = self._session, None
        if self._finalizer is not None:
            self._finalizer.detach()
        if session is not None:
            session.close(*exc_info)

    def shutdown(self, timeout: float | None = None, close_env: bool = True,
                 raise_on_error: bool = True) -> None:
        """TorchRL's name for :meth:`close` (same arguments as the collector's ``shutdown``).

        A collector never used has nothing running: it is only marked closed.
        """
        try:
            if self._session is not None and self._session.open:
                self._session.portal.call(_outcome, functools.partial(
                    self.collector.shutdown, timeout, close_env, raise_on_error))
            elif self._session is None and not self._closed:
                # never started: the collector checks the arguments and marks itself closed
                self.collector.shutdown(timeout, close_env, raise_on_error)
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
            if self._session is not None and self._session.open:  # else the subscription ended
                portal.call(stream.aclose)

    async def _subscribe(self, maxlen: int) -> Any:
        return self.collector.events(maxlen)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in {"collector", "_session", "_closed"}:
            raise AttributeError(name)  # not set yet (a failed __init__): no recursion
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
        """The running session's portal; the first use starts it (as TorchRL's collectors)."""
        if self._session is None:
            if self._closed:
                raise RuntimeError(
                    f"this BlockingCollector was shut down: its {type(self.collector).__name__} "
                    "and workers are closed; create a new BlockingCollector(...) to collect again")
            self._session = _Session(self.collector, self.backend)
            # A finalizer, not __del__: it holds the session, never this object, so a
            # collector dropped while open is still collected, then closed (with a warning).
            self._finalizer = weakref.finalize(self, _collected_while_open, self._session,
                                               type(self.collector).__name__)
            self._finalizer.atexit = False  # exit closes every session quietly (_close_at_exit)
        return self._session.portal



class _Session:
    """An open BlockingCollector's resources: the loop thread, the entered collector, the cap.

    Kept apart from the facade so that the facade's finalizer and the exit hook
    can close it without holding the facade alive.
    """

    def __init__(self, collector: Any, backend: str) -> None:
        self.portal_cm: AbstractContextManager[BlockingPortal] = start_blocking_portal(backend)
        self.portal = self.portal_cm.__enter__()
        self.loop_thread = self.portal.call(threading.get_ident)
        self.starter_thread = threading.get_ident()
        self.threads: TrainerThreads | None = None
        try:
            self.collector_cm: AbstractContextManager[Any] | None = \
                self.portal.wrap_async_context_manager(collector)
            self.collector_cm.__enter__()
        except BaseException:
            self.portal_cm.__exit__(None, None, None)
            raise
        self.open = True
        _OPEN.add(self)
        # atexit runs its hooks last registered first: (re)registered now, the close comes
        # before the hooks the collector's start registered (multiprocessing's reaps children).
        atexit.unregister(_close_at_exit)
        atexit.register(_close_at_exit)
        # The collector capped torch's threads on the event loop's thread; torch keeps
        # the count per thread, so the trainer's (this one) needs its own cap.
        cap_args = getattr(collector, "threads_cap_args", None)
        if cap_args is not None:
            self.threads = TrainerThreads.cap(*cap_args)

    def close(self, *exc_info: Any) -> None:
        """Close the collector, then stop the loop thread whatever that raised. Idempotent."""
        self.open = False
        _OPEN.discard(self)
        exc_info = exc_info or (None, None, None)
        try:
            if self.collector_cm is not None:
                cm, self.collector_cm = self.collector_cm, None
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
            self.portal_cm.__exit__(None, None, None)  # a second exit is a no-op
            # torch's thread count is the starter thread's: another thread (the garbage
            # collector's, the exit hook's) would set its own instead.
            if self.threads is not None and threading.get_ident() == self.starter_thread:
                threads, self.threads = self.threads, None
                threads.restore()


#: Sessions not closed yet, closed at interpreter exit (strong references: a session
#: never refers back to its facade, so it does not keep one alive).
_OPEN: set[_Session] = set()


def _collected_while_open(session: _Session, name: str) -> None:
    """A facade dropped while open: warn, then close its session (workers included)."""
    if not session.open:
        return
    warnings.warn(f"BlockingCollector({name}) was garbage-collected while open; its workers "
                  "are closed now. Call shutdown() when done, or use 'with BlockingCollector("
                  "...) as collector:'", ResourceWarning, stacklevel=1)
    if threading.get_ident() == session.loop_thread:
        # Collected on the collector's own loop thread, which cannot wait for itself.
        threading.Thread(target=session.close, name="asyncrl-blocking-close").start()
    else:
        session.close()


def _close_at_exit() -> None:
    """Close what a script left open, before multiprocessing's own exit hook reaps children.

    The portal's loop thread is a daemon: without this the loop would just stop
    at exit, and the workers would learn of it only from their heartbeats.
    """
    for session in list(_OPEN):
        try:
            session.close()
        except Exception:
            log.exception("closing a BlockingCollector left open at exit failed")


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
