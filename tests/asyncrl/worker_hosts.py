"""A remote worker host for the tests: ``asyncrl worker --connect`` in a subprocess."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def worker_host(endpoint: str, env: str, *flags: str,
                capture_stderr: bool = False) -> Iterator[subprocess.Popen[Any]]:
    """A host joining ``endpoint`` with envs from ``env`` (``--env``) and ``flags``; on
    exit it is terminated if still running, then killed if it outlives 30 s.

    ``capture_stderr``: its stderr as text, read with ``host.communicate()``.
    """
    host = subprocess.Popen(
        [sys.executable, "-m", "asyncrl.cli", "worker", "--connect", endpoint, "--env", env,
         *flags],
        stderr=subprocess.PIPE if capture_stderr else None, text=capture_stderr)
    try:
        yield host
    finally:
        if host.poll() is None:
            host.terminate()
        try:
            host.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            host.kill()
            host.communicate(timeout=10)
