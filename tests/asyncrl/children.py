"""Targets for the launcher's tests: tiny child processes (stdlib only, so they start fast)."""

from __future__ import annotations

import os
import signal
import time


def exit_with(code: int) -> None:
    """End at once with ``code``."""
    os._exit(code)


def exit_with_omp_threads() -> None:
    """End with the OMP_NUM_THREADS the child started with as its exit code (0: unset)."""
    os._exit(int(os.environ.get("OMP_NUM_THREADS", "0")))


def ignore_sigterm(ready: str) -> None:
    """Ignore SIGTERM, say so by creating ``ready``, then wait to be killed."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with open(ready, "w"):
        pass
    while True:
        time.sleep(1)


def wait_forever(ready: str) -> None:
    """Create ``ready``, then wait (the default SIGTERM ends it)."""
    with open(ready, "w"):
        pass
    while True:
        time.sleep(1)
