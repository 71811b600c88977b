"""A child process's side: its parent's death, its own children, its exit.

Every process asyncrl starts (a collector's worker, a host's worker, an env
worker, the inference process) must not outlive the process that started it,
even one SIGKILLed without a goodbye: it watches its parent
(:func:`wait_parent_gone`), removes what a parent killed without a chance to
clean up left behind (:func:`remove_orphaned_dir`), and ends with
:func:`exit_process`.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import shutil
import sys
import tempfile

import anyio

from transports import shutdown as flush_and_close_sockets

__all__ = ["allow_children", "ending_error", "exit_process", "process_alive",
           "remove_orphaned_dir", "remove_orphaned_socket_dir", "wait_parent_gone"]


def allow_children() -> None:
    """Let this (daemonic) worker start processes of its own, e.g. a TorchRL ``ParallelEnv``.

    The parent keeps its ``daemon=True`` process object: at the trainer's exit
    multiprocessing terminates such workers instead of joining them (a worker
    whose trainer forgot ``aclose()`` would otherwise hold the exit until it
    gives up on the coordinator). Only this process's view changes, which is
    what multiprocessing checks before a start ("daemonic processes are not
    allowed to have children"). Its children do not outlive it for long: the
    worker closes its envs on every exit path but SIGKILL, and TorchRL's env
    workers exit when their pipe to it closes.
    """
    current = multiprocessing.current_process()
    if current.daemon:
        current.daemon = False


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (and is not a zombie waiting to be reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True  # no /proc: kill(0) is all we can know


def remove_orphaned_socket_dir(endpoint: str) -> None:
    """Remove the private ``ipc://`` directory of a parent that died without cleaning up.

    Collectors and relays bind in ``<tmp>/asyncrl-*`` and remove it when they close;
    a SIGKILLed one cannot, so its children do once they see it gone.
    """
    if endpoint.startswith("ipc://"):
        remove_orphaned_dir(os.path.dirname(endpoint[len("ipc://"):]))


def remove_orphaned_dir(directory: str) -> None:
    """Remove ``directory`` if it is one of ours (``<tmp>/asyncrl-*``), else nothing."""
    if os.path.dirname(directory) == tempfile.gettempdir() \
            and os.path.basename(directory).startswith("asyncrl-"):
        shutil.rmtree(directory, ignore_errors=True)


async def wait_parent_gone(pid: int) -> None:
    """Return once process ``pid`` has exited: at once through a pidfd, else by polling."""
    try:
        fd = os.pidfd_open(pid)  # readable when the process exits
    except (AttributeError, OSError):
        fd = None
    if fd is None:  # no pidfd (old kernel, or it is gone already): look now and then
        while process_alive(pid):  # noqa: ASYNC110
            await anyio.sleep(0.5)
        return
    try:
        await anyio.wait_readable(fd)
    finally:
        os.close(fd)


def ending_error(error: BaseException) -> BaseException:
    """The error that ended a process's main: the first one inside task groups' groups.

    A process reports (and picks its exit code from) the error itself, not the
    ``ExceptionGroup`` that the task group around its main wrapped it in.

    >>> ending_error(ExceptionGroup("tg", [ExceptionGroup("inner", [KeyError("obs")])]))
    KeyError('obs')
    """
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    return error


def exit_process(code: int) -> None:
    """End a child process: flush its sockets, logs and output, then exit with ``code``.

    Everything is closed by then; skipping the interpreter's teardown (torch,
    atexit hooks) makes shutdown take milliseconds instead of seconds on a busy
    machine.
    """
    flush_and_close_sockets()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
