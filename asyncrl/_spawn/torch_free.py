"""Torch-free processes: the env workers of central inference import neither torch nor tensordict.

An env worker of :class:`~asyncrl.AsyncBatchedCollector` steps envs and moves numpy
arrays through shared memory and ZeroMQ; torch and tensordict would cost each of
them ~100 MB of their own. Such a process runs with ``ASYNCRL_TORCH_FREE=1``
(:mod:`transports._torch_free`): ``import asyncrl`` then imports none of the
public face (a public name asked for is imported then, torch with it), starts no
fork server, and ``import transports`` no tensordict.

Two ways in: a local env worker is forked from a fork server of its own, started
torch-free, not from multiprocessing's (forked at ``import asyncrl``, it holds torch),
with a main module that imports nothing of the user's (:func:`start_torch_free`); that
fork server imports what every env worker needs (asyncrl's env worker, numpy, ZeroMQ,
gymnasium, anyio, and the modules the envs are named from) once, frozen, so that its
children share it (:mod:`.torch_free_preload`), and multiprocessing's, unused then, is
stopped (:func:`.early.release_unused`). ``asyncrl worker --role env`` (the remote
command; ``asyncrl env-worker``, its alias) sets it for itself, here, before anything
imports transports.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Mapping, Sequence
from multiprocessing import forkserver, spawn
from multiprocessing.context import ForkServerProcess
from multiprocessing.process import BaseProcess

#: The variable (transports reads it at its import: one name for both packages).
VARIABLE = "ASYNCRL_TORCH_FREE"
#: Comma-separated modules the torch-free fork server imports for its children, read by
#: :mod:`.torch_free_preload` (never imported here: its import is the preload itself).
PRELOAD_VARIABLE = "ASYNCRL_TORCH_FREE_PRELOAD"
#: The ``asyncrl`` command that runs torch-free.
COMMAND = "env-worker"

__all__ = ["COMMAND", "MAIN_SCRIPT", "PRELOAD", "PRELOAD_VARIABLE", "VARIABLE", "start_torch_free",
           "torch_free_process"]


def torch_free_process() -> bool:
    """Whether this process is torch-free (``asyncrl env-worker`` makes itself one)."""
    if os.environ.get(VARIABLE) == "1":
        return True
    if _is_env_worker_command(getattr(sys, "orig_argv", [])):
        os.environ[VARIABLE] = "1"  # before transports is imported: it reads it then
        return True
    return False


def _is_env_worker_command(argv: list[str], environ: Mapping[str, str] | None = None) -> bool:
    """``asyncrl env-worker ...``, ``python -m asyncrl[.cli] env-worker ...``, and the same
    with ``worker ... --role env`` (or ``ASYNCRL_ROLE=env``, its variable).

    >>> _is_env_worker_command(["/venv/bin/python", "/venv/bin/asyncrl", "env-worker"])
    True
    >>> _is_env_worker_command(["python", "-m", "asyncrl", "env-worker", "--envs", "2"])
    True
    >>> _is_env_worker_command(["python", "-m", "asyncrl", "worker", "--connect", "env-worker"])
    False
    >>> _is_env_worker_command(["asyncrl", "worker", "--role", "env", "--envs-per-worker", "2"])
    True
    >>> _is_env_worker_command(["asyncrl", "worker", "--role=env"], {})
    True
    """
    environ = os.environ if environ is None else environ
    for i, arg in enumerate(argv[:-1]):
        if argv[i + 1] not in (COMMAND, "worker"):
            continue
        if os.path.basename(arg) == "asyncrl" or (
                arg in ("asyncrl", "asyncrl.cli") and argv[i - 1:i] == ["-m"]):
            return argv[i + 1] == COMMAND or _role_env(argv[i + 2:], environ)
    return False


def _role_env(options: list[str], environ: Mapping[str, str]) -> bool:
    """``--role env`` among ``asyncrl worker``'s options (else its variable says so)."""
    for k, option in enumerate(options):
        if option == "--role" and k + 1 < len(options):
            return options[k + 1] == "env"
        if option.startswith("--role="):
            return option == "--role=env"
    return bool(environ.get("ASYNCRL_ROLE") == "env")


#: The main module a torch-free child runs instead of the user's (it marks the process).
MAIN_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_free_main.py")
#: What the torch-free fork server imports once, for every env worker it forks (the
#: last: the envs' own modules, then a freeze, :mod:`.torch_free_preload`).
PRELOAD = ("asyncrl._inference.env_worker", "gymnasium", "anyio._backends._asyncio",
           "asyncrl._spawn.torch_free_preload")

_starting = threading.local()
_install_lock = threading.Lock()
_installed = False
# A second fork server beside multiprocessing's (which holds torch: .early), started
# torch-free on first use; its children share its pages (numpy, ZeroMQ, gymnasium).
_server = forkserver.ForkServer()
_server.set_forkserver_preload(list(PRELOAD))


def start_torch_free(process: BaseProcess, preload: Sequence[str] = ()) -> None:
    """``process.start()`` for a process of the ``forkserver`` (or ``spawn``) context,
    torch-free.

    The process is forked from a fork server of its own that runs with
    ``ASYNCRL_TORCH_FREE=1`` (started on first use) instead of multiprocessing's, and
    its main module is :data:`MAIN_SCRIPT`, not the user's (a script's ``import torch``
    would run again there). Only this thread's start is changed: other threads may
    start other processes meanwhile. What the child is given must therefore not come
    from the user's ``__main__`` (the caller checks: gym ids and import paths only).
    ``preload``: the modules the envs come from, imported by that fork server when it
    starts, once for all its children (:mod:`.torch_free_preload`).
    """
    _install()
    if isinstance(process, ForkServerProcess):  # (a spawned one needs no server)
        _ensure_server(preload)
    _starting.torch_free = True
    try:
        process.start()
    finally:
        _starting.torch_free = False


def _ensure_server(preload: Sequence[str]) -> None:
    from .threads import _environment, thread_environment  # (the trainer's side: torch)

    with _install_lock:
        if vars(_server).get("_forkserver_pid") is None:  # (multiprocessing's field)
            # Its environment is inherited when it starts (held briefly, under the lock
            # the other fork server's start takes too).
            with _environment({**thread_environment(1), VARIABLE: "1",
                               PRELOAD_VARIABLE: ",".join(preload)}):
                _server.ensure_running()
        else:
            _server.ensure_running()  # (starts another if it died)


def _install() -> None:
    # multiprocessing builds what a child prepares from (its main module among it) in
    # spawn.get_preparation_data, and reaches its one fork server through
    # forkserver.connect_to_new_process: both wrapped once, changed only for this
    # thread's start.
    global _installed
    with _install_lock:
        if _installed:
            return
        _installed = True
        original = spawn.get_preparation_data
        connect = forkserver.connect_to_new_process

        def preparation_data(name: str) -> dict[str, object]:
            data = original(name)
            if getattr(_starting, "torch_free", False):
                data.pop("init_main_from_name", None)
                data["init_main_from_path"] = MAIN_SCRIPT
            return data

        def connect_to_new_process(fds: Sequence[int]) -> tuple[int, int]:
            if getattr(_starting, "torch_free", False):
                return _server.connect_to_new_process(fds)
            return connect(fds)

        spawn.get_preparation_data = preparation_data
        forkserver.connect_to_new_process = connect_to_new_process
