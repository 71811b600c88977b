"""Helpers for tests that run asyncrl processes: free ports, exits, process groups."""

from __future__ import annotations

import os
import signal
import socket
import subprocess

import anyio


def free_port() -> int:
    """A loopback TCP port nobody listens on (once this returns)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def wait_exit(process: subprocess.Popen) -> int:
    """The exit code, once ``process`` ended (bound the wait with ``anyio.fail_after``)."""
    while process.poll() is None:
        await anyio.sleep(0.05)
    return process.returncode


def kill_group(process: subprocess.Popen) -> None:
    """SIGKILL ``process`` and everything in its session (started with start_new_session)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie waiting to be reaped counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False
