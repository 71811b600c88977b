"""How worker processes are started: forked from a warm server, or spawned.

Spawning a fresh interpreter per worker costs an import of torch, tensordict and
gymnasium each (seconds, and N of them at once on a small machine). The default
``"forkserver"`` start method pays that once: Python's fork server imports them
(and the user's ``__main__``) a single time, then forks each worker from that
warm, single-threaded process. Forking the trainer itself would be faster still,
but is unsafe once it runs ZeroMQ's I/O threads, maybe CUDA and OpenMP pools: it
is forked only at ``import asyncrl``, before any of them (:mod:`.early`), and that
fork server is used when it runs.

The fork server is started with one thread for OpenMP, MKL and OpenBLAS (set in
its environment, before it imports anything), so that no worker starts with a
pool sized for the whole machine; each worker then sets its own count
(``num_sub_threads``, TorchRL's meaning) with ``torch.set_num_threads``.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
from contextlib import suppress
from multiprocessing import forkserver
from multiprocessing.context import BaseContext

from .early import PRELOAD, claim, preload_modules
from .main_module import without_unavailable_main
from .threads import child_thread_environment

log = logging.getLogger("asyncrl.collectors")


START_METHODS = ("forkserver", "spawn")


def check_start_method(start_method: str | None) -> str:
    """``None`` -> ``"forkserver"``; ``"fork"`` and unknown methods are refused."""
    if start_method is None:
        return "forkserver"
    if start_method == "fork":
        raise ValueError("start_method='fork' is not supported: the trainer runs ZeroMQ I/O "
                         "threads (and maybe CUDA), which a forked child inherits broken; use "
                         "'forkserver' (the default: as fast after the first start) or 'spawn'")
    if start_method not in START_METHODS:
        raise ValueError(f"start_method must be one of {START_METHODS}, got {start_method!r}")
    return start_method


def worker_context(start_method: str) -> BaseContext:
    """The multiprocessing context that starts workers (warm for forkserver).

    Blocking (the fork server may have to start): call it in a thread.
    """
    context = mp.get_context(start_method)
    if start_method == "forkserver":
        claim()  # (kept from now on: .early)
        with without_unavailable_main():  # a script read from stdin: not preloaded
            _ensure_fork_server(context)
    return context


def _ensure_fork_server(context: BaseContext) -> None:
    server = forkserver._forkserver  # one per process, shared with other users of it
    address = getattr(server, "_forkserver_address", None)
    if isinstance(address, str) and not address.startswith("\0") and not os.path.exists(address):
        # Its socket lived in a temporary directory that was removed since (a
        # per-test TMPDIR, a tmp cleaner): nothing can reach it. Start another.
        log.warning("the fork server's socket %s is gone; starting a new fork server", address)
        _forget_removed_temp_dir()
        with suppress(OSError):  # it unlinks the socket that is already gone
            server._stop()  # type: ignore[attr-defined]
    if getattr(server, "_forkserver_pid", None) is None:
        # Not running yet: add our modules to whatever preload was asked for
        # (``"__main__"`` by default, so that the user's functions resolve warm).
        context.set_forkserver_preload(preload_modules(vars(server)))
        with child_thread_environment(1):  # only while one starts: it inherits it
            forkserver.ensure_running()
    else:
        # (restarts it if it died, without the thread variables: each worker still
        # sets its own torch thread count)
        forkserver.ensure_running()


def _forget_removed_temp_dir() -> None:
    # multiprocessing keeps its temporary directory for the whole process; a new
    # fork server's socket must not be put in one that no longer exists.
    config = mp.current_process()._config  # type: ignore[attr-defined]
    tempdir = config.get("tempdir")
    if tempdir and not os.path.isdir(tempdir):
        del config["tempdir"]


__all__ = ["PRELOAD", "START_METHODS", "check_start_method", "worker_context"]
