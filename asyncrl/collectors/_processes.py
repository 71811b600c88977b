"""Local worker processes: start (off the event loop), watch (on the process sentinel), stop."""

from __future__ import annotations

import logging
import os
import pickle
import signal
from collections.abc import Awaitable, Callable
from multiprocessing.process import BaseProcess
from typing import Any

import anyio

from transports import random_identity

from .._worker import (
    EXIT_COORDINATOR_LOST,
    EXIT_ERROR,
    EXIT_OK,
    EXIT_REFUSED,
    process_main,
)
from .._worker_spec import WorkerSpec
from ._launcher import worker_context

log = logging.getLogger("asyncrl.collectors")

#: ``on_death(slot, process)`` for a process that ended (reaped: ``exitcode`` is real);
#: returns True to have the slot respawned.
OnDeath = Callable[[int, BaseProcess], Awaitable[bool]]


class LocalWorkers:
    """``count`` spawned worker processes connected to ``endpoint``, one per slot.

    The spec (which holds the policy) goes to the children through a 0600 file in
    the collector's private directory, not through the spawn pipe: a spec larger
    than the pipe buffer made ``Process.start()`` block until the child had
    imported torch. Processes are started in threads, in parallel, so the event
    loop keeps answering heartbeats and hellos while they start; by default they
    are forked from a warm fork server (see :mod:`._launcher`).
    """

    def __init__(self, endpoint: str, spec: WorkerSpec, count: int, *, token: str,
                 backend: str, options: dict[str, Any], directory: str,
                 start_method: str = "forkserver") -> None:
        self.endpoint = endpoint
        self.spec = spec
        self.count = count
        self.token = token
        self.backend = backend
        self.options = options
        self.directory = directory  # private (mkdtemp, 0700), removed by the collector
        self.start_method = start_method
        self.slots: dict[int, BaseProcess] = {}  # the current process of each slot
        self.processes: list[BaseProcess] = []  # every process ever started, for stop()
        self.identities: dict[BaseProcess, bytes] = {}  # each process's link identity
        self._spec_path: str | None = None

    @property
    def pids(self) -> list[int]:
        """Process ids of the live process of each slot, in slot order."""
        return [p.pid for _, p in sorted(self.slots.items())
                if p.pid is not None and p.is_alive()]

    async def run(self, on_death: OnDeath, *,
                  task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Start every slot (reported started once all are), then watch and respawn."""
        if not self.count:
            task_status.started()
            return
        self._spec_path = await anyio.to_thread.run_sync(self._write_spec)
        async with anyio.create_task_group() as spawning:
            for slot in range(self.count):
                spawning.start_soon(self.spawn, slot)
        task_status.started()
        async with anyio.create_task_group() as tg:
            for slot in range(self.count):
                tg.start_soon(self._watch_slot, slot, on_death)

    def _write_spec(self) -> str:
        # Plain pickle, not multiprocessing's: torch's multiprocessing reductions would
        # put the policy's tensors in memory shared with the trainer, and every
        # optimiser step would silently change the workers' weights (no version,
        # no ack). The workers get a copy; updates go through the weight channels.
        path = os.path.join(self.directory, "worker-spec.pickle")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            pickle.dump(self.spec, f, protocol=pickle.HIGHEST_PROTOCOL)
        return path

    async def spawn(self, slot: int) -> None:
        """Start a process for ``slot`` (in a thread: ``start()`` may take a while)."""
        # Chosen here, not in the child: a death seen on the sentinel maps to its peer.
        identity = random_identity(f"local-{slot}")

        def start() -> None:
            method = self.start_method
            while True:
                context = worker_context(method)  # may start the fork server
                process = context.Process(  # type: ignore[attr-defined]
                    target=process_main,
                    args=(self.endpoint, self._spec_path, slot, identity, self.token,
                          self.backend, os.getpid(), self.options),
                    name=f"asyncrl-worker-{slot}",
                    daemon=True,
                )
                try:
                    process.start()
                    break
                except (OSError, EOFError) as exc:
                    if method == "spawn":
                        raise
                    # The fork server died (e.g. importing a script without a
                    # `__main__` guard) or cannot be reached: a spawned process
                    # still works, and reports such errors itself.
                    log.warning("the fork server could not start worker %d (%r); "
                                "spawning it instead", slot, exc)
                    method = "spawn"
            # Recorded in the thread: a cancelled spawn still leaves a stoppable process.
            self.processes.append(process)
            self.identities[process] = identity
            self.slots[slot] = process

        await anyio.to_thread.run_sync(start)

    async def _watch_slot(self, slot: int, on_death: OnDeath) -> None:
        while True:
            process = self.slots[slot]
            await anyio.wait_readable(process.sentinel)
            # The sentinel fires as the child exits, maybe before it can be reaped:
            # join() (in a thread: it blocks until then) gives the real exit status.
            await anyio.to_thread.run_sync(process.join)
            if not await on_death(slot, process):
                return
            await self.spawn(slot)

    async def stop(self, grace: float = 3.0) -> None:
        """Wait up to ``grace`` s for the processes to exit, then terminate, then kill."""
        for signal_step in ("wait", "terminate", "kill"):
            alive = [p for p in self.processes if p.is_alive()]
            if not alive:
                break
            if signal_step == "terminate":
                for p in alive:
                    p.terminate()
            elif signal_step == "kill":
                for p in alive:
                    p.kill()
            with anyio.move_on_after(grace if signal_step == "wait" else 1.0):
                for p in alive:
                    await anyio.wait_readable(p.sentinel)
        for p in self.processes:
            p.join(0.1)
            if p.exitcode not in (None, EXIT_OK, EXIT_ERROR):
                log.debug("worker %s exited with %s", p.pid, p.exitcode)


def describe_exit(exitcode: int | None) -> str:
    """``"was killed by SIGKILL (exit code -9)"``, ``"exited with code 1"``, ..."""
    if exitcode is None:
        return "ended with an unknown exit status"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"was killed by {name} (exit code {exitcode})"
    return f"exited with code {exitcode}"


def likely_causes(exitcode: int | None) -> str:
    """What usually makes a local worker end that way, and what to do about it."""
    if exitcode == EXIT_ERROR:
        return ("it failed before it could report an error to the coordinator; likely "
                "causes: the script that creates the collector lacks an "
                "`if __name__ == \"__main__\":` guard (spawned workers import it again), "
                "the env factory or the policy cannot be unpickled in a fresh process "
                "(defined in an interactive session, a lambda, a class that moved), or "
                "user code called sys.exit(1); its traceback, if any, is on stderr")
    if exitcode == EXIT_COORDINATOR_LOST:
        return "it heard nothing from the coordinator within peer_timeout and gave up"
    if exitcode == EXIT_REFUSED:
        return "the coordinator refused it (see the warning logged by asyncrl.coordinator)"
    if exitcode is not None and exitcode < 0:
        return ("a signal ended it: the OOM killer (see `dmesg`), a `kill`, or a crash "
                "in native code (SIGSEGV, SIGABRT)")
    return "it ended before the collector was closed"


__all__ = ["LocalWorkers", "OnDeath", "describe_exit", "likely_causes"]
