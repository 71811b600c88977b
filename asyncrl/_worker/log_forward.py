"""A worker process's log records, sent to its coordinator over the worker's link.

A worker process (a collector's local one, or one of an ``asyncrl worker``
host's) installs a :class:`LogForwarder` on its root logger. Its ``emit`` only
queues a small tuple (any thread: the rollout's too), bounded twice: a token
bucket (``rate`` records per second, bursts of ``burst``) and a queue of
``capacity`` records (the oldest go first); what either drops is counted and
sent along. :meth:`LogForwarder.forward` runs in the worker's event loop and
sends what queued as ``log`` messages (:class:`~asyncrl._protocol.WorkerLog`)
while a coordinator admits the worker. The coordinator re-emits them into the
trainer's ``asyncrl.worker`` logger (see :mod:`asyncrl._coordinator.worker_logs`).

Records that were never sent (the worker failed before it was admitted, or its
coordinator went away) are written by :meth:`LogForwarder.write_undelivered` to
a fallback handler (the process's stderr) when the process ends: nothing is
lost silently and nothing is printed twice. Logging is off the hot loop: a step
that logs nothing costs nothing here.

>>> forwarder = LogForwarder()
>>> logging.getLogger().addHandler(forwarder)   # doctest: +SKIP
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

import anyio

from transports import Link

from .._protocol import MAX_LOG_RECORDS, LogEntry, WorkerLog

#: How often queued records are sent (seconds): log lines arrive within this.
FLUSH_INTERVAL = 0.2


class LogForwarder(logging.Handler):
    """Queue this process's log records for its coordinator (see the module)."""

    def __init__(self, *, capacity: int = 1000, rate: float = 50.0, burst: int = 200) -> None:
        super().__init__()
        self._queue: deque[tuple[LogEntry, float]] = deque()
        self.capacity = capacity
        self.rate = rate
        self.burst = burst
        self._tokens = float(burst)
        self._refilled = time.monotonic()
        self._dropped = 0  # since the last message that said so
        self._guard = threading.Lock()  # take() runs in the event loop, emit() anywhere
        self._plain = logging.Formatter()  # for tracebacks only

    def emit(self, record: logging.LogRecord) -> None:
        try:
            entry = LogEntry(record.levelno, record.name, record.getMessage(),
                             self._traceback(record))
        except Exception:
            self.handleError(record)
            return
        with self._guard:
            if not self._take_token():
                self._dropped += 1
                return
            if len(self._queue) >= self.capacity:
                self._queue.popleft()
                self._dropped += 1
            self._queue.append((entry, record.created))

    def _traceback(self, record: logging.LogRecord) -> str:
        text = ""
        if record.exc_info:
            text = self._plain.formatException(record.exc_info)
        if record.stack_info:
            text = f"{text}\n{record.stack_info}" if text else record.stack_info
        return text

    def _take_token(self) -> bool:
        now = time.monotonic()
        self._tokens = min(float(self.burst), self._tokens + (now - self._refilled) * self.rate)
        self._refilled = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True

    def take(self) -> WorkerLog | None:
        """The next message to send (at most ``MAX_LOG_RECORDS`` records), or None."""
        with self._guard:
            if not self._queue and not self._dropped:
                return None
            count = min(len(self._queue), MAX_LOG_RECORDS)
            records = [self._queue.popleft()[0] for _ in range(count)]
            message = WorkerLog(records, self._dropped)
            self._dropped = 0
            return message

    def put_back(self, message: WorkerLog) -> None:
        """A message that could not be sent: its records go first again (if room)."""
        with self._guard:
            now = time.time()
            room = self.capacity - len(self._queue)
            kept = message.records[-room:] if room > 0 else []
            self._queue.extendleft((entry, now) for entry in reversed(kept))
            self._dropped += message.dropped + len(message.records) - len(kept)

    async def forward(self, link: Link, admitted: Callable[[], bool]) -> None:
        """Send what queued every ``FLUSH_INTERVAL`` s while ``admitted()``; forever."""
        while True:
            await anyio.sleep(FLUSH_INTERVAL)
            while admitted():
                message = self.take()
                if message is None:
                    break
                try:
                    await link.send(message.to_body(), kind=WorkerLog.KIND)
                except BaseException:
                    self.put_back(message)  # cancelled, or the link went down: at exit
                    raise

    def write_undelivered(self, handler: logging.Handler) -> int:
        """Hand every record never sent to ``handler`` (e.g. stderr); how many there were."""
        with self._guard:
            pending, self._queue = list(self._queue), deque()
            dropped, self._dropped = self._dropped, 0
        for entry, created in pending:
            record = logging.makeLogRecord({
                "name": entry.logger, "levelno": entry.level,
                "levelname": logging.getLevelName(entry.level), "msg": entry.message,
                "created": created, "exc_text": entry.traceback or None})
            handler.handle(record)
        if dropped:
            handler.handle(logging.makeLogRecord({
                "name": "asyncrl.worker", "levelno": logging.WARNING, "levelname": "WARNING",
                "msg": f"{dropped} log records of this worker were dropped (more than "
                       f"{self.rate:g}/s, or {self.capacity} waiting)"}))
        return len(pending)


def forward_logs(handler: logging.Handler | None) -> tuple[LogForwarder, logging.Handler | None]:
    """Route this process's root logger to a new :class:`LogForwarder`.

    ``handler`` (the process's stderr handler), if given, is taken off the root
    logger: it becomes the fallback for what was never sent (and is returned).
    """
    root = logging.getLogger()
    forwarder = LogForwarder()
    if handler is not None:
        root.removeHandler(handler)
    root.addHandler(forwarder)
    return forwarder, handler


__all__ = ["FLUSH_INTERVAL", "LogForwarder", "forward_logs"]
