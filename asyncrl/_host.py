"""One worker host: K worker processes and, for K > 1, the relay that feeds them weights.

What ``asyncrl worker --workers K`` runs, and what a Ray host actor runs
(:func:`asyncrl.launch.ray.launch_hosts`).
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import signal
import socket
import sys
from typing import Any

import anyio

from transports import random_identity

from ._worker_spec import WorkerSpec
from .collectors._launcher import child_thread_environment

log = logging.getLogger("asyncrl.host")


def heartbeat_interval(peer_timeout: float) -> float:
    """1 s, or less for short timeouts: several heartbeats must fit in one timeout."""
    return min(1.0, peer_timeout / 4)


class HostWorkers:
    """Spawns this host's K workers (and their relay) and waits for them; see :meth:`run`.

    >>> host = HostWorkers("tcp://trainer:5555", WorkerSpec("CartPole-v1"),  # doctest: +SKIP
    ...                    workers=4, reconnect=True)
    >>> exit_code = host.run()   # blocks until the workers exit
    """

    def __init__(self, connect: str, spec: WorkerSpec, *, workers: int, relay: bool = True,
                 peer_timeout: float = 10.0, reconnect: bool = False,
                 curve_keys: str | None = None, backend: str = "asyncio") -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.connect = connect
        self.spec = spec
        self.relay = relay and workers > 1
        self.peer_timeout = peer_timeout
        self.reconnect = reconnect
        self.curve_keys = curve_keys
        self.backend = backend
        # Unguessable (128 random bits each): an identity is a route on the hub.
        tag = f"{socket.gethostname()}-{os.getpid()}"
        self.identities = [random_identity(f"{tag}-w{i}") for i in range(workers)]
        self.processes: list[Any] = []

    def run(self) -> int:
        """Start the workers, wait until they all exit; return the exit code that matters."""
        try:
            if self.relay:
                anyio.run(self._run_with_relay, backend=self.backend)
            else:
                # SIGTERM (docker stop, systemd, kill) stops the workers like Ctrl-C.
                signal.signal(signal.SIGTERM, _interrupt)
                self._start()
                for process in self.processes:
                    process.join()
        except KeyboardInterrupt:
            self.terminate()
        codes = [p.exitcode or 0 for p in self.processes]
        return max(codes, key=abs) if any(codes) else 0

    def terminate(self) -> None:
        """Stop the workers now (SIGTERM, then wait)."""
        for process in self.processes:
            if process.exitcode is None:
                process.terminate()
        for process in self.processes:
            process.join(10)

    def _start(self, relay: str | None = None, relay_name: bytes = b"") -> None:
        # Native pools (OpenMP, MKL, OpenBLAS) sized before the child imports torch;
        # the worker also calls torch.set_num_threads(spec.torch_threads).
        with child_thread_environment(self.spec.torch_threads):
            self._start_processes(relay, relay_name)

    def _start_processes(self, relay: str | None, relay_name: bytes) -> None:
        context = mp.get_context("spawn")
        for i, identity in enumerate(self.identities):
            options = {"peer_timeout": self.peer_timeout,
                       "heartbeat_interval": heartbeat_interval(self.peer_timeout),
                       "reconnect": self.reconnect, "curve_keys": self.curve_keys,
                       "identity": identity, "parent_pid": os.getpid(), "relay": relay,
                       "relay_name": relay_name}
            process = context.Process(target=_worker_main,
                                      args=(self.connect, self.spec, self.backend, options),
                                      name=f"asyncrl-worker-{i}")
            process.start()
            self.processes.append(process)

    async def _run_with_relay(self) -> None:
        from ._relay import HostRelay

        async with HostRelay(self.connect, self.identities, peer_timeout=self.peer_timeout,
                             heartbeat_interval=heartbeat_interval(self.peer_timeout),
                             curve_keys=self.curve_keys) as relay:
            self._start(relay.endpoint, relay.name)
            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._terminate_on_sigterm)
                    for process in self.processes:
                        await anyio.wait_readable(process.sentinel)  # readable once it exited
                    tg.cancel_scope.cancel()
            finally:
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(self._reap)

    async def _terminate_on_sigterm(self) -> None:
        # SIGTERM (docker stop, systemd, kill) stops the workers, then the relay closes
        # and removes its socket directory.
        with anyio.open_signal_receiver(signal.SIGTERM) as signals:
            async for _ in signals:
                log.info("SIGTERM: stopping this host's workers")
                for process in self.processes:
                    if process.exitcode is None:
                        process.terminate()
                return

    def _reap(self, timeout: float = 10.0) -> None:
        # The workers exit when told or when we die; terminate what is left.
        for process in self.processes:
            process.join(timeout)
            if process.exitcode is None:
                process.terminate()
                process.join(timeout)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _worker_main(endpoint: str, spec: WorkerSpec, backend: str, options: dict[str, Any]) -> None:
    from ._worker import run_worker

    logging.basicConfig(level=logging.INFO, format="%(asctime)s worker %(process)d: %(message)s")
    code = anyio.run(lambda: run_worker(endpoint, spec, **options), backend=backend)
    sys.exit(code)
