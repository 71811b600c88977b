"""The fork server, started at ``import asyncrl``: warm while the trainer goes on.

A collector's workers are forked from multiprocessing's fork server, which imports
torch, tensordict, gymnasium and the worker's modules once. Started by the
collector's constructor, it began that import after the trainer had done its own:
the first batch came about one import of torch later than it could, and the fork
server and the trainer each held a copy of what they had imported. Started here
instead, it is forked from the trainer at the last statement of ``import asyncrl``:
it begins with everything asyncrl imported (torch, tensordict, asyncrl itself: pages
shared copy-on-write with the trainer, so neither pays for them twice, in time or
in memory), imports the rest of what workers need (gymnasium, the user's script as
``__mp_main__``, once for all workers) and freezes it for the garbage collector.

The fork is taken only while it is safe: no other Python thread in the trainer
(no lock held elsewhere; ZeroMQ's I/O threads and CUDA come later, with a
collector), only from module-level imports (never from a function: a running event
loop, a test runner), not in a process multiprocessing started (a ``spawn`` child imports
asyncrl again), not inside a fork server, not for asyncrl's own command line
(its hosts spawn their workers). ``ASYNCRL_EARLY_FORK_SERVER=0`` turns it off: the
collector's constructor then starts the fork server, as before. Nothing outlives
the trainer: the server exits when the trainer's end of its pipe closes, and at a
normal exit it is stopped and reaped once multiprocessing has ended its children.

A process whose workers all come from elsewhere does not keep it: the env workers of
central inference are forked from a torch-free fork server of their own
(:mod:`.torch_free`), and once the first of them starts while nothing has claimed this
one (a per-worker collector's workers, an inference process: :func:`claim`), it is
stopped (:func:`release_unused`): it held about 30 MB of its own (the pages the trainer
wrote since the fork, what it imported after). A per-worker collector opened later in
that process starts a fork server from its constructor, as with the variable off.
"""

from __future__ import annotations

import gc
import inspect
import logging
import os
import signal
import socket
import sys
import threading
import types
from contextlib import suppress
from multiprocessing import connection, forkserver, resource_tracker, spawn, util
from typing import Any

from .main_module import without_unavailable_main

log = logging.getLogger("asyncrl.collectors")

#: ``0`` (or ``false``, ``no``, ``off``): do not start the fork server at ``import asyncrl``.
ENV_VARIABLE = "ASYNCRL_EARLY_FORK_SERVER"

#: Imported once by the fork server, so that each worker starts warm (anyio's asyncio
#: backend: imported by anyio.run, else by each worker after its fork).
PRELOAD = ("torch", "tensordict", "gymnasium", "asyncrl._worker.worker", "asyncrl._rollout.envs",
           "asyncrl._worker.entry", "asyncrl._inference.env_worker", "anyio._backends._asyncio")

#: Set in the fork server's own environment to its pid: it imports asyncrl again.
_SERVER_MARK = "_ASYNCRL_FORK_SERVER_PID"

_started: tuple[int, int] | None = None  # (the trainer's pid, the fork server's pid)
_claimed = False  # something in this process starts its workers from the fork server
_claim_lock = threading.Lock()  # claim() against release_unused(), in starting threads


def preload_modules(state: dict[str, Any]) -> list[str]:
    """What a new fork server imports: what was asked for (``"__main__"`` by default) + ours.

    ``state`` is the fork server's fields (``vars(forkserver._forkserver)``).
    """
    wanted = list(state.get("_preload_modules", ["__main__"]))
    return wanted + [m for m in PRELOAD if m not in wanted]


def early_start_refused() -> str | None:
    """Why the fork server is not started at import, or None when it is."""
    if os.environ.get(ENV_VARIABLE, "1").strip().lower() in ("0", "false", "no", "off"):
        return f"{ENV_VARIABLE} is off"
    if sys.platform != "linux":
        return "not Linux"
    if sys.version_info >= (3, 13):  # its fork server authenticates clients: a key we do not set
        return "Python 3.13 or later (not yet supported)"
    if _in_multiprocessing_child() or os.environ.get(_SERVER_MARK) == str(os.getpid()):
        return "a process started by multiprocessing, or a fork server"
    if threading.active_count() > 1:
        return "other threads run (a fork would copy their locks)"
    if not _imported_by_modules():
        return "imported from a function (an event loop, a test runner: state a fork would copy)"
    if _is_asyncrl_command():
        return "asyncrl's own command line"
    if _state().get("_forkserver_pid") is not None:
        return "a fork server runs already"
    return None


def start_early_fork_server() -> bool:
    """Fork the fork server from this process now, if nothing speaks against it.

    Never raises: whatever fails leaves the fork server to the collector's constructor.
    """
    why_not = early_start_refused()
    if why_not is not None:
        log.debug("fork server not started at import: %s", why_not)
        return False
    try:
        _fork_server()
    except Exception as exc:  # an optimisation: the old path still works
        log.debug("fork server not started at import: %r", exc)
        return False
    return True


def claim() -> None:
    """Say that workers are to come from multiprocessing's fork server: it is kept."""
    global _claimed
    with _claim_lock:
        _claimed = True


def release_unused() -> bool:
    """Stop the fork server started at import if nothing claimed it (True: stopped).

    For a process whose workers come from the torch-free fork server only; the
    fork server is started again, from a collector's constructor, if one wants it later.
    """
    global _started
    with _claim_lock:
        if _claimed or _started is None or os.getpid() != _started[0]:
            return False
        _stop()
        _started = None
    log.debug("fork server started at import stopped: this process's workers are torch-free")
    return True


def _in_multiprocessing_child() -> bool:
    import multiprocessing

    return multiprocessing.parent_process() is not None or in_fork_server()


def in_fork_server() -> bool:
    """Whether this code runs in a fork server's preload (its ``main()`` is a caller)."""
    frame = inspect.currentframe()  # a fork server's preload imports asyncrl from its main()
    while frame is not None:
        if frame.f_code is forkserver.main.__code__:
            return True
        frame = frame.f_back
    return False


def _imported_by_modules() -> bool:
    # Only module-level code (scripts, modules importing modules, ``python -m``) above
    # this import: a function's frame would be copied half run into the fork server, with
    # what it holds (a running event loop: its workers would find one "already running").
    frame = inspect.currentframe()
    while frame is not None:
        code = frame.f_code
        if code.co_name != "<module>" and not code.co_filename.startswith(
                ("<frozen importlib", "<frozen runpy")):
            if frame.f_globals.get("__name__") != __name__:
                return False
        frame = frame.f_back
    return True


def _is_asyncrl_command() -> bool:
    main = sys.modules.get("__main__")
    name = getattr(getattr(main, "__spec__", None), "name", None) or ""
    argv0 = os.path.basename((getattr(sys, "argv", None) or [""])[0])
    # `python -m asyncrl.cli`: runpy imports the package before __main__ and argv are
    # set (argv[0] is still "-m" then), so the interpreter's own command line decides.
    orig = list(getattr(sys, "orig_argv", []))
    module = orig[orig.index("-m") + 1] if "-m" in orig[:-1] else ""
    return (argv0 == "asyncrl" or name == "asyncrl" or name.startswith("asyncrl.")
            or module == "asyncrl" or module.startswith("asyncrl."))


def _fork_server() -> None:
    global _started
    state = _state()
    # No lock is held across the fork (the server's own would stay locked in every
    # worker): there is no other thread to race with (early_start_refused).
    with without_unavailable_main():
        resource_tracker.ensure_running()  # before the fork: the server and workers share it
        preload = preload_modules(state)
        # The script the trainer runs, for the server to run once as its workers'
        # ``__mp_main__`` (each worker ran it again: multiprocessing's own fork server
        # asks for a "main_path" that get_preparation_data no longer gives).
        main_path = spawn.get_preparation_data("ignore").get("init_main_from_path")
        with socket.socket(socket.AF_UNIX) as listener:
            address = connection.arbitrary_address("AF_UNIX")  # type: ignore[attr-defined]
            listener.bind(address)
            if not address.startswith("\0"):  # a file, not Linux's abstract namespace
                os.chmod(address, 0o600)
            listener.listen()
            alive_r, alive_w = os.pipe()
            _flush_std_streams()  # else what the trainer buffered is printed twice
            pid = os.fork()
            if pid == 0:  # pragma: no cover -- the child never returns
                _serve(listener.fileno(), alive_r, alive_w, preload, main_path)
            os.close(alive_r)
        state.update(_preload_modules=preload, _forkserver_address=address,
                     _forkserver_alive_fd=alive_w, _forkserver_pid=pid)
    _started = (os.getpid(), pid)
    util.Finalize(None, _stop, exitpriority=-10)  # after multiprocessing joined its children
    log.debug("fork server %d forked at import", pid)


def _serve(listener_fd: int, alive_r: int, alive_w: int, preload: list[str],
           main_path: str | None) -> None:  # pragma: no cover -- runs in the fork server
    code = 0
    try:
        os.close(alive_w)
        os.environ[_SERVER_MARK] = str(os.getpid())  # never a fork server of its own
        from .threads import thread_environment  # (imports torch: this process needs it anyway)

        # As a spawned fork server is started (forkserver.py): what its workers start
        # reads one native thread; each worker sets torch's own count (num_sub_threads).
        os.environ.update(thread_environment(1))
        _forget_half_imported()
        for name in preload:  # (what forkserver.main would import, then frozen)
            if name != "__main__":
                with suppress(ImportError):
                    __import__(name)
        gc.freeze()  # workers' garbage collections leave the shared pages unwritten
        main_preload = [name for name in preload if name == "__main__"]
        forkserver.main(listener_fd, alive_r, main_preload, main_path=main_path)
    except SystemExit:
        pass
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        os._exit(code)  # never the trainer's atexit hooks, never back into its script


def _forget_half_imported() -> None:  # pragma: no cover -- runs in the fork server
    # Become a fresh process's equal. asyncrl was forked at the last statement of its
    # __init__ (every submodule whole): it is marked imported (else an import of it from
    # another thread would wait for the module lock this thread holds forever here), and
    # its modules' pages stay shared with the trainer. Other modules being imported then
    # (a module of the user's that imports asyncrl) would stay half done here forever:
    # they are imported again, whole, when needed. The trainer's script (half run) is
    # replaced: forkserver.main runs it again, whole, as ``__mp_main__``.
    spec = getattr(sys.modules.get("asyncrl"), "__spec__", None)
    if getattr(spec, "_initializing", False):
        spec._initializing = False  # type: ignore[union-attr]  # noqa: SLF001 -- importlib's flag
    for name, module in list(sys.modules.items()):
        if getattr(getattr(module, "__spec__", None), "_initializing", False):
            del sys.modules[name]
    sys.modules["__main__"] = types.ModuleType("__main__")


def _stop() -> None:
    # At the trainer's exit, once multiprocessing ended its own children: the server
    # serves no one; it may still be importing (a short script), so it is not waited for.
    if _started is None or os.getpid() != _started[0]:
        return
    state = _state()
    if state.get("_forkserver_pid") != _started[1]:
        return  # replaced since (it died, or its socket was removed)
    with suppress(ProcessLookupError):
        os.kill(_started[1], signal.SIGKILL)
    with suppress(OSError):  # as ForkServer._stop: close our end, reap it, unlink the socket
        os.close(state["_forkserver_alive_fd"])
        os.waitpid(_started[1], 0)
        address = state["_forkserver_address"]
        if isinstance(address, str) and not address.startswith("\0"):
            os.unlink(address)
    _forget(state)


def _forget_in_child() -> None:
    # A process forked from the trainer (os.fork, the "fork" start method) is not the
    # server's parent: multiprocessing would waitpid() it and fail. It starts its own.
    global _started
    if _started is None or os.getpid() == _started[0]:
        return
    state = _state()
    if state.get("_forkserver_pid") == _started[1]:
        with suppress(OSError):
            os.close(state["_forkserver_alive_fd"])
        _forget(state)
    _started = None


def _state() -> dict[str, Any]:
    # multiprocessing's one fork server, whose fields say where it runs: the only
    # reach into its private state (read and set as ForkServer.ensure_running does).
    return vars(forkserver._forkserver)  # noqa: SLF001


def _forget(state: dict[str, Any]) -> None:
    state.update(_forkserver_alive_fd=None, _forkserver_address=None, _forkserver_pid=None)


def _flush_std_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        with suppress(AttributeError, ValueError, OSError):
            stream.flush()


os.register_at_fork(after_in_child=_forget_in_child)

__all__ = ["ENV_VARIABLE", "PRELOAD", "claim", "early_start_refused", "in_fork_server",
           "preload_modules",
           "release_unused", "start_early_fork_server"]
