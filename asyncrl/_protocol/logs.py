"""Forwarded log records: a worker's ``log`` message and the records it carries."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Self

from transports import ProtocolError, printable, printable_block, printable_lines

from .fields import optional_int, required

#: Most records one ``log`` message may carry; the worker sends more as more messages.
MAX_LOG_RECORDS = 64
#: Longest message (and logger name, traceback) text a forwarded record keeps.
MAX_LOG_MESSAGE = 4096
MAX_LOG_LOGGER = 200
MAX_LOG_TRACEBACK = 16384


@dataclass(frozen=True, slots=True)
class LogEntry:
    """One worker log record, as it travels: level, logger name, message, traceback.

    Read from the wire, its texts are printable (see :mod:`transports._printable`):
    the logger name on one line, the message's continuation lines indented, every
    line of the traceback indented (it is printed under the message), so that no
    record can start a line that reads like one of the trainer's.
    """

    level: int
    logger: str
    message: str
    traceback: str = ""

    @classmethod
    def from_wire(cls, item: Any) -> Self:
        if not isinstance(item, list) or len(item) != 4:
            raise ProtocolError("log message records must be [level, logger, message, "
                                f"traceback] lists, got {type(item).__name__}")
        level, logger, message, traceback = item
        if type(level) is not int or not 0 <= level <= 100:
            raise ProtocolError(f"log record level must be an int in 0..100, got {level!r}"[:200])
        if not all(isinstance(v, str) for v in (logger, message, traceback)):
            raise ProtocolError("log record logger, message and traceback must be strings")
        return cls(level, printable(logger, limit=MAX_LOG_LOGGER),
                   printable_lines(message, limit=MAX_LOG_MESSAGE),
                   printable_block(traceback, limit=MAX_LOG_TRACEBACK))

    def to_wire(self) -> list[Any]:
        return [self.level, self.logger, self.message, self.traceback]


@dataclass(slots=True)
class WorkerLog:
    """Worker -> coordinator: log records of the worker's process (see
    :mod:`asyncrl._worker.log_forward`), and how many it dropped (rate, queue)."""

    KIND: ClassVar[str] = "log"
    records: list[LogEntry]
    dropped: int = 0

    def to_body(self) -> dict[str, Any]:
        return {"records": [r.to_wire() for r in self.records], "dropped": self.dropped}

    @classmethod
    def from_body(cls, body: Any) -> Self:
        records = required(body, "records", list, "log")
        if len(records) > MAX_LOG_RECORDS:
            raise ProtocolError(f"log message carries {len(records)} records; at most "
                                f"{MAX_LOG_RECORDS} are allowed")
        dropped = optional_int(body, "dropped", "log")
        if dropped < 0:
            raise ProtocolError(f"log message field 'dropped' must be >= 0, got {dropped}")
        return cls([LogEntry.from_wire(r) for r in records], dropped)


__all__ = ["MAX_LOG_LOGGER", "MAX_LOG_MESSAGE", "MAX_LOG_RECORDS", "MAX_LOG_TRACEBACK",
           "LogEntry", "WorkerLog"]
