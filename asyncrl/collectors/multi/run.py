"""What a MultiCollector runs while open, in one background task.

The hub (the coordinator's socket), the coordinator, one weight sender per
scheme and the local worker processes are started together and stopped
together: :func:`run_background` owns them in one task of the collector's task
group, and reports "started" once the hub is bound and the local workers are
being spawned.
"""

from __future__ import annotations

import logging
import secrets
import tempfile
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel
import torch

from transports import CurveServer, Hub

from ..._coordinator.coordinator import Coordinator
from ..._rollout.envs import make_env_pool
from ..._spawn import logs as _logs
from ..._worker.entry import local_worker_processes
from ..._worker.spec import WorkerSpec
from .._env_factories import LocalSpecsCheck
from .._limits import listening_hub_limits

if TYPE_CHECKING:
    from .collector import MultiCollector

__all__ = ["reference_specs", "run_background"]

log = logging.getLogger("asyncrl.collectors")


async def run_background(collector: MultiCollector, *,
                         task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
    """Owns the hub, the coordinator and the process watchers, in one task."""
    c = collector
    backend = c.backend or anyio.lowlevel.current_token().__class__.__module__
    backend = "trio" if "trio" in backend else "asyncio"
    endpoint = c.listen
    if endpoint is None or c.num_workers:
        # Private (0700): the coordinator's socket (unless `listen`) and the local
        # workers' spec; removed at close, or by the workers if the trainer dies.
        c._tmpdir = tempfile.mkdtemp(prefix="asyncrl-")
    if endpoint is None:
        endpoint = f"ipc://{c._tmpdir}/coordinator"
    interval, timeout = c._heartbeat
    token = secrets.token_hex(16)
    assert c._background is not None and c._background_done is not None
    try:
        with c._background:
            curve = CurveServer.from_dir(c.curve_keys) if c.curve_keys else None
            specs = await reference_specs(c._spec) if c.remote_workers else None
            async with Hub(endpoint, heartbeat_interval=interval, peer_timeout=timeout,
                           curve=curve, **_hub_limits(c, specs)) as hub:
                c._hub = hub
                coordinator = c._coordinator = _make_coordinator(c, hub, token, specs)
                for model_id, scheme in c.weight_sync_schemes.items():
                    model = c.policy if model_id == "policy" else None
                    sender = c._senders[model_id] = scheme.init_on_sender(
                        model_id, model=model, hub=hub, workers=coordinator.worker_peers)
                    sender.on_applied = c._on_weights_applied  # events, metrics
                    coordinator.attach(sender)  # relay routes, catch-up, batch counts
                workers = c._workers = local_worker_processes(
                    hub.endpoint, c._worker_specs, c.num_workers, token=token,
                    backend=backend,
                    options={"heartbeat_interval": interval, "peer_timeout": timeout,
                             "curve_keys": c.curve_keys,
                             "log_config": _logs.capture()},
                    directory=c._tmpdir or "", start_method=c.start_method)
                async with anyio.create_task_group() as tg:
                    tg.start_soon(coordinator.run)  # hellos are answered while others spawn
                    for sender in c._senders.values():
                        tg.start_soon(sender.run)  # queued versions go out once acked
                    await tg.start(workers.run, c._losses.process_died)
                    log.info("%s opened at %s: %d local worker(s) starting, %d remote "
                             "expected", type(c).__name__, hub.endpoint,
                             c.num_workers, c.remote_workers)
                    task_status.started()
    finally:
        c._background_done.set()


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


def _hub_limits(c: MultiCollector, specs: dict[str, Any] | None) -> dict[str, Any]:
    if c.listen is None:
        return {}  # a private ipc socket: only our own workers can reach it
    policy = c.policy if isinstance(c.policy, torch.nn.Module) else None
    return listening_hub_limits(specs, frames=max(c.frames_per_worker), policy=policy,
                                max_message_bytes=c.max_message_bytes)


def _make_coordinator(c: MultiCollector, hub: Hub, token: str,
                      specs: dict[str, Any] | None) -> Coordinator:
    return Coordinator(
        hub, sync=c.sync, frames_per_worker=c.frames_per_worker,
        prefetch=c.prefetch, preemptive_threshold=c.preemptive_threshold,
        init_random_frames=c.init_random_frames // max(1, c.num_workers + c.remote_workers),
        check_specs=LocalSpecsCheck(lambda: c._coordinator, bool(c.remote_workers)),
        token=token, accept_remote=c.remote_workers > 0,
        on_worker_loss=c.on_worker_loss, on_lost=c._losses.silent,
        on_leaving=c._losses.leaving,
        batch_budget=_batch_budget(c), first_remote_index=c.num_workers,
        scheme_configs={model_id: scheme.to_config()
                        for model_id, scheme in c.weight_sync_schemes.items()},
        max_remote_workers=c.remote_workers, specs=specs, publish=c._publish,
        paused=c.paused,
    )


def _batch_budget(c: MultiCollector) -> int | None:
    if c.sync or c.total_frames < 0:
        return None
    return c.total_frames // c.frames_per_batch
