"""The process launcher alone: start, exit codes, respawn, stop (SIGTERM, then SIGKILL)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import anyio
import pytest

from asyncrl._spawn.processes import WorkerProcesses, describe_exit
from asyncrl._spawn.threads import THREAD_VARIABLES
from tests.asyncrl.children import exit_with, exit_with_omp_threads, ignore_sigterm, wait_forever

pytestmark = pytest.mark.anyio
LIMIT = 60  # spawned interpreters start slowly on a busy machine


def launcher(count: int, target, args=lambda slot, identity: (), **kwargs) -> WorkerProcesses:
    # Spawned: a stdlib-only child starts in a fraction of a second, with no fork server.
    return WorkerProcesses(count, target, args, identity=lambda slot: f"w{slot}".encode(),
                           start_method="spawn", **kwargs)


async def until_exists(path: Path) -> None:
    while not await anyio.Path(path).exists():
        await anyio.sleep(0.02)


async def test_run_reports_each_exit_code_and_returns_once_all_ended() -> None:
    seen: dict[int, int | None] = {}

    async def on_exit(slot, process) -> bool:
        seen[slot] = process.exitcode  # reaped: the real status
        return False

    workers = launcher(2, exit_with, lambda slot, identity: (3 * slot,))
    with anyio.fail_after(LIMIT):
        await workers.run(on_exit)
    assert seen == {0: 0, 1: 3}
    assert sorted(workers.exitcodes) == [0, 3]
    assert workers.pids == []  # none alive


async def test_a_slot_is_respawned_while_on_exit_says_so_with_a_new_identity() -> None:
    counter = iter(range(100))
    workers = WorkerProcesses(1, exit_with, lambda slot, identity: (7,),
                              identity=lambda slot: f"w{slot}-{next(counter)}".encode(),
                              start_method="spawn")
    exits: list[int | None] = []

    async def on_exit(slot, process) -> bool:
        exits.append(process.exitcode)
        return len(exits) < 2

    with anyio.fail_after(LIMIT):
        await workers.run(on_exit)
    assert exits == [7, 7]
    assert len(workers.processes) == 2
    assert [workers.identities[p] for p in workers.processes] == [b"w0-0", b"w0-1"]
    assert workers.slots[0] is workers.processes[1]


async def test_stop_kills_a_child_that_ignores_sigterm_within_its_bound(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    workers = launcher(1, ignore_sigterm, lambda slot, identity: (str(ready),))
    with anyio.fail_after(LIMIT):
        await workers.spawn(0)
        await until_exists(ready)
    with anyio.fail_after(0.2 + 0.5 + 1.0 + 5.0):  # grace + kill_after + the kill's wait, slack
        await workers.stop(grace=0.2, kill_after=0.5)
    assert workers.exitcodes == [-signal.SIGKILL]


async def test_stop_terminates_a_child_that_did_not_exit_within_grace(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    workers = launcher(1, wait_forever, lambda slot, identity: (str(ready),))
    with anyio.fail_after(LIMIT):
        await workers.spawn(0)
        await until_exists(ready)
        await workers.stop(grace=0.1, kill_after=LIMIT)
    assert workers.exitcodes == [-signal.SIGTERM]


async def test_a_cancelled_stop_still_leaves_no_process(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    workers = launcher(1, ignore_sigterm, lambda slot, identity: (str(ready),))
    with anyio.fail_after(LIMIT):
        await workers.spawn(0)
        await until_exists(ready)
        with anyio.CancelScope() as scope:
            scope.cancel()
            await workers.stop(grace=0, kill_after=0.2)
    assert workers.exitcodes == [-signal.SIGKILL]


async def test_nothing_is_started_once_stop_began() -> None:
    workers = launcher(1, exit_with, lambda slot, identity: (0,))
    with anyio.fail_after(LIMIT):
        await workers.stop()
        assert await workers.spawn(0) is False
    assert workers.processes == [] and workers.slots == {}


async def test_threads_size_a_spawned_childs_native_pools_only_while_it_starts(
        monkeypatch: pytest.MonkeyPatch) -> None:
    for name in THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    workers = launcher(1, exit_with_omp_threads, threads=3)
    with anyio.fail_after(LIMIT):
        await workers.run()
    assert workers.exitcodes == [3]
    assert "OMP_NUM_THREADS" not in os.environ  # the parent's own environment is left as it was


@pytest.mark.parametrize(("exitcode", "text"), [
    (-9, "was killed by SIGKILL (exit code -9)"),
    (-15, "was killed by SIGTERM (exit code -15)"),
    (-200, "was killed by signal 200 (exit code -200)"),
    (3, "exited with code 3"),
    (None, "ended with an unknown exit status"),
])
def test_an_exit_is_described_in_words(exitcode: int | None, text: str) -> None:
    assert describe_exit(exitcode) == text
