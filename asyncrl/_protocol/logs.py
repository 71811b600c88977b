"""Forwarded log records: a worker's ``log`` message and the records it carries."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, NamedTuple, Self

import msgspec
from msgspec import Meta

from transports import ProtocolError

from .decoding import Text, clean, read_fields

#: Most records one ``log`` message may carry; the worker sends more as more messages.
MAX_LOG_RECORDS = 64
#: Longest message (and logger name, traceback) text a forwarded record keeps.
MAX_LOG_MESSAGE = 4096
MAX_LOG_LOGGER = 200
MAX_LOG_TRACEBACK = 16384
#: A record's level: ``logging``'s numbers (0 to 50, and custom levels up to 100).
Level = Annotated[int, Meta(ge=0, le=100)]


class WireRecord(NamedTuple):
    """A record on the wire: ``[level, logger, message, traceback]``."""

    level: Level
    logger: str
    message: str
    traceback: str


@dataclass(frozen=True, slots=True)
class LogEntry:
    """One worker log record, as it travels: level, logger name, message, traceback.

    Read from the wire, its texts are printable (see :mod:`transports._printable`):
    the logger name on one line, the message's continuation lines indented, every
    line of the traceback indented (it is printed under the message), so that no
    record can start a line that reads like one of the trainer's.
    """

    level: Level
    logger: Annotated[str, Text(MAX_LOG_LOGGER)]
    message: Annotated[str, Text(MAX_LOG_MESSAGE, "lines")]
    traceback: Annotated[str, Text(MAX_LOG_TRACEBACK, "block")] = ""

    @classmethod
    def from_wire(cls, item: Any) -> Self:
        try:
            record = msgspec.convert(item, WireRecord, strict=True)
        except msgspec.ValidationError as exc:
            raise ProtocolError(f"log record must be [level 0..100, logger, message, "
                                f"traceback]: {exc}") from None
        return clean(cls(*record))

    def to_wire(self) -> list[Any]:
        return [self.level, self.logger, self.message, self.traceback]


@dataclass(slots=True)
class WorkerLog:
    """Worker -> coordinator: log records of the worker's process (see
    :mod:`asyncrl._worker.log_forward`), and how many it dropped (rate, queue)."""

    KIND: ClassVar[str] = "log"
    WIRE: ClassVar[dict[str, Any]] = {
        "records": Annotated[list[WireRecord], Meta(max_length=MAX_LOG_RECORDS)]}
    records: list[LogEntry]
    dropped: Annotated[int, Meta(ge=0)] = 0

    def to_body(self) -> dict[str, Any]:
        return {"records": [r.to_wire() for r in self.records], "dropped": self.dropped}

    @classmethod
    def from_body(cls, body: Any) -> Self:
        wire = read_fields(cls, body, "log")
        return cls([clean(LogEntry(*record)) for record in wire["records"]], wire["dropped"])


__all__ = ["MAX_LOG_LOGGER", "MAX_LOG_MESSAGE", "MAX_LOG_RECORDS", "MAX_LOG_TRACEBACK",
           "LogEntry", "WorkerLog"]
