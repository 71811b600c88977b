"""Worker processes seen from their parent: start them, watch them end, stop them.

One launcher for both places that run workers in child processes: a
``MultiCollector``'s local workers (forked from the warm fork server, respawned
with ``on_worker_loss="restart"``) and a worker host's (``asyncrl worker
--workers K``: spawned, their native thread pools sized as they start). What
each kind of child is given and runs is in :mod:`asyncrl._worker.entry`; how a
process is started (fork server or spawn) in :mod:`.forkserver`; the child's side
(its parent's death, its own exit) in :mod:`.child`.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from multiprocessing import connection
from multiprocessing.process import BaseProcess
from typing import Any

import anyio

from .early import claim, release_unused
from .forkserver import worker_context
from .main_module import without_unavailable_main
from .threads import child_thread_environment
from .torch_free import start_torch_free

log = logging.getLogger("asyncrl.collectors")

#: ``args(slot, identity)``: the target's arguments for a new process of ``slot``
#: (called in the starting thread: it may block, e.g. to write a file once).
ArgsFor = Callable[[int, bytes], tuple[Any, ...]]

#: ``on_exit(slot, process)`` for a process that ended (reaped: ``exitcode`` is real);
#: returns True to have the slot respawned.
OnExit = Callable[[int, BaseProcess], Awaitable[bool]]


class WorkerProcesses:
    """``count`` worker processes, one per slot, each running ``target(*args(slot, identity))``.

    Processes are started in threads, in parallel, so the event loop keeps
    answering heartbeats and hellos while they start. Each one's link identity
    is chosen here (``identity(slot)``), not in the child: a death seen on the
    process sentinel maps to its peer on the hub. ``threads`` sizes the native
    pools of a spawned child (set in the environment while it starts; a forked
    one inherits the fork server's single thread). ``torch_free``: each child is
    forked from a fork server without torch or tensordict (:mod:`.torch_free`), which
    imports the modules in ``preload`` once for all of them when it starts.

    >>> workers = WorkerProcesses(2, main, lambda slot, ident: (slot,),  # doctest: +SKIP
    ...                           identity=lambda slot: random_identity(f"w{slot}"))
    >>> async with anyio.create_task_group() as tg:
    ...     await tg.start(workers.run)    # started; watched until every one ended
    >>> await workers.stop()               # SIGTERM, then SIGKILL, what is left
    """

    def __init__(self, count: int, target: Callable[..., None], args: ArgsFor, *,
                 identity: Callable[[int], bytes], start_method: str = "forkserver",
                 threads: int | None = None, daemon: bool = True,
                 name: str = "asyncrl-worker", torch_free: bool = False,
                 preload: Sequence[str] = ()) -> None:
        self.count = count
        # A torch-free child comes from a fork server of its own (.torch_free)
        self.torch_free = torch_free
        self.preload = tuple(preload)
        if not torch_free and start_method == "forkserver":
            claim()  # (before a torch-free start could stop it: .early)
        self.start_method = "forkserver" if torch_free else start_method
        self.threads = threads
        self.slots: dict[int, BaseProcess] = {}  # the current process of each slot
        self.processes: list[BaseProcess] = []  # every process ever started, for stop()
        self.identities: dict[BaseProcess, bytes] = {}  # each process's link identity
        self._target = target
        self._args = args
        self._identity = identity
        self._daemon = daemon
        self._name = name
        self._lock = threading.Lock()  # between starting threads and stop()
        self._stopping = False

    @property
    def pids(self) -> list[int]:
        """Process ids of the live process of each slot, in slot order."""
        return [p.pid for _, p in sorted(self.slots.items())
                if p.pid is not None and p.is_alive()]

    @property
    def exitcodes(self) -> list[int | None]:
        """The exit code of every process started (None: still running), in start order."""
        return [p.exitcode for p in self.processes]

    async def run(self, on_exit: OnExit | None = None, *,
                  task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Start every slot (reported started once all are), then watch until all ended.

        A slot whose process ended is started again when ``on_exit`` returns True.
        """
        async with anyio.create_task_group() as spawning:
            for slot in range(self.count):
                spawning.start_soon(self.spawn, slot)
        task_status.started()
        async with anyio.create_task_group() as tg:
            for slot in sorted(self.slots):
                tg.start_soon(self._watch_slot, slot, on_exit)

    async def spawn(self, slot: int) -> bool:
        """Start a process for ``slot`` (in a thread: ``start()`` may take a while).

        False once :meth:`stop` began: nothing is started then.
        """
        return await anyio.to_thread.run_sync(self._start, slot)

    def _start(self, slot: int) -> bool:
        if self._stopping:
            return False
        identity = self._identity(slot)
        args = self._args(slot, identity)
        method = self.start_method
        while True:
            # (may start the fork server, not in _environment; a torch-free start does not
            # need multiprocessing's: its own is started by start_torch_free)
            context = mp.get_context(method) if self.torch_free else worker_context(method)
            process = context.Process(  # type: ignore[attr-defined]
                target=self._target, args=args, name=f"{self._name}-{slot}",
                daemon=self._daemon)
            try:
                if self.torch_free:
                    release_unused()  # (the fork server forked at import: unused here)
                    start_torch_free(process, self.preload)
                else:
                    with self._environment(), without_unavailable_main():
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
        with self._lock:
            self.processes.append(process)
            self.identities[process] = identity
            self.slots[slot] = process
            if self._stopping:  # stop() began while it started, and may not have seen it
                process.terminate()
        return True

    def _environment(self) -> AbstractContextManager[None]:
        # Native pools (OpenMP, MKL, OpenBLAS) are sized before the child imports torch.
        if self.threads is None:
            return nullcontext()
        return child_thread_environment(self.threads)

    async def _watch_slot(self, slot: int, on_exit: OnExit | None) -> None:
        while True:
            process = self.slots[slot]
            await anyio.wait_readable(process.sentinel)
            # The sentinel fires as the child exits, maybe before it can be reaped:
            # join() (in a thread: it blocks until then) gives the real exit status.
            await anyio.to_thread.run_sync(process.join)
            if on_exit is None or not await on_exit(slot, process):
                return
            with self._lock:  # stop() releases it if it began (it may be waiting on it)
                if not self._stopping:
                    release(process)
            if not await self.spawn(slot):
                return

    async def stop(self, grace: float = 3.0, *, kill_after: float = 1.0) -> None:
        """Wait up to ``grace`` s for the processes to exit, SIGTERM them, SIGKILL after
        ``kill_after`` s more.

        Bounded (``grace + kill_after + 1`` s at most) and shielded: a cancelled
        caller still leaves no process behind. Respawns stop once it began.
        """
        with self._lock:
            self._stopping = True
        with anyio.CancelScope(shield=True):
            for step, timeout in (("wait", grace), ("terminate", kill_after), ("kill", 1.0)):
                alive = [p for p in self.processes if p.is_alive()]
                if not alive:
                    break
                for p in alive:
                    if step == "terminate":
                        p.terminate()
                    elif step == "kill":
                        p.kill()
                await anyio.to_thread.run_sync(_wait_ended, alive, timeout)
        for p in self.processes:
            p.join(0.1)  # reaps them (each has ended by now, unless stuck in the kernel)
            if p.exitcode:
                log.debug("worker %s exited with %s", p.pid, p.exitcode)
            release(p)


def release(process: BaseProcess) -> None:
    """Close the pipes the parent holds for a reaped process; a live one is left as is.

    A started process holds two descriptors in its parent (its sentinel and, for the
    fork server, the pipe whose closing tells the child its parent died) until its
    ``Popen`` is finalized: by ``Process.close()``, or by the garbage collector,
    late or (``gc.disable()``, ``gc.freeze()``) never. ``Process.close()`` also
    makes ``pid``, ``exitcode`` and ``is_alive()`` raise, and ``statistics()``,
    ``worker_pids`` and a host's exit status read them after the workers stopped:
    this closes only what ``close()`` would, the ``Popen``'s finalizer (idempotent),
    and keeps the exit status it already read. Safe to call twice.
    """
    if process.exitcode is None:  # not started, or not reaped yet: its pipes are in use
        return
    popen = getattr(process, "_popen", None)
    if popen is not None:
        popen.close()


def _wait_ended(processes: Sequence[BaseProcess], timeout: float) -> None:
    # In a thread, not with anyio.wait_readable: a watcher task may be waiting on the
    # same sentinel, and trio allows one waiter per file descriptor.
    pending = [p.sentinel for p in processes]
    deadline = time.monotonic() + timeout
    while pending and (left := deadline - time.monotonic()) > 0:
        ended = connection.wait(pending, left)
        pending = [s for s in pending if s not in ended]


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


# -- the child's side ------------------------------------------------------------------------
__all__ = ["ArgsFor", "OnExit", "WorkerProcesses", "describe_exit", "release"]
