"""Threads per process: how many each one runs, so that none oversubscribes the cores.

Three places set a count, TorchRL's meaning for each:

- the trainer caps its own torch threads while local workers share its cores
  (``num_threads``, :class:`TrainerThreads`);
- a worker process starts with its native pools (OpenMP, MKL, OpenBLAS) sized
  before it imports torch (:func:`child_thread_environment`);
- each thread of a worker that runs torch sets the worker's count itself
  (``num_sub_threads``, :func:`use_torch_threads`).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

import torch

log = logging.getLogger("asyncrl.collectors")

#: The variables that size native thread pools when a library loads.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                    "NUMEXPR_NUM_THREADS", "VECLIB_MAXIMUM_THREADS")

_env_lock = threading.Lock()
_thread_state = threading.local()


class TrainerThreads:
    """Caps ``torch``'s intra-op threads in the trainer's process; ``restore()`` undoes it.

    Without a cap, a trainer running torch on every core and N local workers on
    the same cores oversubscribe them: OpenMP threads spin while waiting, and a
    policy forward or an optimiser step takes many times longer.

    >>> cap = TrainerThreads.cap(None, local_workers=2)   # doctest: +SKIP
    >>> cap.restore()                                      # doctest: +SKIP
    """

    def __init__(self, before: int, now: int) -> None:
        self.before = before
        self.now = now
        self._restored = False

    @classmethod
    def cap(cls, num_threads: int | None, local_workers: int) -> TrainerThreads:
        """Set ``num_threads`` (None: current threads minus ``local_workers``, at least 1)."""
        before = torch.get_num_threads()
        now = max(1, before - local_workers) if num_threads is None else num_threads
        if now != before:
            torch.set_num_threads(now)
            log.debug("trainer torch threads: %d -> %d (%d local workers)",
                      before, now, local_workers)
        return cls(before, now)

    def restore(self) -> None:
        """Put back the count from before ``cap``, unless someone changed it since (idempotent)."""
        if self._restored:
            return
        self._restored = True
        if torch.get_num_threads() == self.now and self.now != self.before:
            torch.set_num_threads(self.before)


def thread_environment(threads: int) -> dict[str, str]:
    """The native-pool variables for ``threads`` threads (a user's own values win)."""
    return {name: os.environ.get(name, str(threads)) for name in THREAD_VARIABLES}


def child_thread_environment(threads: int) -> AbstractContextManager[None]:
    """While open, processes started inherit ``threads`` native threads per pool.

    Not reentrant (one lock guards the process environment): start processes
    inside it, never open it again from there.
    """
    return _environment(thread_environment(threads))


@contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    # A child inherits the environment it is started with; there is no per-process
    # environment in multiprocessing. Held briefly, under a lock.
    with _env_lock:
        saved = {name: os.environ.get(name) for name in values}
        os.environ.update(values)
        try:
            yield
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


def use_torch_threads(count: int) -> None:
    """Run torch ops of the calling thread on ``count`` intra-op threads.

    OpenMP keeps the count per thread: a pool thread that ran torch before
    ``torch.set_num_threads`` was called elsewhere keeps its old count (every
    core), and a 256-wide MLP forward then took 10-80x longer on a busy machine.
    """
    if getattr(_thread_state, "torch_threads", None) != count:
        torch.set_num_threads(count)
        _thread_state.torch_threads = count


__all__ = ["THREAD_VARIABLES", "TrainerThreads", "child_thread_environment",
           "thread_environment", "use_torch_threads"]
