"""Warnings about hostile or broken input, at most one line per reason per interval."""

from __future__ import annotations

import logging
import time
from typing import Any

#: Reasons remembered at once; a flood of distinct reasons cannot grow the table.
MAX_REASONS = 256


class RateLimitedLog:
    """Log at most one line per ``reason`` every ``interval`` seconds.

    Input from the network is hostile: a peer that sends 10,000 bad messages
    must not write 10,000 log lines. The first occurrence of a reason is logged
    at once; later ones within ``interval`` are counted, and the next line
    logged for that reason says how many were suppressed. Counters that matter
    (``Hub.statistics().bad_messages``) are kept elsewhere and stay exact.

    >>> limited = RateLimitedLog(logging.getLogger("x"), interval=5.0)
    >>> limited.warning("malformed", "dropped a malformed message from %s", "peer")
    """

    def __init__(self, logger: logging.Logger, interval: float = 5.0) -> None:
        self.logger = logger
        self.interval = interval
        self._next: dict[str, float] = {}  # reason -> earliest time of its next line
        self._suppressed: dict[str, int] = {}

    def warning(self, reason: str, msg: str, *args: Any) -> bool:
        """Log ``msg % args`` unless ``reason`` was logged recently; True if logged."""
        return self.log(logging.WARNING, reason, msg, *args)

    def log(self, level: int, reason: str, msg: str, *args: Any) -> bool:
        now = time.monotonic()
        if now < self._next.get(reason, 0.0):
            self._suppressed[reason] = self._suppressed.get(reason, 0) + 1
            return False
        if reason not in self._next and len(self._next) >= MAX_REASONS:
            self._forget_expired(now)
        self._next[reason] = now + self.interval
        suppressed = self._suppressed.pop(reason, 0)
        if suppressed:
            msg += f" ({suppressed} more like this in the last {self.interval:g} s not logged)"
        self.logger.log(level, msg, *args)
        return True

    def _forget_expired(self, now: float) -> None:
        expired = [r for r, t in self._next.items() if t <= now and r not in self._suppressed]
        for reason in expired or list(self._next)[: MAX_REASONS // 2]:
            self._next.pop(reason, None)
            self._suppressed.pop(reason, None)
