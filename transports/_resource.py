"""Async resources that own a task group for their background tasks."""

from __future__ import annotations

from typing import Any, Self

import anyio


async def exit_task_group(task_group: Any, exc_info: tuple[Any, Any, Any]) -> bool | None:
    """Leave a task group entered in ``__aenter__``, without wrapping the body's own error.

    anyio wraps whatever leaves a task group in an ``ExceptionGroup``; when the
    only error is the one raised by the ``async with`` body, the user should
    get that exception itself.
    """
    body_error = exc_info[1]
    try:
        return bool(await task_group.__aexit__(*exc_info))
    except BaseExceptionGroup as group:
        if body_error is not None and len(group.exceptions) == 1 \
                and group.exceptions[0] is body_error:
            raise body_error from body_error.__cause__
        raise


class TaskGroupResource:
    """``async with`` enters a task group, then ``_open()``; leaving calls ``aclose()``.

    Subclasses start their background tasks in ``self._task_group`` from
    ``_open`` and stop them in an idempotent ``aclose``. If ``_open`` fails,
    ``aclose`` runs before the error propagates; an error raised by the
    ``async with`` body comes out as itself, not wrapped in an ExceptionGroup.

    >>> class Ticker(TaskGroupResource):
    ...     async def _open(self):
    ...         self._task_group.start_soon(anyio.sleep_forever)
    >>> async with Ticker() as ticker:       # doctest: +SKIP
    ...     ...                               # leaving: aclose() cancels the task group
    """

    _task_group: Any = None

    async def _open(self) -> None:
        raise NotImplementedError

    async def aclose(self) -> None:
        """Close the resource: the contract every asyncrl and transports resource keeps.

        * **Idempotent**: a second call (or one racing the first) returns once the
          resource is closed, and does nothing more.
        * **Bounded and cancellation-safe**: the teardown runs in a shielded scope
          with its own deadline, so a caller cancelled mid-close (Ctrl-C, a
          trainer's cancel scope) still leaves no task, socket or process behind.
        * **Afterwards**, a channel's operations raise :class:`ClosedResourceError`
          ("you closed it"), never :class:`PeerLostError` ("the peer broke it"); a
          collector's iteration ends and entering it again is refused (single use).
        """
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        self._task_group = anyio.create_task_group()
        await self._task_group.__aenter__()
        try:
            await self._open()
        except BaseException as exc:
            await self.aclose()
            # The error of _open itself, not an ExceptionGroup around it.
            await exit_task_group(self._task_group, (type(exc), exc, exc.__traceback__))
            raise
        return self

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        await self.aclose()
        return await exit_task_group(self._task_group, exc_info)
