"""Workers' log records, re-emitted into the trainer's ``asyncrl.worker`` logger.

Each record an admitted worker (or remote env host of an
``AsyncBatchedCollector``) sent (a ``log`` message, see
:mod:`asyncrl._worker.log_forward`) becomes a :class:`logging.LogRecord` of
the logger ``asyncrl.worker`` in the trainer, at the worker's level, with its
message and traceback, and these attributes for a structured (JSON) formatter
or a filter:

* ``asyncrl_worker``: the worker's index (its slot);
* ``asyncrl_host``, ``asyncrl_pid``: its host name and process id;
* ``asyncrl_name``: its peer name (as ``statistics().workers[].name``);
* ``asyncrl_logger``: the name of the logger it logged with in the worker.

``record.process`` is the worker's pid too (``%(process)d`` names the worker),
``record.processName`` is ``"asyncrl-worker-<index>"``.

Input is hostile: only live, admitted workers' records count (a stranger's are
dropped before they are read), every field was bounded and made printable by
:class:`~asyncrl._protocol.WorkerLog` (control, format and line-separator
characters escaped, the message's continuation lines and every traceback line
indented: no record starts a line that reads like the trainer's own; see
:mod:`transports._printable`), and each worker has a token bucket of ``rate``
records per second (bursts of ``burst``): what is over it is dropped, counted,
and said in one rate-limited WARNING. The worker's name and host are printed
through :func:`transports.printable` here too: not every source read them from a
typed hello (a remote env host's hello is its collector's own).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Protocol

from transports import RateLimitedLog, printable

from .._protocol import WorkerLog

LOGGER = "asyncrl.worker"


class LogSource(Protocol):
    """Who sent the records: a coordinator's worker (``WorkerInfo``) or a remote env host."""

    @property
    def peer(self) -> bytes: ...
    @property
    def index(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def host(self) -> str: ...
    @property
    def pid(self) -> int: ...


class _Bucket:
    __slots__ = ("refilled", "tokens")

    def __init__(self, burst: float) -> None:
        self.tokens = burst
        self.refilled = time.monotonic()


class WorkerLogs:
    """Re-emit admitted workers' records (see the module); one per coordinator."""

    def __init__(self, *, rate: float = 100.0, burst: int = 500,
                 logger: logging.Logger | None = None) -> None:
        self.logger = logger or logging.getLogger(LOGGER)
        self.rate = rate
        self.burst = burst
        self._buckets: dict[bytes, _Bucket] = {}
        self._limited = RateLimitedLog(logging.getLogger("asyncrl.coordinator"), interval=10.0)
        #: Records dropped here (over the rate) and by the workers themselves, in all.
        self.dropped = 0

    def emit(self, worker: LogSource, message: WorkerLog) -> None:
        """Re-emit ``message``'s records as ``worker``'s (an admitted, live worker)."""
        bucket = self._buckets.get(worker.peer)
        if bucket is None:
            bucket = self._buckets[worker.peer] = _Bucket(self.burst)
        now = time.monotonic()
        bucket.tokens = min(float(self.burst), bucket.tokens + (now - bucket.refilled) * self.rate)
        bucket.refilled = now
        over = 0
        for entry in message.records:
            if bucket.tokens < 1:
                over += 1
                continue
            bucket.tokens -= 1
            if self.logger.isEnabledFor(entry.level):
                self.logger.handle(self._record(worker, entry.level, entry.logger,
                                                entry.message, entry.traceback))
        if over or message.dropped:
            self.dropped += over + message.dropped
            self._limited.warning(
                f"log-dropped-{worker.index}", "worker %d (%s, pid %d on %s): %d log records "
                "dropped (%d over %g/s here, %d by the worker itself)", worker.index,
                _shown(worker.name), worker.pid, _shown(worker.host), over + message.dropped,
                over, self.rate, message.dropped)

    def forget(self, peer: bytes) -> None:
        """``peer`` is gone: its bucket goes too (the dict stays as large as the live set)."""
        self._buckets.pop(peer, None)

    def _record(self, worker: LogSource, level: int, logger: str, text: str,
                traceback: str) -> logging.LogRecord:
        record = self.logger.makeRecord(self.logger.name, level, "(worker)", 0, text, (), None)
        record.exc_text = traceback or None  # Formatter.format appends it as a traceback
        fields: dict[str, Any] = {
            "asyncrl_worker": worker.index, "asyncrl_host": _shown(worker.host),
            "asyncrl_pid": worker.pid, "asyncrl_name": _shown(worker.name),
            "asyncrl_logger": logger,
            "process": worker.pid, "processName": f"asyncrl-worker-{worker.index}",
        }
        record.__dict__.update(fields)
        return record


def _shown(text: str) -> str:
    """A source's name or host as printed (already printable when a typed hello said it)."""
    return printable(text, limit=255)


__all__ = ["LOGGER", "LogSource", "WorkerLogs"]
