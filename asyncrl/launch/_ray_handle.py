"""What :func:`~asyncrl.launch.ray.launch_workers` and ``launch_hosts`` return.

A :class:`RayWorkers` owns its actors: closing it (``close()``, ``with``,
``async with``) ends every one of them and waits, bounded, until their
processes are gone, so that nothing holds the cluster's CPUs after the run
(a Ray actor otherwise lives until the driver exits). :meth:`RayWorkers.wait`
reports every actor's outcome, a dead one included, instead of raising on the
first. :meth:`RayWorkers.scale` starts more: hosts on nodes that joined the
cluster since, or more workers.

Ray's own state (which node, which process, how many restarts) is read from
its GCS through ``ray._private.state``: the public state API needs the
dashboard, which a trainer's ``ray.init(include_dashboard=False)`` lacks. Every
read is guarded: without it, ``close()`` still kills, and waits only for what
Ray reports.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import ray

log = logging.getLogger("asyncrl.launch")

#: How often ``close()`` looks at the actors while it waits for them to end.
POLL_INTERVAL = 0.05


@dataclass(frozen=True)
class ActorOutcome:
    """How one launched actor ended (or that it has not yet), from :meth:`RayWorkers.wait`.

    ``exit_code`` is what its worker (or host) returned: 0 closed by the
    collector, 1 an env or policy error, 3 the coordinator gone, 4 refused (see
    ``asyncrl worker --help``); None when it returned none: ``error`` then says
    why (still running, or the actor died for good, with Ray's reason).
    ``restarts`` counts the times Ray restarted it (``max_restarts``).
    """

    index: int
    node: str
    exit_code: int | None
    error: str = ""
    restarts: int = 0

    @property
    def finished(self) -> bool:
        """It returned an exit code (whatever the code)."""
        return self.exit_code is not None

    @property
    def running(self) -> bool:
        return self.exit_code is None and self.error.startswith("still running")


@dataclass
class RayWorkers:
    """Handles of launched actors: wait for them, close them, start more.

    >>> with launch_workers(endpoint, num_workers=8,                  # doctest: +SKIP
    ...                     env="CartPole-v1") as workers:
    ...     ...                                  # the collector runs (elsewhere, or here)
    ...     outcomes = workers.wait(timeout=30)  # one ActorOutcome per actor
    >>> # closed: every actor ended, its process gone (bounded by close_timeout)
    """

    actors: list[Any]
    runs: list[Any] = field(default_factory=list)
    #: Starts more actors: ``(count or None) -> (actors, runs)``; None: none can be added.
    _more: Callable[[int | None], tuple[list[Any], list[Any]]] | None = None
    close_grace: float = 2.0
    close_timeout: float = 30.0
    _closed: bool = False

    # -- outcomes -----------------------------------------------------------------------------
    def wait(self, timeout: float | None = None) -> list[ActorOutcome]:
        """Every actor's outcome, once all finished or ``timeout`` s passed (never raises).

        An actor Ray restarted reports its last run; one that died for good (killed
        with no restart left, its node lost) reports Ray's reason in ``error``.
        """
        ready = set()
        if self.runs:
            done, _ = ray.wait(self.runs, num_returns=len(self.runs), timeout=timeout)
            ready = {ref.hex() for ref in done}
        return [self._outcome(i, ref, ref.hex() in ready, timeout)
                for i, ref in enumerate(self.runs)]

    def exit_codes(self, timeout: float | None = None) -> list[int | None]:
        """Each actor's exit code (None: no code, see :meth:`wait`)."""
        return [outcome.exit_code for outcome in self.wait(timeout)]

    def _outcome(self, index: int, ref: Any, ready: bool,
                 timeout: float | None) -> ActorOutcome:
        info = actor_info(self.actors[index])
        node = info.get("Address", {}).get("NodeID", "")
        restarts = int(info.get("NumRestarts", 0))
        if not ready:
            return ActorOutcome(index, node, None, f"still running after {timeout} s",
                                restarts)
        try:
            return ActorOutcome(index, node, int(ray.get(ref)), "", restarts)
        except ray.exceptions.RayError as exc:
            reason = str(exc).strip().splitlines()
            return ActorOutcome(index, node, None,
                                f"{type(exc).__name__}: {reason[0] if reason else ''}", restarts)

    # -- more ---------------------------------------------------------------------------------
    def scale(self, count: int | None = None) -> int:
        """Start more actors now; returns how many.

        For :func:`launch_hosts`: one host on each selected node that has none yet
        (a node added to the cluster while the run goes on; ``count`` unused).
        For :func:`launch_workers`: ``count`` more workers. The collector admits
        them while its ``remote_workers`` has room.
        """
        if self._closed:
            raise RuntimeError("these workers were closed: launch new ones")
        if self._more is None:
            raise RuntimeError("these workers cannot be scaled")
        actors, runs = self._more(count)
        self.actors += actors
        self.runs += runs
        return len(actors)

    # -- ending -------------------------------------------------------------------------------
    def kill(self) -> None:
        """End every actor now (no restart), without waiting: see :meth:`close`."""
        for actor in self.actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # gone already, or Ray is shut down
                pass

    def close(self, grace: float | None = None, timeout: float | None = None) -> list[int]:
        """End every actor and wait until their processes are gone; idempotent.

        Actors whose run finished (the collector closed them) end at once; the
        others get ``grace`` s (default :attr:`close_grace`) to finish, then are
        killed. Waits up to ``timeout`` s (default :attr:`close_timeout`) for Ray
        to report each actor dead and, for an actor on this machine, for its
        process to exit. Returns the pids still alive after that (logged; [] as
        a rule).
        """
        grace = self.close_grace if grace is None else grace
        timeout = self.close_timeout if timeout is None else timeout
        if self._closed:
            return []
        self._closed = True
        if self.runs and grace > 0:
            ray.wait(self.runs, num_returns=len(self.runs), timeout=grace)
        infos = [actor_info(actor) for actor in self.actors]  # pids, before they are gone
        self.kill()
        left = wait_actors_gone(self.actors, infos, timeout)
        if left:
            log.warning("Ray actor process(es) %s still alive %.0f s after they were killed",
                        left, timeout)
        return left

    async def aclose(self) -> None:
        """:meth:`close` in a worker thread (it blocks on Ray)."""
        import anyio

        await anyio.to_thread.run_sync(self.close)

    def __enter__(self) -> RayWorkers:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        # Leaving on an error: no grace, the run is over for these workers.
        self.close(grace=0 if exc is not None else None)

    async def __aenter__(self) -> RayWorkers:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        import anyio

        grace = 0 if exc is not None else None
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(lambda: self.close(grace=grace))


def actor_info(actor: Any) -> dict[str, Any]:
    """Ray's record of ``actor`` (state, pid, node, restarts); {} if it cannot be read."""
    try:
        from ray._private import state

        info = state.actors(actor_id=actor._actor_id.hex())
    except Exception:
        return {}
    return info if isinstance(info, dict) else {}


def wait_actors_gone(actors: list[Any], infos: list[dict[str, Any]], timeout: float) -> list[int]:
    """Wait until Ray reports every actor dead and the local ones' processes exited.

    Returns the pids still running on this machine after ``timeout`` s.
    """
    deadline = time.monotonic() + timeout
    local_ip = _local_ip()
    pids = {int(info["Pid"]) for info in infos
            if info.get("Pid") and info.get("Address", {}).get("IPAddress") == local_ip}
    while True:
        dead = all(actor_info(actor).get("State", "DEAD") == "DEAD" for actor in actors)
        left = sorted(pid for pid in pids if _ray_process_alive(pid))
        if (dead and not left) or time.monotonic() >= deadline:
            return left
        time.sleep(POLL_INTERVAL)


def _local_ip() -> str:
    try:
        return str(ray.util.get_node_ip_address())  # type: ignore[no-untyped-call]
    except Exception:
        return ""


def _ray_process_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie waiting for its raylet to reap it counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
    except (OSError, IndexError):  # not Linux: ask the kernel
        try:
            os.kill(pid, 0)
        except OSError:
            return False
        return True


__all__ = ["ActorOutcome", "RayWorkers", "actor_info", "wait_actors_gone"]
