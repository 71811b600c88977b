"""Remote hosts for the tests: ``asyncrl worker --connect`` in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio

#: The repository's root: env hosts import the tests' env modules from it.
ROOT = str(Path(__file__).resolve().parents[2])


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


def env_host(endpoint: str, env: str, backend: str, *flags: str,
             envs: int = 2) -> subprocess.Popen[str]:
    """A central-inference env host (``asyncrl worker --role env``) joining ``endpoint``
    with ``envs`` envs from ``env`` on anyio ``backend``; its stderr captured as text
    (read it with :func:`wait_exit`)."""
    path = ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")
    return subprocess.Popen(
        [sys.executable, "-m", "asyncrl.cli", "worker", "--role", "env", "--connect", endpoint,
         "--env", env, "--envs-per-worker", str(envs), "--backend", backend, *flags],
        env=dict(os.environ, PYTHONPATH=path), stderr=subprocess.PIPE, text=True)


async def wait_exit(process: subprocess.Popen[str], timeout: float = 30) -> tuple[int, str]:
    """``process``'s exit code and stderr, once it ends (at most ``timeout`` s)."""
    with anyio.fail_after(timeout):
        code = await anyio.to_thread.run_sync(process.wait)
    assert process.stderr is not None
    return code, process.stderr.read()
