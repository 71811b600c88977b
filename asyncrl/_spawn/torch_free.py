"""Torch-free processes: the env workers of central inference import neither torch nor tensordict.

An env worker of :class:`~asyncrl.AsyncBatchedCollector` steps envs and moves numpy
arrays through shared memory and ZeroMQ; torch and tensordict would cost each of
them ~100 MB of their own. Such a process runs with ``ASYNCRL_TORCH_FREE=1``
(:mod:`transports._torch_free`): ``import asyncrl`` then imports none of the
public face (a public name asked for is imported then, torch with it), starts no
fork server, and ``import transports`` no tensordict.

Two ways in: a local env worker is spawned (a fresh interpreter, not forked from a
process holding torch) with the variable set while it starts
(:func:`torch_free_children`); ``asyncrl env-worker`` (the remote command) sets it
for itself, here, before anything imports transports.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

#: The variable (transports reads it at its import: one name for both packages).
VARIABLE = "ASYNCRL_TORCH_FREE"
#: The ``asyncrl`` command that runs torch-free.
COMMAND = "env-worker"

__all__ = ["COMMAND", "VARIABLE", "torch_free_children", "torch_free_process"]


def torch_free_process() -> bool:
    """Whether this process is torch-free (``asyncrl env-worker`` makes itself one)."""
    if os.environ.get(VARIABLE) == "1":
        return True
    if _is_env_worker_command(getattr(sys, "orig_argv", [])):
        os.environ[VARIABLE] = "1"  # before transports is imported: it reads it then
        return True
    return False


def _is_env_worker_command(argv: list[str]) -> bool:
    """``asyncrl env-worker ...`` or ``python -m asyncrl env-worker ...``.

    >>> _is_env_worker_command(["/venv/bin/python", "/venv/bin/asyncrl", "env-worker"])
    True
    >>> _is_env_worker_command(["python", "-m", "asyncrl", "env-worker", "--envs", "2"])
    True
    >>> _is_env_worker_command(["python", "-m", "asyncrl", "worker", "--connect", "env-worker"])
    False
    """
    for i, arg in enumerate(argv[:-1]):
        if argv[i + 1] != COMMAND:
            continue
        if os.path.basename(arg) == "asyncrl" or (arg == "asyncrl" and argv[i - 1:i] == ["-m"]):
            return True
    return False


@contextmanager
def torch_free_children() -> Iterator[None]:
    """While it lasts, processes started by this one are torch-free (spawn them: a fork
    inherits whatever this process imported)."""
    before = os.environ.get(VARIABLE)
    os.environ[VARIABLE] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(VARIABLE, None)
        else:
            os.environ[VARIABLE] = before
