"""Assertions shared by the chaos scenarios: leftovers, memory, the frames of a run.

A scenario runs inside a :class:`Sandbox` (the ``sandbox`` fixture): its own temporary
directory (so that the socket directories of this test are told apart from those of
tests running beside it) and a snapshot of the processes that existed before it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import anyio

from asyncrl.testing import frame_identity_problems, version_problems

HEARTBEAT = 0.2  # short liveness settings keep every scenario quick
PEER_TIMEOUT = 1.5
LIVENESS: dict[str, Any] = {"heartbeat_interval": HEARTBEAT, "peer_timeout": PEER_TIMEOUT}
LIMIT = 60  # the bound on any one scenario's waits (2 shared cores, process spawns)
RSS_GROWTH_MB = 200  # what a scenario may add to the trainer's memory


def rss_mb(pid: int | str = "self") -> float:
    """Resident memory of ``pid`` in MiB (VmRSS of /proc/PID/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise LookupError(f"no VmRSS for pid {pid}")


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, session id) of a live process, None if gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    return fields[0], int(fields[1]), int(fields[3])


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(
            errors="replace").strip()
    except (FileNotFoundError, ProcessLookupError):
        return ""


def _all_pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def alive(pid: int) -> bool:
    stat = _stat(pid)
    return stat is not None and stat[0] not in "ZX"


class Sandbox:
    """Leftovers of one scenario: processes and socket directories it made."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="chaos-", dir="/tmp"))  # short ipc paths
        self.before = set(_all_pids())
        self.sessions: set[int] = set()  # hosts started with start_new_session
        self.markers: set[str] = set()  # endpoints: a process naming one belongs to us
        self.pids: set[int] = set()  # processes known to belong to this scenario

    def watch(self, *, endpoint: str | None = None, pids: Iterable[int] = (),
              session: int | None = None) -> None:
        """Also count as ours: processes naming ``endpoint``, ``pids``, a session's members."""
        if endpoint:
            self.markers.add(endpoint)
        self.pids.update(pids)
        if session is not None:
            self.sessions.add(session)

    def ours(self) -> list[int]:
        """Live processes this scenario started (and the test process's own descendants)."""
        me, found = os.getpid(), []
        stats = {pid: _stat(pid) for pid in _all_pids() if pid != me}
        parents = {pid: s[1] for pid, s in stats.items() if s is not None}
        for pid, stat in stats.items():
            if stat is None or stat[0] in "ZX":
                continue
            line = cmdline(pid)
            if ("resource_tracker" in line or "forkserver" in line) and parents.get(pid) == me:
                # multiprocessing's own helpers live as long as the test process
                # (not what the fork server forked: workers carry its command line too)
                continue
            ancestor, descendant = parents.get(pid), False
            for _ in range(16):
                if ancestor in (None, 0, 1):
                    break
                if ancestor == me:
                    descendant = True
                    break
                ancestor = parents.get(ancestor)
            new = pid not in self.before
            if (pid in self.pids or stat[2] in self.sessions
                    or (new and (descendant or any(m in line for m in self.markers)))):
                found.append(pid)
        return sorted(found)

    def socket_dirs(self) -> list[str]:
        return sorted(str(p) for p in self.root.glob("**/asyncrl-*"))

    async def wait_no_orphans(self, grace: float = 10.0) -> list[str]:
        """Processes still alive ``grace`` seconds from now (after ``aclose()``)."""
        with anyio.move_on_after(grace):
            while self.ours():
                await anyio.sleep(0.05)
        return [f"pid {pid}: {cmdline(pid)[:160]}" for pid in self.ours()]

    async def assert_clean(self, grace: float = 10.0) -> None:
        """No orphan process and no socket directory left by this scenario."""
        orphans = await self.wait_no_orphans(grace)
        assert not orphans, f"processes outlived the collector: {orphans}"
        assert not self.socket_dirs(), f"socket directories left behind: {self.socket_dirs()}"

    def clean_up(self) -> None:
        for pid in self.ours():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(self.root, ignore_errors=True)


def assert_frames(batches: list[Any], values: dict[int, float | None] | None = None, *,
                  total_frames: int | None = None, from_start: bool = True) -> None:
    """Every frame accounted for once, stamped with the version whose weights acted."""
    problems = frame_identity_problems(batches, from_start=from_start)
    if values is not None:
        problems += version_problems(batches, values)
    assert not problems, "\n".join(problems[:20])
    if total_frames is not None:
        collected = sum(b.numel() for b in batches)
        assert collected == total_frames, f"collected {collected} frames, asked {total_frames}"


async def train(collector: Any, *, after_batch: Any = None,
                offset: float = 0.0) -> tuple[list[Any], dict[int, float | None]]:
    """Iterate ``collector`` to the end, publishing new weights after every batch.

    The policy is a :class:`~asyncrl.testing.ValuePolicy`; each update sets its value
    to ``offset`` + the version number it is about to get, so a frame's action must
    match its stamped version. ``after_batch(collector, index)`` injects the fault.
    In sync mode every batch after an update must be entirely of that update's
    version (on-policy). Returns the batches and the value of each version.
    """
    policy = collector.policy
    values: dict[int, float | None] = {collector.policy_version: policy.value.item()}
    batches: list[Any] = []
    async for batch in collector:
        if collector.sync and batches:
            stamped = sorted(set(batch["collector", "policy_version"].flatten().tolist()))
            assert stamped == [collector.policy_version], (
                f"sync batch {len(batches)} after update to version "
                f"{collector.policy_version} holds versions {stamped}")
        batches.append(batch)
        if after_batch is not None:
            await after_batch(collector, len(batches) - 1)
        policy.value.data.fill_(offset + collector.policy_version + 1)
        await collector.update_policy_weights()
        values[collector.policy_version] = policy.value.item()
    return batches, values


def cli_host(endpoint: str, *args: str, sandbox: Sandbox) -> subprocess.Popen:
    """``asyncrl worker`` for IdentityEnv + ValuePolicy, in its own session, watched."""
    process = subprocess.Popen(
        [sys.executable, "-m", "asyncrl.cli", "worker", "--connect", endpoint,
         "--env", "asyncrl.testing:IdentityEnv", "--policy", "asyncrl.testing:ValuePolicy",
         "--peer-timeout", str(PEER_TIMEOUT), *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        env=sandbox_env(sandbox))
    sandbox.watch(session=process.pid, endpoint=endpoint)
    return process


def sandbox_env(sandbox: Sandbox) -> dict[str, str]:
    """The environment for a child: this worktree importable, temp files in the sandbox."""
    env = dict(os.environ, TMPDIR=str(sandbox.root))
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    return env


def pids_in(batches: list[Any]) -> set[int]:
    """The worker pids whose IdentityEnv frames appear in ``batches``."""
    return {int(p) for b in batches
            for p in b["next", "observation"][..., 0].flatten().tolist()}


async def wait_for(predicate: Any, what: str, timeout: float = LIMIT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await anyio.sleep(0.05)
