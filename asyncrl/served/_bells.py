"""Doorbells a process finds by path: :class:`FifoBell`, an :class:`~asyncrl._inference.doorbell.
EventFd` over a named pipe.

Central inference hands its eventfds to the env workers it spawns (the fd travels with
the process, :mod:`asyncrl._inference.doorbell`). A served module outlives any one
collector: the env workers that call it are spawned by whichever collector the user
opens next, from an env factory that holds the module's address as plain data
(:class:`~asyncrl.served.ServedModuleHandle`). So its bells are FIFOs in a private
directory (mode 0700): any process of this host and user that knows the path opens
the same bell, and nothing but a path is pickled. The inference loop rings and waits
on them exactly as on its eventfds.

>>> import os, tempfile
>>> path = os.path.join(tempfile.mkdtemp(), "bell")
>>> make_fifo(path)
>>> bell = FifoBell(path)
>>> bell.ring(); bell.ring(); bell.wait(timeout=0)   # two rings, one wake-up
True
>>> bell.wait(timeout=0)
False
>>> bell.close(); os.unlink(path)
"""

from __future__ import annotations

import os
from typing import Any

from .._inference.doorbell import EventFd

__all__ = ["FifoBell", "make_fifo"]


def make_fifo(path: str) -> None:
    """Create the named pipe ``path`` (readable and writable by this user only)."""
    os.mkfifo(path, 0o600)


class FifoBell(EventFd):
    """A named pipe as a doorbell: :meth:`ring` writes a byte, :meth:`wait` drains them.

    Opened read-write and non-blocking: opening never waits for the other end, a ring
    into a full pipe is dropped (the wake-ups already queued are enough), and every
    opener may both ring and wait.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        super().__init__(os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC))

    def ring(self) -> None:
        try:
            os.write(self.fd, b"\x01")
        except BlockingIOError:  # full: the waiter has 64 KiB of wake-ups queued already
            pass

    def wait(self, timeout: float | None = None) -> bool:
        """Sleep until rung (True: the rings so far are drained) or ``timeout`` passed."""
        wait_ms = -1 if timeout is None else max(0, int(timeout * 1000 + 0.999))
        if not self._poll.poll(wait_ms):
            return False
        try:
            while os.read(self.fd, 65536):
                pass
        except BlockingIOError:  # drained
            pass
        return True

    def __reduce__(self) -> Any:
        # The path is the bell: whoever unpickles it opens it again (same host only).
        return FifoBell, (self.path,)

    def __repr__(self) -> str:
        return f"FifoBell({self.path!r})"
