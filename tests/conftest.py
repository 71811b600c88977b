"""Shared fixtures: every async test runs on asyncio and on trio.

Also the suite's own hygiene, because CI shows only what the run printed:

- a failing test is named on its own line the moment it fails (a run cut short
  by the CI limit still says which tests broke and why);
- a test that leaves a child process running fails at teardown, and the process
  is killed so that it cannot slow down or disturb the tests after it.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(autouse=True, scope="session")
def multiprocessing_temp_dir() -> None:
    """multiprocessing's temporary directory (the fork server's socket) in the real /tmp.

    Made lazily otherwise, it could land in a test's own TMPDIR (the chaos
    sandboxes), removed when that test ends.
    """
    from multiprocessing import util

    util.get_temp_dir()


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return request.param


def _children(pid: int) -> set[int]:
    """Every live descendant of ``pid`` (Linux /proc; zombies are not counted)."""
    found: set[int] = set()
    todo = [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                kids = (task / "children").read_text().split()
            except OSError:
                continue
            for kid in map(int, kids):
                if kid not in found and not _is_zombie(kid):
                    found.add(kid)
                    todo.append(kid)
    return found


def _is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return "?"


# Helpers that multiprocessing starts once and keeps for the whole session.
_SESSION_HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")


def _leaked(before: set[int]) -> set[int]:
    # A helper is exempt, not what it forked (workers forked by the fork server
    # carry its command line too, but they are not our children).
    return {pid for pid in _children(os.getpid()) - before
            if not (_parent(pid) == os.getpid()
                    and any(helper in _command(pid) for helper in _SESSION_HELPERS))}


def _parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1


@pytest.fixture(autouse=True)
def no_leaked_processes() -> Iterator[None]:
    """Fail a test that leaves a child process behind, and kill that process."""
    before = _children(os.getpid()) if Path("/proc/self/task").exists() else None
    yield
    if before is None:
        return
    deadline = time.monotonic() + 5.0  # an aclose()d worker may take a moment to exit
    leaked = _leaked(before)
    while leaked and time.monotonic() < deadline:
        time.sleep(0.05)
        leaked = _leaked(before)
    if not leaked:
        return
    described = [f"pid {pid}: {_command(pid)[:160]}" for pid in sorted(leaked)]
    for pid in leaked:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    pytest.fail("the test left child processes running (now killed):\n  "
                + "\n  ".join(described), pytrace=False)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Name a failure at once, with its last error line, before the final summary."""
    if not report.failed:
        return
    lines = (report.longreprtext or "").strip().splitlines()
    errors = [line for line in lines if line.startswith("E ")]
    last = errors[-1] if errors else (lines[-1] if lines else "")
    print(f"\nFAILED {report.nodeid} ({report.when}): {last.strip()[:300]}", flush=True)
