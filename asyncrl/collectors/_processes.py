"""Local worker processes: spawn, watch (event-driven, on the process sentinel), stop."""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import pickle
from collections.abc import Awaitable, Callable
from multiprocessing.process import BaseProcess
from typing import Any

import anyio

from .._spec import WorkerSpec
from ..worker import EXIT_ERROR, EXIT_OK, process_main

log = logging.getLogger("asyncrl.collectors")


class LocalWorkers:
    """``count`` spawned worker processes connected to ``endpoint``."""

    def __init__(self, endpoint: str, spec: WorkerSpec, count: int, *, token: str,
                 backend: str, options: dict[str, Any]) -> None:
        self.endpoint = endpoint
        self.spec = spec
        self.count = count
        self.token = token
        self.backend = backend
        self.options = options
        self.processes: list[BaseProcess] = []

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.processes if p.pid is not None]

    def start(self) -> None:
        context = mp.get_context("spawn")  # fork is unsafe with threads and ZeroMQ
        # Plain pickle, not multiprocessing's: torch's multiprocessing reductions would
        # put the policy's tensors in memory shared with the trainer, and every
        # optimiser step would silently change the workers' weights (no version,
        # no ack). The workers get a copy; updates go through the weight channels.
        spec_bytes = pickle.dumps(self.spec, protocol=pickle.HIGHEST_PROTOCOL)
        for slot in range(self.count):
            process = context.Process(
                target=process_main,
                args=(self.endpoint, spec_bytes, slot, self.token, self.backend, os.getpid(),
                      self.options),
                name=f"asyncrl-worker-{slot}",
                daemon=True,
            )
            process.start()
            self.processes.append(process)

    async def watch(self, on_death: Callable[[int, int, int], Awaitable[None]]) -> None:
        """Call ``on_death(slot, pid, exitcode)`` for each process that ends."""
        async with anyio.create_task_group() as tg:
            for slot, process in enumerate(self.processes):
                tg.start_soon(self._watch_one, slot, process, on_death)

    async def _watch_one(self, slot: int, process: BaseProcess,
                         on_death: Callable[[int, int, int], Awaitable[None]]) -> None:
        await anyio.wait_readable(process.sentinel)
        process.join(0)
        await on_death(slot, process.pid or -1, process.exitcode or 0)

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
