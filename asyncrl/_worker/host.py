"""One worker host: K worker processes and, for K > 1, the relay that feeds them weights.

What ``asyncrl worker --workers K`` runs, and what a Ray host actor runs
(:func:`asyncrl.launch.ray.launch_hosts`). The processes are started, watched
and stopped by :class:`~asyncrl._spawn.processes.WorkerProcesses`, as a collector's
local workers are.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import socket
from contextlib import AsyncExitStack
from multiprocessing.process import BaseProcess
from typing import Any

import anyio
import anyio.abc

from transports import CurveClient, random_identity

from .._observe.probes import DEFAULT_HOST as DEFAULT_PROBE_HOST
from .._observe.probes import AdmissionBoard, ProbeServer
from .._spawn.exit_codes import EXIT_JOIN_TIMEOUT
from .._spawn.processes import WorkerProcesses
from .._spawn.stop_signals import STOP_SIGNALS, ignore_stop_signals
from .entry import host_worker_processes
from .spec import WorkerSpec

log = logging.getLogger("asyncrl.host")

#: How long stopped workers get to exit after SIGTERM before SIGKILL.
STOP_TIMEOUT = 10.0
#: Without ``--reconnect``: how long an admitted worker rides out a cut link (seconds).
GIVE_UP_AFTER = 120.0
#: How often the host looks whether its workers are whole (all admitted, or none).
FILL_CHECK = 1.0


def heartbeat_interval(peer_timeout: float) -> float:
    """1 s, or less for short timeouts: several heartbeats must fit in one timeout."""
    return min(1.0, peer_timeout / 4)


class HostWorkers:
    """Spawns this host's K workers (and their relay) and waits for them; see :meth:`run`.

    >>> host = HostWorkers("tcp://trainer:5555", WorkerSpec("CartPole-v1"),  # doctest: +SKIP
    ...                    workers=4, reconnect=True)
    >>> exit_code = host.run()   # blocks until the workers exit
    """

    _stop_requested: anyio.Event  # set by a stop signal once the workers exist
    _starting: anyio.CancelScope  # the whole run: a stop signal before the workers cancels it

    def __init__(self, connect: str, spec: WorkerSpec, *, workers: int, relay: bool = True,
                 peer_timeout: float = 10.0, reconnect: bool = False,
                 give_up_after: float = GIVE_UP_AFTER,
                 curve_keys: str | CurveClient | None = None, backend: str = "asyncio",
                 log_config: dict[str, Any] | None = None, probe_port: int | None = None,
                 probe_host: str = DEFAULT_PROBE_HOST,
                 join_timeout: float | None = None, log_file: str | None = None,
                 forward_logs: bool = True, fill_timeout: float | None = None) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.connect = connect
        self.spec = spec
        self.relay = relay and workers > 1
        self.peer_timeout = peer_timeout
        self.reconnect = reconnect
        self.give_up_after = give_up_after  # a cut link: wait this long for the coordinator
        # Resolved once here (a directory, or ASYNCRL_CURVE_* variables when None):
        # the relay and the worker processes get the keys themselves.
        self.curve_keys = CurveClient.load(curve_keys)
        self.join_timeout = join_timeout  # each worker's and the relay's (see run_worker)
        self.backend = backend
        self.log_config = log_config  # the workers' logging (asyncrl._spawn.logs.capture())
        self.log_file = log_file  # each worker process appends its lines here too
        self.forward_logs = forward_logs  # records also go to the trainer's asyncrl.worker
        # Unguessable (128 random bits each): an identity is a route on the hub.
        tag = f"{socket.gethostname()}-{os.getpid()}"
        self.identities = [random_identity(f"{tag}-w{i}") for i in range(workers)]
        # The coordinator admits this host's workers together or not at all (by this
        # unguessable name); as a backstop, a host whose workers stay part admitted
        # (or lost one) for fill_timeout s exits non-zero: its orchestrator restarts it.
        self.group = f"{socket.gethostname()[:24]}-{secrets.token_hex(16)}"
        self.fill_timeout = fill_timeout if fill_timeout is not None else \
            (GIVE_UP_AFTER if join_timeout is None else join_timeout) + 2 * peer_timeout
        self.unfilled_exit = False  # the backstop stopped this host
        self.processes: list[BaseProcess] = []
        #: Liveness and readiness over HTTP (asyncrl._observe.probes) on this port, if any.
        self.probe_port = probe_port
        self.probe_host = probe_host
        self.admission: AdmissionBoard | None = None
        self._stopped_by_signal = False
        self._workers: WorkerProcesses | None = None  # once the relay is open

    def run(self) -> int:
        """Start the workers, wait until they all exit; return the exit code that matters."""
        try:
            anyio.run(self._run, backend=self.backend)
        except KeyboardInterrupt:
            pass  # before the signal handler was in place; the workers are stopped by then
        codes = [p.exitcode or 0 for p in self.processes]
        if self._stopped_by_signal or self.unfilled_exit:
            # Stopped as asked: a worker ended by the SIGTERM this host forwarded (or
            # that a kill of the process group gave it) did what it was told.
            codes = [0 if c == -signal.SIGTERM else c for c in codes]
        if self.unfilled_exit and not any(codes):
            return EXIT_JOIN_TIMEOUT  # never 0: the orchestrator must restart this host
        return max(codes, key=abs) if any(codes) else 0

    def unfilled(self) -> bool:
        """Some workers are admitted and others not, or a worker process ended while
        others run: this host runs below its size (none admitted: it waits whole)."""
        if not self.processes or self.admission is None:
            return False
        admitted = self.admission.admitted()
        alive = [p.is_alive() for p in self.processes]
        return not (all(alive) and (all(admitted) or not any(admitted)))

    def probe_state(self) -> dict[str, Any]:
        """Ready when every worker process runs and a collector admitted each of them."""
        admitted = self.admission.admitted() if self.admission is not None else []
        alive = [p.is_alive() for p in self.processes]
        ready = (len(alive) == len(self.identities) and all(alive) and all(admitted)
                 and len(admitted) == len(alive))
        return {"ready": ready, "workers": len(self.identities), "alive": sum(alive),
                "admitted": sum(admitted)}

    async def _run(self) -> None:
        self.admission = AdmissionBoard(self.identities)  # readiness, and the fill backstop
        self._stop_requested = anyio.Event()  # a stop signal came once the workers existed
        server = None
        if self.probe_port is not None:
            server = ProbeServer(self.probe_state, host=self.probe_host, port=self.probe_port)
            await server.bind()  # a port in use is a plain OSError, before any worker starts
        async with anyio.create_task_group() as signals:
            # Then at once: a SIGTERM while the relay opens and the workers start (a pod
            # deleted as it starts) stops this host cleanly, not by its default action.
            with anyio.CancelScope() as self._starting:
                await signals.start(self._watch_stop_signals)
                await self._serve(server)
            signals.cancel_scope.cancel()

    async def _serve(self, server: ProbeServer | None) -> None:
        async with anyio.create_task_group() as probes:
            if server is not None:
                await probes.start(server.serve)
            try:
                await self._run_workers()
            finally:
                probes.cancel_scope.cancel()

    async def _run_workers(self) -> None:
        async with AsyncExitStack() as stack:
            options: dict[str, Any] = {
                "peer_timeout": self.peer_timeout,
                "heartbeat_interval": heartbeat_interval(self.peer_timeout),
                "reconnect": self.reconnect, "give_up_after": self.give_up_after,
                "curve_keys": self.curve_keys,
                "log_config": self.log_config, "join_timeout": self.join_timeout,
                "log_file": self.log_file, "forward_logs": self.forward_logs,
                "group": (self.group, len(self.identities)) if len(self.identities) > 1
                else ("", 0)}
            if self.admission is not None:
                options["admission"] = self.admission
            if self.relay:
                from .relay import HostRelay

                relay = await stack.enter_async_context(HostRelay(
                    self.connect, self.identities, peer_timeout=self.peer_timeout,
                    heartbeat_interval=heartbeat_interval(self.peer_timeout),
                    curve_keys=self.curve_keys, join_timeout=self.join_timeout))
                options.update(relay=relay.endpoint, relay_name=relay.name)
            workers = self._workers = host_worker_processes(
                self.connect, self.spec, self.identities, backend=self.backend, options=options)
            self.processes = workers.processes
            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._stop_when_asked, workers)
                    tg.start_soon(self._stop_when_unfilled, workers)
                    await workers.run()  # until every worker exited
                    tg.cancel_scope.cancel()
            finally:
                # The workers exit when told or when we die; stop what is left (an
                # error, Ctrl-C), then the relay closes and removes its socket directory.
                await workers.stop(grace=STOP_TIMEOUT, kill_after=STOP_TIMEOUT)

    async def _watch_stop_signals(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        # SIGTERM (docker stop, systemd, kill) and Ctrl-C stop the workers, or the start.
        with anyio.open_signal_receiver(*STOP_SIGNALS) as received:
            task_status.started()
            async for signum in received:
                name = signal.Signals(signum).name
                break
            else:  # pragma: no cover -- a receiver does not end on its own
                return
        self._stopped_by_signal = True
        # The receiver gave the default handler back: a second SIGTERM (systemd's to the
        # whole group, an impatient operator's) must not kill the host while it stops its
        # workers (bounded: STOP_TIMEOUT, then SIGKILL). A second Ctrl-C still interrupts.
        ignore_stop_signals(signal.SIGTERM)
        if self._workers is None:
            log.info("%s: stopping this host before its workers started", name)
            self._starting.cancel()  # nothing runs yet: the relay and the probes close
            return
        log.info("%s: stopping this host's workers", name)
        self._stop_requested.set()

    async def _stop_when_asked(self, workers: WorkerProcesses) -> None:
        await self._stop_requested.wait()
        await workers.stop(grace=0, kill_after=STOP_TIMEOUT)

    async def _stop_when_unfilled(self, workers: WorkerProcesses) -> None:
        """The backstop of whole admission: part of this host for ``fill_timeout`` s
        (a worker refused while its siblings joined, one that died) ends the host."""
        since = None
        while True:
            await anyio.sleep(FILL_CHECK)
            if not self.unfilled():
                since = None
                continue
            now = anyio.current_time()
            since = now if since is None else since
            if now - since >= self.fill_timeout:
                break
        assert self.admission is not None
        running = [p.is_alive() for p in self.processes]
        admitted = sum(a and r for a, r in zip(self.admission.admitted(), running, strict=False))
        log.error("only %d of this host's %d workers were admitted (%d running) for %.0f s: "
                  "stopping them all, so that this host exits (code %d) and is restarted "
                  "whole", admitted, len(self.identities), sum(running), self.fill_timeout,
                  EXIT_JOIN_TIMEOUT)
        self.unfilled_exit = True
        await workers.stop(grace=0, kill_after=STOP_TIMEOUT)
