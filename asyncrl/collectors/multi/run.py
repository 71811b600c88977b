"""One MultiCollector's run: its state (:class:`MultiRun`) and the task that owns it.

The hub (the coordinator's socket), the coordinator, one weight sender per
scheme and the local worker processes are started together and stopped
together: :func:`run_background` owns them in one task of the collector's task
group, and reports "started" once the hub is bound and the local workers are
being spawned. What they are, once started, lives in the :class:`MultiRun`
that the collector, its loss handling (:mod:`.losses`) and this module share:
none of them reaches into another's private fields.
"""

from __future__ import annotations

import logging
import secrets
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio
import anyio.lowlevel
import torch

from transports import CurveServer, Hub

from ..._coordinator.admission import AdmissionTerms
from ..._coordinator.coordinator import Coordinator, WorkerInfo
from ..._coordinator.watchdog import ReplacementWatch, StallWatchdog, StartupWatch
from ..._observe.events import CollectorEvent
from ..._rollout.envs import make_env_pool
from ..._spawn import logs as _logs
from ..._spawn.processes import WorkerProcesses
from ..._worker.entry import local_worker_processes
from ..._worker.spec import WorkerSpec
from ...served._remote_calls import ServedCallRouter
from ...served._scheme import serve_remote_calls
from ...weights import WeightSender, WeightSyncScheme
from .._env_factories import LocalSpecsCheck
from .._limits import listening_hub_limits
from .config import MultiConfig

__all__ = ["LossHandling", "MultiRun", "reference_specs", "run_background"]

log = logging.getLogger("asyncrl.collectors")


@dataclass(eq=False)
class MultiRun:
    """A MultiCollector's run: what it was asked (fixed) and what it holds while open.

    The collector makes one in its constructor; :func:`run_background` fills in
    the hub, the coordinator, the senders and the worker processes; the loss
    handling reads them. ``closing`` is set once the collector starts closing.

    >>> run = MultiRun(config, spec=spec, worker_specs=[spec], ...)   # doctest: +SKIP
    >>> run.coordinator is None                                      # doctest: +SKIP
    True
    """

    #: The collector's arguments, checked (the coordinator gets its part whole).
    config: MultiConfig
    #: The spec every worker shares, and one per local worker (its own env factory).
    spec: WorkerSpec
    worker_specs: list[WorkerSpec]
    schemes: dict[str, WeightSyncScheme]
    policy: Any
    #: The collector's event stream and weights-applied hook (events, metrics).
    publish: Callable[[CollectorEvent], None]
    on_weights_applied: Callable[[str, int, float], None]
    #: ``on_worker_loss="restart"``'s bound: the collector's ``max_restarts`` at the time
    #: of a loss (a user may change it while the run goes on).
    max_restarts: Callable[[], int] = lambda: 3
    # -- while open ------------------------------------------------------------------
    hub: Hub | None = None
    coordinator: Coordinator | None = None
    workers: WorkerProcesses | None = None
    senders: dict[str, WeightSender] = field(default_factory=dict)
    #: Remote workers' calls to served modules (None: the run serves none).
    served_router: ServedCallRouter | None = None
    tmpdir: str | None = None
    background: anyio.CancelScope | None = None
    background_done: anyio.Event | None = None
    closing: bool = False

    @property
    def num_workers(self) -> int:
        return self.config.layout.num_workers

    @property
    def remote_workers(self) -> int:
        return self.config.layout.remote_workers


class LossHandling(Protocol):
    """What the run calls when a worker goes (:class:`~.losses.WorkerLosses` does it)."""

    async def process_died(self, slot: int, process: Any) -> bool:
        """A local worker's process ended; True: respawn its slot."""

    def silent(self, worker: WorkerInfo) -> None:
        """The hub lost ``worker`` (or it stalled): a loss, already applied."""

    def leaving(self, worker: WorkerInfo, reason: str) -> None:
        """``worker`` says it stops on a signal."""


async def run_background(run: MultiRun, losses: LossHandling, name: str, paused: bool, *,
                         task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
    """Owns the hub, the coordinator and the process watchers, in one task.

    ``name`` is the collector's class name (for the log line); ``paused``: whether it
    was paused before it opened.
    """
    config = run.config
    backend = config.backend or anyio.lowlevel.current_token().__class__.__module__
    backend = "trio" if "trio" in backend else "asyncio"
    endpoint = config.listen
    if endpoint is None or run.num_workers:
        # Private (0700): the coordinator's socket (unless `listen`) and the local
        # workers' spec; removed at close, or by the workers if the trainer dies.
        run.tmpdir = tempfile.mkdtemp(prefix="asyncrl-")
    if endpoint is None:
        endpoint = f"ipc://{run.tmpdir}/coordinator"
    interval, timeout = config.heartbeat_interval, config.peer_timeout
    token = secrets.token_hex(16)
    assert run.background is not None and run.background_done is not None
    try:
        with run.background:
            # A directory, or when listening without one, ASYNCRL_CURVE_* variables.
            curve = CurveServer.load(config.curve_keys) \
                if config.curve_keys or config.listen else None
            local_keys = None
            if curve is not None:  # local workers get a key of their own, for this hub only
                curve, local_keys = curve.with_local_client()
            specs = await reference_specs(run.spec) if run.remote_workers else None
            async with Hub(endpoint, heartbeat_interval=interval, peer_timeout=timeout,
                           curve=curve, **_hub_limits(run, specs)) as hub:
                run.hub = hub
                coordinator = run.coordinator = _make_coordinator(run, losses, hub, token, specs,
                                                                 paused)
                for model_id, scheme in run.schemes.items():
                    model = run.policy if model_id == "policy" else None
                    sender = run.senders[model_id] = scheme.init_on_sender(
                        model_id, model=model, hub=hub, workers=coordinator.roster.worker_peers)
                    sender.on_applied = run.on_weights_applied  # events, metrics
                    coordinator.outbox.attach(sender)  # relay routes, catch-up, batch counts
                # Remote workers' calls to served modules, from admitted workers only.
                run.served_router = serve_remote_calls(coordinator.services, run.senders,
                                                       run.publish)
                workers = run.workers = local_worker_processes(
                    hub.endpoint, run.worker_specs, run.num_workers, token=token,
                    backend=backend,
                    options={"heartbeat_interval": interval, "peer_timeout": timeout,
                             "curve_keys": local_keys,
                             "log_config": _logs.capture()},
                    directory=run.tmpdir or "", start_method=config.threads.start_method)
                async with anyio.create_task_group() as tg:
                    tg.start_soon(coordinator.run)  # hellos are answered while others spawn
                    if config.sample_timeout is not None:  # a hung env or policy is a loss
                        tg.start_soon(StallWatchdog(coordinator, config.sample_timeout).run)
                    tg.start_soon(StartupWatch(  # the first fill says it, and ends
                        coordinator, config.startup_timeout, local_workers=run.num_workers,
                        remote_workers=run.remote_workers, listen=config.listen,
                        endpoint=hub.endpoint).run)
                    if config.coordinator.loss_policy.waits_for_replacements:  # says so, ends
                        tg.start_soon(ReplacementWatch(coordinator,
                                                       config.replacement_timeout).run)
                    for sender in run.senders.values():
                        tg.start_soon(sender.run)  # queued versions go out once acked
                    await tg.start(workers.run, losses.process_died)
                    log.info("%s opened at %s: %d local worker(s) starting, %d remote "
                             "expected", name, hub.endpoint,
                             run.num_workers, run.remote_workers)
                    task_status.started()
    finally:
        run.background_done.set()


async def reference_specs(spec: WorkerSpec) -> dict[str, Any] | None:
    """The specs remote workers must match: from one env built here, if it builds."""

    def build() -> dict[str, Any]:
        pool = make_env_pool(spec.create_env_fn, create_env_kwargs=spec.create_env_kwargs,
                             num_envs=spec.envs_per_worker)
        try:
            return pool.specs.to_dict()
        finally:
            pool.close()

    try:
        return await anyio.to_thread.run_sync(build)
    except Exception as exc:  # the first worker's specs become the reference
        log.warning("could not build the env here to check remote workers' specs: %s", exc)
        return None


def _hub_limits(run: MultiRun, specs: dict[str, Any] | None) -> dict[str, Any]:
    if run.config.listen is None:
        # A private ipc socket: only our own workers can reach it, and their process
        # watcher sees each death at once, with its exit code (no route probes).
        return {"disconnect_grace": None}
    policy = run.policy if isinstance(run.policy, torch.nn.Module) else None
    return listening_hub_limits(specs, frames=max(run.config.coordinator.share_frames),
                                policy=policy, max_message_bytes=run.config.max_message_bytes)


def _make_coordinator(run: MultiRun, losses: LossHandling, hub: Hub, token: str,
                      specs: dict[str, Any] | None, paused: bool) -> Coordinator:
    configs = {model_id: scheme.to_config() for model_id, scheme in run.schemes.items()}
    terms = AdmissionTerms(
        token=token, specs=specs,
        check_specs=LocalSpecsCheck(lambda: run.coordinator, bool(run.remote_workers)),
        # A served module's route travels apart (Welcome.served): a worker of a release
        # before served modules, which knows no "served" scheme, still joins.
        scheme_configs={m: c for m, c in configs.items() if c.get("scheme") != "served"},
        served_routes=[c["route"] for c in configs.values()
                       if c.get("scheme") == "served" and "route" in c],
        # A remote host that lacks the run's gymnasium id is told where it comes from.
        env_source=run.spec.env_source)
    return Coordinator(hub, run.config.coordinator, terms, on_lost=losses.silent,
                       on_leaving=losses.leaving, publish=run.publish, paused=paused)
