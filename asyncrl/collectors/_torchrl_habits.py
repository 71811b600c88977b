"""TorchRL habits on an async collector: the methods a ported script calls, or a clear way out.

TorchRL's collectors are plain iterables with ``update_policy_weights_()`` and
``shutdown()``. asyncrl's are async resources: iterate with ``async for``
inside ``async with``, or wrap one in :class:`~asyncrl.BlockingCollector` for a
plain ``for`` loop. Here the TorchRL names either work (``shutdown``,
``update_policy_weights_``, awaited) or fail with a ``TypeError`` that says
what to write instead.

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
from typing import TYPE_CHECKING, Any, NoReturn

log = logging.getLogger("asyncrl.collectors")

__all__ = ["TorchRLHabits"]


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

    def iterator(self) -> NoReturn:
        """TorchRL's ``iterator()``: refused, naming ``async for`` and ``BlockingCollector``."""
        self._plain_iteration()

    if TYPE_CHECKING:  # the collector's own
        async def update_policy_weights(self, policy_or_weights: Any = None, *,
                                        weights: Any = None, policy: Any = None,
                                        worker_ids: Any = None, model_id: str | None = None,
                                        weights_dict: dict[str, Any] | None = None
                                        ) -> None: ...

        async def aclose(self) -> None: ...

    async def update_policy_weights_(self, policy_or_weights: Any = None,
                                     **kwargs: Any) -> None:
        """TorchRL's name for :meth:`update_policy_weights` (awaited here)."""
        await self.update_policy_weights(policy_or_weights, **kwargs)

    async def shutdown(self, timeout: float | None = None, close_env: bool = True,
                       raise_on_error: bool = True) -> None:
        """TorchRL's name for :meth:`aclose` (awaited here): stop the workers, release all.

        ``timeout``: TorchRL's bound on closing the workers' pipes; asyncrl's
        close is always bounded, so only None is taken. ``close_env=False`` is
        refused (workers own their envs; they are closed with them).
        ``raise_on_error=False`` logs an error of the close instead of raising it.
        """
        if timeout is not None:
            raise ValueError(f"shutdown(timeout={timeout!r}): asyncrl's close is always "
                             "bounded (workers that do not stop are killed); call shutdown() "
                             "or aclose() without a timeout")
        if not close_env:
            raise ValueError("shutdown(close_env=False) is not supported: each worker owns "
                             "its envs and closes them when it stops; to keep collecting, "
                             "keep the collector open (pause() stops collection for a while)")
        try:
            await self.aclose()
        except Exception:
            if raise_on_error:
                raise
            log.exception("error while shutting down the collector (raise_on_error=False)")

    async def async_shutdown(self, timeout: float | None = None) -> None:
        """TorchRL's other name for :meth:`shutdown`."""
        await self.shutdown(timeout)
