"""TorchRL habits on an async collector: the methods a ported script calls, or a clear way out.

TorchRL's collectors are plain iterables with ``update_policy_weights_()`` and
``shutdown()``. asyncrl's are async resources: iterate with ``async for``
inside ``async with``, or wrap one in :class:`~asyncrl.BlockingCollector` for a
plain ``for`` loop. Here the TorchRL names either work or fail with a
``TypeError`` that says what to write instead. The ones that act
(``update_policy_weights_``, ``shutdown``, ``set_seed``, ``reset``...) start
when called, awaited or not (:mod:`asyncrl.collectors._started`): a call
without ``await`` is never a silent no-op.

>>> from asyncrl import Collector
>>> c = Collector("CartPole-v1", frames_per_batch=10, total_frames=20)
>>> try:
...     for batch in c:
...         pass
... except TypeError as exc:
...     print(str(exc)[:55])
Collector is an async iterator: use 'async for batch in
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from .._errors import NoLengthError
from ._started import Kind, Started

T = TypeVar("T")

log = logging.getLogger("asyncrl.collectors")

__all__ = ["NoLengthError", "TorchRLHabits"]


class TorchRLHabits:
    """TorchRL's collector method names on an async collector (a mixin of ``BaseCollector``)."""

    def _plain_iteration(self) -> NoReturn:
        name = type(self).__name__
        raise TypeError(
            f"{name} is an async iterator: use 'async for batch in collector' inside "
            f"'async with {name}(...) as collector:', or, from code that is not async, "
            f"'with BlockingCollector({name}(...)) as collector: for batch in collector: ...' "
            "(from asyncrl import BlockingCollector)")

    def __iter__(self) -> NoReturn:
        self._plain_iteration()

    def __next__(self) -> NoReturn:
        self._plain_iteration()

    def __len__(self) -> int:
        """TorchRL's: the number of batches, ``ceil(total_frames / frames_per_batch)``.

        An endless collector (``total_frames=-1``) has none: :class:`NoLengthError`.
        """
        if self.total_frames > 0:
            return -(self.total_frames // -self.frames_per_batch)
        name = type(self).__name__
        raise NoLengthError(
            f"len({name}) is its number of batches, and this one is endless "
            f"(total_frames=-1): pass total_frames=N to {name}(...) for "
            f"len() == ceil(N / frames_per_batch), or count the batches yourself")

    def __bool__(self) -> bool:
        return True  # an object, not an empty container (else bool() would call __len__)

    def iterator(self) -> NoReturn:
        """TorchRL's ``iterator()``: refused, naming ``async for`` and ``BlockingCollector``."""
        self._plain_iteration()

    if TYPE_CHECKING:  # the collector's own
        _task_group: Any
        _closed: bool
        total_frames: int
        frames_per_batch: int

        def update_policy_weights(self, policy_or_weights: Any = None, *,
                                  weights: Any = None, policy: Any = None,
                                  worker_ids: Any = None, model_id: str | None = None,
                                  weights_dict: dict[str, Any] | None = None
                                  ) -> Started[None]: ...

        def _start_call(self, name: str, work: Callable[[], Awaitable[T]], *,
                        before_next_batch: bool, kind: Kind = "barrier",
                        in_order: bool = True) -> Started[T]: ...

        async def aclose(self) -> None: ...

    def update_policy_weights_(self, policy_or_weights: Any = None,
                               **kwargs: Any) -> Started[None]:
        """TorchRL's name for :meth:`update_policy_weights`: the send starts at the call.

        ``await`` it to wait for the workers' acks (and their errors); without
        ``await`` the update still happens: in sync mode and in process the next
        batch is collected with it, in async mode batches carry its version as
        soon as each worker applied it.
        """
        return self.update_policy_weights(policy_or_weights, **kwargs)

    def shutdown(self, timeout: float | None = None, close_env: bool = True,
                 raise_on_error: bool = True) -> Started[None]:
        """TorchRL's name for :meth:`aclose`: stop the workers, release all (starts at the call).

        ``await`` it to wait for the close; without ``await`` the close still
        happens, and iteration ends at the next batch. ``timeout``: TorchRL's
        bound on closing the workers' pipes; asyncrl's close is always bounded,
        so only None is taken. ``close_env=False`` is refused (workers own their
        envs; they are closed with them). ``raise_on_error=False`` logs an error
        of the close instead of raising it.
        """
        if timeout is not None:
            raise ValueError(f"shutdown(timeout={timeout!r}): asyncrl's close is always "
                             "bounded (workers that do not stop are killed); call shutdown() "
                             "or aclose() without a timeout")
        if not close_env:
            raise ValueError("shutdown(close_env=False) is not supported: each worker owns "
                             "its envs and closes them when it stops; to keep collecting, "
                             "keep the collector open (pause() stops collection for a while)")
        if self._closed:
            return Started.finished("shutdown", None)
        if self._task_group is None:  # never opened: nothing runs, nothing to release
            self._closed = True
            return Started.finished("shutdown", None)

        async def close() -> None:
            try:
                await self.aclose()
            except Exception:
                if raise_on_error:
                    raise
                log.exception("error while shutting down the collector (raise_on_error=False)")

        # Not behind other started calls: a close ends them (they raise CollectorStopped).
        return self._start_call("shutdown", close, before_next_batch=True, in_order=False)

    def async_shutdown(self, timeout: float | None = None,
                       close_env: bool = True) -> Started[None]:
        """TorchRL's other name for :meth:`shutdown`."""
        return self.shutdown(timeout, close_env)
