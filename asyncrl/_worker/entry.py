"""The two kinds of worker process, both sides of each: what the parent passes, what runs.

- A collector's local worker: :func:`local_worker_processes` in the trainer,
  :func:`process_main` in the child. Its :class:`WorkerSpec` (which holds the
  policy) goes through a 0600 file in the collector's private directory.
- A worker host's worker (``asyncrl worker --workers K``):
  :func:`host_worker_processes` in the host, :func:`host_process_main` in the
  child. Its spec holds import paths only, and goes with the arguments.

Each pair is written side by side because the argument tuple is their contract.
Both children run :func:`asyncrl._worker.worker.run_worker` and exit with its code.
"""

from __future__ import annotations

import gc
import logging
import os
import pickle
import sys
import threading
from typing import Any

import anyio

from transports import random_identity

from .._spawn import logs as _logs
from .._spawn.absent_modules import remember_absent_modules
from .._spawn.child import allow_children, exit_process, process_alive, remove_orphaned_dir
from .._spawn.malloc import return_large_buffers
from .._spawn.processes import WorkerProcesses
from .log_forward import forward_logs
from .spec import WorkerSpec
from .worker import run_worker


# -- a collector's local workers ------------------------------------------------------------
def local_worker_processes(endpoint: str, spec: WorkerSpec | list[WorkerSpec], count: int, *,
                           token: str,
                           backend: str, options: dict[str, Any], directory: str,
                           start_method: str = "forkserver") -> WorkerProcesses:
    """``count`` local workers of the collector at ``endpoint`` (not started yet).

    ``directory`` is the collector's private one (mkdtemp, 0700, removed by the
    collector); the spec file is written there as the first worker starts. ``spec``
    may be a list, one per slot (per-worker env factories): one file holds them all,
    so a policy they share is pickled once.
    """
    spec_file = _SpecFile(os.path.join(directory, "worker-spec.pickle"), spec)
    parent_pid = os.getpid()

    def args(slot: int, identity: bytes) -> tuple[Any, ...]:
        return (endpoint, spec_file.path(), slot, identity, token, backend, parent_pid,
                options)

    # A fresh identity per process: a respawned slot is a new peer to the coordinator.
    return WorkerProcesses(count, process_main, args,
                           identity=lambda slot: random_identity(f"local-{slot}"),
                           start_method=start_method)


class _SpecFile:
    """The spec, pickled once into a file that every local worker process reads.

    Not sent through the spawn pipe: a spec larger than the pipe buffer made
    ``Process.start()`` block until the child had imported torch.
    """

    def __init__(self, path: str, spec: WorkerSpec | list[WorkerSpec]) -> None:
        self._path = path
        self._spec = spec
        self._lock = threading.Lock()  # workers start in parallel threads
        self._written = False

    def path(self) -> str:
        """The file's path, once written (blocking: call it in a thread)."""
        with self._lock:
            if not self._written:
                self._write()
                self._written = True
        return self._path

    def _write(self) -> None:
        # Plain pickle, not multiprocessing's: torch's multiprocessing reductions would
        # put the policy's tensors in memory shared with the trainer, and every
        # optimiser step would silently change the workers' weights (no version,
        # no ack). The workers get a copy; updates go through the weight channels.
        fd = os.open(self._path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            pickle.dump(self._spec, f, protocol=pickle.HIGHEST_PROTOCOL)


def process_main(endpoint: str, spec_path: str, slot: int, identity: bytes, token: str,
                 backend: str, parent_pid: int, options: dict[str, Any]) -> None:
    """Entry point of a collector's local worker process.

    ``spec_path`` is a file (0600, in the collector's private directory) holding a
    plain pickle of the :class:`WorkerSpec` made by our own parent process (never
    data from the network). ``identity`` is the link identity the parent chose
    (unguessable, see :func:`transports.random_identity`): it maps this process's
    death to its peer. ``options["log_config"]`` is the trainer's logging
    (:func:`asyncrl._spawn.logs.capture`): this worker logs with the same level and format.
    Its records go to the trainer's ``asyncrl.worker`` logger (see
    :mod:`asyncrl._worker.log_forward`); those never sent are written to stderr at exit.
    """
    options = dict(options)
    _logs.apply(options.pop("log_config", None))
    stderr = logging.getLogger().handlers[0]  # apply()'s: the fallback
    forwarder, _ = forward_logs(stderr)
    remember_absent_modules()  # a per-step import probe of tensordict's, answered at once
    return_large_buffers()  # batch-sized buffers go back to the system when freed
    with open(spec_path, "rb") as f:
        spec = pickle.load(f)
    if isinstance(spec, list):  # one per slot (per-worker env factories)
        spec = spec[slot]
    allow_children()
    code = anyio.run(
        lambda: run_worker(endpoint, spec, identity=identity, slot=slot, token=token,
                           parent_pid=parent_pid, handle_signals=True,
                           log_forwarder=forwarder, **options),
        backend=backend,
    )
    forwarder.write_undelivered(stderr)
    # (The trainer is not our parent when a fork server started us: ask for it by pid.)
    if not process_alive(parent_pid):  # the trainer died without cleaning up its directory
        remove_orphaned_dir(os.path.dirname(spec_path))
    exit_process(code)


# -- a worker host's workers ----------------------------------------------------------------
def host_worker_processes(endpoint: str, spec: WorkerSpec, identities: list[bytes], *,
                          backend: str, options: dict[str, Any]) -> WorkerProcesses:
    """One worker per identity, spawned, for the coordinator at ``endpoint`` (not started).

    ``options`` go to :func:`asyncrl._worker.worker.run_worker`. The identities are the
    host's relay members, so they are chosen before any worker starts.
    """
    parent_pid = os.getpid()

    def args(slot: int, identity: bytes) -> tuple[Any, ...]:
        return (endpoint, spec, backend,
                {**options, "identity": identity, "parent_pid": parent_pid})

    # Spawned: each a fresh interpreter and a child of the host itself. Not daemonic:
    # a worker's envs may start processes of their own. Native pools get the worker's
    # torch threads; the worker also calls torch.set_num_threads(spec.torch_threads).
    return WorkerProcesses(len(identities), host_process_main, args,
                           identity=identities.__getitem__, start_method="spawn",
                           threads=spec.torch_threads, daemon=False)


def host_process_main(endpoint: str, spec: WorkerSpec, backend: str,
                      options: dict[str, Any]) -> None:
    """Entry point of a worker host's worker process (logging as the host's ``--log-level``).

    It logs to the host's stderr, to ``options["log_file"]`` if given (``--log-file``),
    and, unless ``options["forward_logs"]`` is False, to the trainer's
    ``asyncrl.worker`` logger too (see :mod:`asyncrl._worker.log_forward`).
    """
    options = dict(options)
    _logs.apply(options.pop("log_config", None)
                or {"level": logging.INFO, "format": "%(asctime)s worker %(process)d: %(message)s"})
    log_file = options.pop("log_file", None)
    if log_file is not None:
        _logs.add_file(log_file)
    if options.pop("forward_logs", True):
        options["log_forwarder"], _ = forward_logs(None)  # stderr keeps its copy
    remember_absent_modules()  # a per-step import probe of tensordict's, answered at once
    return_large_buffers()  # batch-sized buffers go back to the system when freed
    code = anyio.run(lambda: run_worker(endpoint, spec, handle_signals=True, **options),
                     backend=backend)
    # A normal exit: multiprocessing joins what this (non-daemonic) worker started. The
    # interpreter's last collection walks every object torch and the envs made: seconds
    # on a loaded machine, past the host's STOP_TIMEOUT after a SIGTERM (it was seen
    # there, in gc_collect_main). Frozen, they are left to the process's end.
    gc.freeze()
    sys.exit(code)


__all__ = ["host_process_main", "host_worker_processes",
           "local_worker_processes", "process_main"]
