"""The served module's status word, in shared memory: serving, closed, or failed and why.

The server writes it (the message first, then the state); every client reads it while
it waits, so a closed or failed module fails its callers at once with the reason,
instead of after their ``call_timeout``.

>>> import numpy as np
>>> views = {"state": np.zeros(1, np.int64), "message": np.zeros(MESSAGE_BYTES, np.uint8)}
>>> write_status(views, FAILED, "ValueError: bad input")
>>> read_status(views)
(2, 'ValueError: bad input')
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["CLOSED", "FAILED", "MESSAGE_BYTES", "SERVING", "read_status", "write_status"]

SERVING, CLOSED, FAILED = 0, 1, 2
#: Room for the reason (UTF-8, cut to fit).
MESSAGE_BYTES = 2048


def write_status(views: Mapping[str, Any], state: int, message: str = "") -> None:
    """Set the state; the message goes in first, so a reader of the state finds it."""
    data = message.encode("utf-8", "replace")[:MESSAGE_BYTES - 1]
    buffer = views["message"]
    buffer[:] = 0
    buffer[:len(data)] = list(data)
    views["state"][0] = state


def read_status(views: Mapping[str, Any]) -> tuple[int, str]:
    """``(state, message)``."""
    raw = bytes(views["message"].tobytes()).split(b"\x00", 1)[0]
    return int(views["state"][0]), raw.decode("utf-8", "replace")
