"""A collecting worker tells the coordinator that its env steps (issue #35, item 2).

The coordinator's stall watchdog (``sample_timeout``) must tell a slow worker
from a hung one: a batch of slow steps may take longer than the timeout while
every step returns. The rollout thread only increments an int per step
(:attr:`~asyncrl._rollout.loop.Rollout.steps_done`); this task reads it every
``interval`` seconds while a batch is owed and sends a small
:class:`~asyncrl._protocol.Progress` when it moved: nothing per step, no message
while idle or stuck.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio

from transports import Link

from .._protocol import Progress

__all__ = ["ProgressReport"]

#: The longest gap between two reports of a worker that steps.
MAX_INTERVAL = 1.0


class ProgressReport:
    """Sends ``Progress(request, steps)`` while ``collecting()`` says a batch is underway.

    ``collecting()`` returns ``(request, steps done)`` during a batch, None between.

    >>> report = ProgressReport(link, worker.collecting)   # doctest: +SKIP
    >>> tg.start_soon(report.run)                          # doctest: +SKIP
    """

    def __init__(self, link: Link, collecting: Callable[[], tuple[int, int] | None]) -> None:
        self.link = link
        self.collecting = collecting
        #: Every heartbeat, at most a second apart: the watchdog checks as often.
        self.interval = min(MAX_INTERVAL, link.heartbeat_interval)
        self._sent = -1  # the step count last reported

    async def run(self) -> None:
        while True:
            await anyio.sleep(self.interval)
            now = self.collecting()
            if now is None or now[1] == self._sent:
                continue  # idle, or not one step since the last report: nothing to say
            self._sent = now[1]
            await self.link.send(Progress(*now).to_body(), kind=Progress.KIND)
