"""TorchRL's collector calls, started when called: ``await`` only waits for the outcome.

A ported TorchRL script calls ``collector.update_policy_weights_()`` or
``collector.set_seed(0)`` without ``await``. Were these coroutine methods, such
a call would do nothing at all, and Python's "coroutine was never awaited"
warning would be the only sign: every batch would stay at policy version 0.
So they are plain methods that start the work on the collector's task group
at once and return a :class:`Started`; ``await`` it for the result (or the
error). Started calls run one at a time, in call order; the collector's next
batch waits for the ones that must come before it (:data:`Kind`), and a call
that failed while nobody awaited it raises its error from the next batch, so
no failure is silent either.

>>> import anyio
>>> from asyncrl import Collector
>>> async def main():
...     async with Collector("CartPole-v1", frames_per_batch=10, total_frames=20) as c:
...         c.set_seed(0)               # seeded now; the next batch waits for it
...         return await c.set_seed(0)  # awaited: the next free seed
>>> anyio.run(main)
1
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable, Generator
from typing import Any, Concatenate, Generic, Literal, NoReturn, ParamSpec, Protocol, TypeVar

import anyio

from .._errors import CollectorError, CollectorStopped, as_asyncrl_error

log = logging.getLogger("asyncrl.collectors")

T = TypeVar("T")
P = ParamSpec("P")

#: ``"barrier"``: the next batch waits for it (seeds, resets, loaded state dicts);
#: ``"update"``: a weight update, a barrier where the collector's ``sync_updates`` is
#: True (sync and in-process collectors: the next batch is all new weights);
#: ``"query"``: nothing waits for it (``state_dict``, ``getattr_*``).
Kind = Literal["barrier", "update", "query"]


class Started(Generic[T]):
    """A collector call that began when it was made; ``await`` it for its result.

    Using it as the result (``if``, indexing, iterating, arithmetic) raises a
    ``TypeError`` naming ``await collector.NAME(...)``.

    >>> Started.finished("shutdown", None)
    <Started shutdown(): done>
    """

    def __init__(self, name: str, *, before_next_batch: bool, kind: Kind = "barrier") -> None:
        self.name = name
        self.kind = kind
        self.before_next_batch = before_next_batch
        self._done: anyio.Event | None = None  # made on the loop by _run's starter
        self._finished = False
        self._result: Any = None
        self._error: BaseException | None = None
        self._observed = False  # awaited, or its error raised by the next batch
        self._scope: anyio.CancelScope | None = None
        self._cancelled = False  # the collector closed before it began

    @classmethod
    def finished(cls, name: str, result: T) -> Started[T]:
        """A call with nothing left to do (``shutdown()`` of a closed collector)."""
        started: Started[T] = cls(name, before_next_batch=False)
        started._finished, started._result = True, result
        return started

    @property
    def done(self) -> bool:
        """True once the call finished (with a result or an error)."""
        return self._finished

    def __repr__(self) -> str:
        state = "done" if self._finished else "running"
        return f"<Started {self.name}(): {state}>"

    def __await__(self) -> Generator[Any, None, T]:
        self._observed = True
        return self._wait().__await__()

    async def _wait(self) -> T:
        if not self._finished:
            assert self._done is not None
            await self._done.wait()
        if self._error is not None:
            raise self._error
        result: T = self._result
        return result

    def begin(self, task_group: Any, work: Callable[[], Awaitable[T]],
              after: Started[Any] | None, *, cancellable: bool) -> None:
        """Run ``work()`` on ``task_group`` once ``after`` (if any) is done."""
        self._done = anyio.Event()
        task_group.start_soon(self._run, work, after, cancellable, name=f"collector.{self.name}")

    async def _run(self, work: Callable[[], Awaitable[T]], after: Started[Any] | None,
                   cancellable: bool) -> None:
        try:
            with anyio.CancelScope(shield=not cancellable) as self._scope:
                if self._cancelled and cancellable:
                    self._scope.cancel()
                if after is not None:
                    await after.wait_done()
                self._result = await work()
                self._finished = True
        except Exception as exc:
            self._error = as_asyncrl_error(exc)  # what the user catches: an AsyncRLError
        finally:
            if not self._finished and self._error is None:  # cancelled: the collector closed
                self._error = CollectorStopped(
                    f"{self.name}() did not finish: the collector was closed first")
            self._finished = True
            assert self._done is not None
            self._done.set()

    async def wait_done(self) -> None:
        """Return once the call finished; its error, if any, is not raised here."""
        if not self._finished:
            assert self._done is not None
            await self._done.wait()

    def take_unseen_error(self) -> BaseException | None:
        """The error of a finished call nobody awaited (a query's excepted: nobody wanted
        its value); from then on it counts as seen."""
        if not self._finished or self._error is None or self._observed or self.kind == "query":
            return None
        self._observed = True
        return self._error

    def cancel(self) -> None:
        """The collector is closing: end the call (one not begun yet begins cancelled);
        a shielded one (``shutdown()``) goes on."""
        self._cancelled = True
        if self._scope is not None and not self._scope.shield:
            self._scope.cancel()

    def _used_as_result(self, *_: Any) -> NoReturn:
        raise TypeError(
            f"collector.{self.name}(...) returns a Started call, not its result: the call "
            f"already started it; write 'await collector.{self.name}(...)' for the result "
            "(from plain code, BlockingCollector returns results directly)")

    __bool__ = __iter__ = __len__ = __getitem__ = __int__ = __index__ = __float__ = \
        __add__ = __radd__ = __contains__ = _used_as_result


class StartedCalls:
    """A collector's started calls: run in call order; the next batch settles them."""

    def __init__(self) -> None:
        self._pending: list[Started[Any]] = []
        self._last: Started[Any] | None = None

    def start(self, task_group: Any, name: str, work: Callable[[], Awaitable[T]], *,
              before_next_batch: bool, kind: Kind = "barrier",
              in_order: bool = True) -> Started[T]:
        """Start ``work()`` now (after the calls started before it, if ``in_order``)."""
        started: Started[T] = Started(name, before_next_batch=before_next_batch, kind=kind)
        after = self._last if in_order else None
        if in_order:
            self._last = started
        self._pending.append(started)
        # in_order=False is shutdown(): it must run even while the collector closes.
        started.begin(task_group, work, after, cancellable=in_order)
        return started

    async def settle(self) -> None:
        """Wait for the calls the next batch comes after; raise an unawaited call's error."""
        for started in list(self._pending):
            if started.before_next_batch:
                await started.wait_done()
        unseen = [error for started in self._pending
                  if (error := started.take_unseen_error()) is not None]
        self._pending = [s for s in self._pending if not s.done]
        if unseen:
            raise unseen[0]

    def close(self) -> None:
        """Cancel what is still running (the collector is closing); log unseen errors."""
        for started in self._pending:
            started.cancel()
        for started in self._pending:
            error = started.take_unseen_error()
            if error is not None:
                log.error("collector.%s() failed and was never awaited: %r", started.name, error)
        self._pending = [s for s in self._pending if not s.done]


class _Starter(Protocol):
    sync_updates: bool

    def _start_call(self, name: str, work: Callable[[], Awaitable[T]], *,
                    before_next_batch: bool, kind: Kind = "barrier",
                    in_order: bool = True) -> Started[T]: ...


S = TypeVar("S", bound=_Starter)


def started_at_call(kind: Kind) -> Callable[[Callable[Concatenate[S, P], Awaitable[T]]],
                                            Callable[Concatenate[S, P], Started[T]]]:
    """Make an ``async def`` collector method start its work when called (see module doc)."""
    def wrap(method: Callable[Concatenate[S, P], Awaitable[T]]
             ) -> Callable[Concatenate[S, P], Started[T]]:
        def call(self: S, /, *args: P.args, **kwargs: P.kwargs) -> Started[T]:
            before = kind == "barrier" or (kind == "update" and self.sync_updates)
            return self._start_call(method.__name__,
                                    functools.partial(method, self, *args, **kwargs),
                                    before_next_batch=before, kind=kind)
        functools.update_wrapper(call, method)  # name, docstring, signature (help, api.md)
        call.__asyncrl_started__ = True  # type: ignore[attr-defined]  # BlockingCollector
        return call
    return wrap


def starts_at_call(method: Any) -> bool:
    """True for a method made by :func:`started_at_call` (BlockingCollector awaits it)."""
    return bool(getattr(method, "__asyncrl_started__", False))


def not_open(collector: Any, name: str) -> CollectorError:
    """The error of a started call made on a collector that is not open (or closed)."""
    cls = type(collector).__name__
    state = "closed" if getattr(collector, "_closed", False) else "not open"
    return CollectorError(f"{cls}.{name}(): the collector is {state}; call it inside "
                          f"'async with {cls}(...) as collector:'")


__all__ = ["Kind", "Started", "StartedCalls", "not_open", "started_at_call", "starts_at_call"]
