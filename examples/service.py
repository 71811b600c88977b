"""asyncrl inside an async service: a Starlette app that collects, trains and reports.

    pip install -e ".[service,metrics]"
    uvicorn examples.service:app                  # from the repository root
    python -m examples.service --port 8000        # the same, exit status 0 on SIGTERM

The app's lifespan opens a :class:`asyncrl.MultiAsyncCollector` (CartPole-v1,
``ASYNCRL_WORKERS`` worker processes, 2 by default, plus ``ASYNCRL_REMOTE_WORKERS``
worker hosts joining at ``ASYNCRL_LISTEN``) and runs a small training task beside
the server: once every worker joined it logs "service ready", then takes a
policy-gradient step per batch, and every ``ASYNCRL_PUSH_EVERY`` batches pushes the
new weights to the workers. The endpoints:

- ``GET /``: a live status page (plain HTML and JavaScript, no CDN: it works
  offline) that polls ``/status`` every second and charts frames/s, the mean
  episode return, the policy lag and the workers by state over the last 5 minutes;
- ``GET /livez``: 200 while the app runs and its training task has not failed
  (503 with the error then: a liveness probe restarts it);
- ``GET /readyz``: 200 once every expected worker joined, while training goes
  on and while at least ``ASYNCRL_READY_WORKERS`` workers are live (a count, or a
  share of the expected ones: ``75%``; ``100%`` by default); 503 otherwise;

- ``GET /status``: JSON from ``collector.statistics()``: ``frames``, ``fps``,
  ``batches``, ``policy_version``, ``policy_lag``, ``paused``, ``state`` (the collector's:
  running, waiting, paused, failed...), ``episode_return_mean``
  and ``workers`` (each with ``index``, ``state``, ``pid``, ``frames``, ages, ``exit_code``),
  plus the training task's ``updates``, ``ready`` and ``error``;
- ``GET /metrics``: Prometheus text (:mod:`asyncrl.metrics`);
- ``POST /weights``: push the trainer's current weights, answer once every worker
  applied them: ``{"version": N}``;
- ``POST /pause`` and ``POST /resume``: ``{"paused": true|false}``. These three
  need ``Authorization: Bearer <token>`` with the token in
  ``ASYNCRL_CONTROL_TOKEN_FILE`` (401 without it, 400 for several Authorization
  headers, 503 while the file cannot be used); with no token file they answer
  loopback clients only (403 for the others). See examples/service_control.py.

With ``ASYNCRL_CHECKPOINT`` (a file path) the run survives a restart: the policy,
the optimiser and the counters are saved every ``ASYNCRL_CHECKPOINT_EVERY`` (50)
training steps and at SIGTERM, and restored at start (examples/service_checkpoint.py).

SIGTERM (``kill``, ``docker stop``, systemd's process-group SIGTERM) and Ctrl-C end
it cleanly: uvicorn runs the lifespan's exit, the training task is cancelled, the
collector closes and no worker process is left. (The ``uvicorn`` command then
re-raises the SIGTERM it handled, so its exit status says "terminated by SIGTERM",
which systemd counts as a clean stop; ``python -m examples.service`` exits 0.)
Logging: if nothing configured the root logger, the lifespan logs at
``ASYNCRL_LOG_LEVEL`` (INFO) to stderr, and the workers inherit that level and
format. The other settings (:class:`Settings`): ``ASYNCRL_FRAMES_PER_BATCH``,
``ASYNCRL_ON_WORKER_LOSS`` (the collector's ``on_worker_loss``: raise, continue,
wait, restart), ``ASYNCRL_CURVE_KEYS`` (a directory of ``asyncrl keys generate``),
``ASYNCRL_READY_TIMEOUT`` (seconds to wait for the workers). See docs/service.md
and docs/deploy.md (the same app as a Kubernetes Deployment).
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import torch
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModule
from torch import nn

import asyncrl
from asyncrl.metrics import CollectorMetrics, expected_workers
from examples.service_checkpoint import Checkpoint, RunState
from examples.service_control import ControlToken

log = logging.getLogger("examples.service")

OBS_DIM, N_ACTIONS = 4, 2  # CartPole-v1


class Actor(nn.Module):
    """Observation -> (sampled action, its log-probability)."""

    def __init__(self, hidden: int = 32) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(OBS_DIM, hidden), nn.Tanh(),
                                 nn.Linear(hidden, N_ACTIONS))

    def forward(self, observation: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        dist = torch.distributions.Categorical(logits=self.net(observation))
        action = dist.sample()
        return action, dist.log_prob(action)


def make_policy() -> TensorDictModule:
    return TensorDictModule(Actor(), in_keys=["observation"],
                            out_keys=["action", "action_log_prob"])


def _env(name: str, default: str) -> Any:
    return field(default_factory=lambda: os.environ.get(f"ASYNCRL_{name}", default))


def _env_int(name: str, default: int) -> Any:
    return field(default_factory=lambda: int(os.environ.get(f"ASYNCRL_{name}", default)))


@dataclass
class Settings:
    """From the environment, so that one ``uvicorn examples.service:app`` is configurable.

    ``ASYNCRL_`` + the upper-case field name: ``ASYNCRL_REMOTE_WORKERS=4``.
    """

    workers: int = _env_int("WORKERS", 2)  # local worker processes
    remote_workers: int = _env_int("REMOTE_WORKERS", 0)  # worker processes of other hosts
    listen: str | None = _env("LISTEN", "")  # tcp://0.0.0.0:5555 for remote workers
    curve_keys: str | None = _env("CURVE_KEYS", "")  # asyncrl keys generate DIR
    on_worker_loss: str = _env("ON_WORKER_LOSS", "raise")
    frames_per_batch: int = _env_int("FRAMES_PER_BATCH", 256)
    push_every: int = _env_int("PUSH_EVERY", 4)
    ready_timeout: float = field(
        default_factory=lambda: float(os.environ.get("ASYNCRL_READY_TIMEOUT", "600")))
    ready_workers: str = _env("READY_WORKERS", "100%")  # live workers /readyz needs: N or P%
    control_token_file: str | None = _env("CONTROL_TOKEN_FILE", "")  # bearer token for POSTs
    checkpoint: str | None = _env("CHECKPOINT", "")  # file to save / restore the run at
    checkpoint_every: int = _env_int("CHECKPOINT_EVERY", 50)  # training steps between saves
    lr: float = 1e-3

    def __post_init__(self) -> None:
        # A field's default_factory gives "" for an unset variable: None.
        self.listen = self.listen or None
        self.curve_keys = self.curve_keys or None
        self.control_token_file = self.control_token_file or None
        self.checkpoint = self.checkpoint or None
        if self.checkpoint_every < 1:
            raise ValueError(f"ASYNCRL_CHECKPOINT_EVERY must be >= 1, got {self.checkpoint_every}")

    def required_workers(self, expected: int) -> int:
        """Live workers ``/readyz`` needs, from ``ready_workers`` ("3" or "75%").

        >>> [Settings(ready_workers=n).required_workers(8) for n in ("75%", "3")]
        [6, 3]
        """
        text = self.ready_workers.strip()
        try:
            share = float(text[:-1]) if text.endswith("%") else None
            count = math.ceil(expected * share / 100) if share is not None else int(text)
        except ValueError:
            count = share = -1
        if not 0 < count <= expected or (share is not None and not 0 < share <= 100):
            raise ValueError(f"ASYNCRL_READY_WORKERS: expected a count in 1..{expected} (the "
                             f"expected workers) or a share in (0%, 100%], got {text!r}")
        return count


@dataclass
class Service:
    """What the endpoints read: the open collector, its metrics, the trainer's progress."""

    collector: asyncrl.MultiAsyncCollector
    policy: TensorDictModule
    optimizer: torch.optim.Optimizer
    registry: CollectorRegistry
    control: ControlToken  # who may POST /weights, /pause, /resume
    required: int = 1  # live workers /readyz needs
    checkpoint: Checkpoint | None = None
    restored: RunState | None = None  # what the run continued from
    updates: int = 0  # training steps taken
    ready: bool = False  # every expected worker joined, training runs
    error: str | None = None  # the training task's error, if it failed
    lock: anyio.Lock = field(default_factory=anyio.Lock)  # one weight push at a time


def train_step(policy: TensorDictModule, optimizer: torch.optim.Optimizer,
               batch: TensorDictBase) -> None:
    """One REINFORCE-style step on a batch (small on purpose: the service is the point)."""
    actor: Any = policy.module
    logits = actor.net(batch["observation"])
    log_prob = torch.distributions.Categorical(logits=logits).log_prob(batch["action"])
    reward = batch["next", "reward"].reshape(log_prob.shape)
    advantage = reward - reward.mean()
    loss = -(log_prob * advantage).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


async def push_weights(service: Service) -> int:
    """Send the trainer's weights; return their version once every worker applied them."""
    async with service.lock:  # the version read after is this push's
        await service.collector.update_policy_weights()
        return service.collector.policy_version


def run_state(service: Service) -> RunState:
    """What a checkpoint keeps: the weights, the optimiser and the counters."""
    stats = service.collector.statistics()
    return RunState(service.policy.state_dict(), service.optimizer.state_dict(),
                    frames=stats.frames, batches=stats.batches, updates=service.updates,
                    policy_version=stats.policy_version)


async def save_checkpoint(service: Service) -> None:
    """Write the checkpoint (in a thread: requests are served meanwhile)."""
    if service.checkpoint is not None:
        state = run_state(service)
        await anyio.to_thread.run_sync(service.checkpoint.save, state)
        log.info("checkpoint saved: %d frames, %d updates, policy version %d",
                 state.frames, state.updates, state.policy_version)


def learn(service: Service, batch: TensorDictBase) -> None:
    """A training step and its count, together: a cancelled await cannot split them."""
    train_step(service.policy, service.optimizer, batch)
    service.updates += 1


async def train(service: Service, settings: Settings) -> None:
    """The training task: wait for the workers, learn from each batch, push weights."""
    try:
        await service.collector.wait_ready(timeout=settings.ready_timeout)
        if service.restored is not None:  # stamp frames with the restored run's versions
            await push_weights(service)
        service.ready = True
        stats = service.collector.statistics()
        log.info("service ready: %d workers joined (%d local, %d remote)", len(stats.workers),
                 settings.workers, settings.remote_workers)
        async for batch in service.collector:  # ends on close, or on a SIGTERM'd worker
            # In a thread: the event loop keeps serving requests during the step.
            await anyio.to_thread.run_sync(learn, service, batch)
            if service.updates % settings.push_every == 0:
                await push_weights(service)
            if service.updates % settings.checkpoint_every == 0:
                await save_checkpoint(service)
    except asyncrl.CollectorStopped as exc:  # its workers got SIGTERM: a stop, not a failure
        log.info("training stopped: %s", exc)
    except Exception as exc:  # the server stays up and /status (and /livez) say why
        service.error = f"{type(exc).__name__}: {exc}"
        log.exception("the training task failed")
    finally:
        service.ready = False


def make_service(settings: Settings) -> Service:
    """The policy and optimiser (restored from the checkpoint if there is one), the collector."""
    policy = make_policy()
    optimizer = torch.optim.Adam(policy.parameters(), lr=settings.lr)
    checkpoint = Checkpoint(settings.checkpoint) if settings.checkpoint else None
    restored = checkpoint.load() if checkpoint is not None else None
    if restored is not None:  # before the collector: its workers start with these weights
        policy.load_state_dict(restored.policy)
        optimizer.load_state_dict(restored.optimizer)
    collector = asyncrl.MultiAsyncCollector(
        "CartPole-v1", policy, num_workers=settings.workers,
        remote_workers=settings.remote_workers, listen=settings.listen,
        curve_keys=settings.curve_keys, on_worker_loss=settings.on_worker_loss,
        frames_per_batch=settings.frames_per_batch, total_frames=-1)
    required = settings.required_workers(expected_workers(collector) or 0)
    return Service(collector, policy, optimizer, CollectorRegistry(),
                   ControlToken(settings.control_token_file), required, checkpoint, restored,
                   updates=restored.updates if restored is not None else 0)


def continue_run(service: Service) -> None:
    """Counters and weight versions go on from the restored checkpoint (if any)."""
    restored = service.restored
    if restored is None:
        return
    service.collector.continue_counts(frames=restored.frames, batches=restored.batches)
    service.collector.weight_sender().continue_from(restored.policy_version)
    log.info("run restored from %s: %d frames, %d updates, policy version %d",
             service.checkpoint.path if service.checkpoint else "?", restored.frames,
             restored.updates, restored.policy_version)


@asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    if not logging.getLogger().handlers:  # uvicorn configures only its own loggers
        logging.basicConfig(level=os.environ.get("ASYNCRL_LOG_LEVEL", "INFO").upper(),
                            format="%(levelname)-9s %(name)s: %(message)s")
    settings = Settings()
    service = make_service(settings)
    async with service.collector:
        continue_run(service)
        CollectorMetrics(service.collector, registry=service.registry)
        async with anyio.create_task_group() as tg:
            # Serving starts now; the task logs "service ready" once the workers joined
            # (remote hosts may take minutes to be scheduled: /livez answers meanwhile).
            tg.start_soon(train, service, settings)
            app.state.service = service
            log.info("service started: waiting for %d workers (%d local, %d remote)%s",
                     settings.workers + settings.remote_workers, settings.workers,
                     settings.remote_workers,
                     f" at {service.collector.endpoint}" if settings.listen else "")
            try:
                yield
            finally:
                tg.cancel_scope.cancel()  # the training task; the collector closes next
        with anyio.CancelScope(shield=True):  # SIGTERM: the last state, before closing
            await save_checkpoint(service)
    log.info("service stopped")


def _service(request: Request) -> Service:
    service: Service = request.app.state.service
    return service


async def status(request: Request) -> JSONResponse:
    service = _service(request)
    stats = service.collector.statistics()
    return JSONResponse({
        "frames": stats.frames,
        "fps": stats.frames_per_second,
        "batches": stats.batches,
        "policy_version": stats.policy_version,
        "policy_lag": stats.policy_lag,
        "paused": stats.paused,
        "state": stats.state,
        "episode_return_mean": stats.episode_return_mean,
        "updates": service.updates,
        "ready": service.ready,
        "error": service.error,
        "workers": [
            {"index": w.index, "name": w.name, "host": w.host, "pid": w.pid, "state": w.state,
             "frames": w.frames, "last_batch_age": w.last_batch_age,
             "heartbeat_age": w.heartbeat_age, "exit_code": w.exit_code}
            for w in stats.workers],
    })


#: GET /: the status page (examples/status_page.html), read once at import.
STATUS_PAGE = (Path(__file__).parent / "status_page.html").read_text(encoding="utf-8")


async def page(request: Request) -> HTMLResponse:
    return HTMLResponse(STATUS_PAGE)


async def livez(request: Request) -> JSONResponse:
    """Liveness: the app answers, and its training task has not failed."""
    error = _service(request).error
    return JSONResponse({"alive": error is None, "error": error},
                        status_code=200 if error is None else 503)


async def readyz(request: Request) -> JSONResponse:
    """Readiness: every expected worker joined, training runs, enough workers are live."""
    service = _service(request)
    workers = service.collector.statistics().workers
    live = sum(1 for w in workers if w.state in ("collecting", "idle"))
    ready = service.ready and live >= service.required
    return JSONResponse({"ready": ready, "workers": live, "required": service.required,
                         "error": service.error}, status_code=200 if ready else 503)


async def metrics(request: Request) -> Response:
    return Response(generate_latest(_service(request).registry),
                    media_type=CONTENT_TYPE_LATEST)


async def weights(request: Request) -> JSONResponse:
    if (refused := _service(request).control.refusal(request)) is not None:
        return refused
    try:
        version = await push_weights(_service(request))
    except asyncrl.CollectorError as exc:  # closed, stopped or failed: say so
        return JSONResponse({"error": str(exc)}, status_code=503)
    return JSONResponse({"version": version})


async def pause(request: Request) -> JSONResponse:
    if (refused := _service(request).control.refusal(request)) is not None:
        return refused
    collector = _service(request).collector
    await collector.pause()
    return JSONResponse({"paused": collector.paused})


async def resume(request: Request) -> JSONResponse:
    if (refused := _service(request).control.refusal(request)) is not None:
        return refused
    collector = _service(request).collector
    await collector.resume()
    return JSONResponse({"paused": collector.paused})


app = Starlette(
    routes=[
        Route("/", page),
        Route("/livez", livez),
        Route("/readyz", readyz),
        Route("/status", status),
        Route("/metrics", metrics),
        Route("/weights", weights, methods=["POST"]),
        Route("/pause", pause, methods=["POST"]),
        Route("/resume", resume, methods=["POST"]),
    ],
    lifespan=lifespan,
)


def main(argv: list[str] | None = None) -> int:
    """``python -m examples.service``: uvicorn, with exit status 0 after a graceful SIGTERM."""
    import uvicorn

    parser = argparse.ArgumentParser(description="asyncrl collecting inside a Starlette app")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--control-token-file", metavar="FILE",
                        help="POST /weights, /pause, /resume need 'Authorization: Bearer' with "
                             "the token in FILE (read at every control request: a rotated "
                             "token applies at once; while FILE is unusable they answer 503); "
                             "without it they answer loopback clients only "
                             "(ASYNCRL_CONTROL_TOKEN_FILE)")
    parser.add_argument("--checkpoint", metavar="FILE",
                        help="save the run to FILE every ASYNCRL_CHECKPOINT_EVERY steps and at "
                             "SIGTERM, restore it at start (ASYNCRL_CHECKPOINT)")
    args = parser.parse_args(argv)
    # The app reads its settings in its lifespan (Settings()): options become variables.
    for option, variable in ((args.control_token_file, "ASYNCRL_CONTROL_TOKEN_FILE"),
                             (args.checkpoint, "ASYNCRL_CHECKPOINT")):
        if option:
            os.environ[variable] = option

    def stopped(signum: int, frame: Any) -> None:
        # uvicorn handles SIGTERM/SIGINT while it serves, shuts down gracefully, then
        # re-raises the signal to the handler it found: this one, which exits 0.
        raise SystemExit(0)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stopped)
    # h11, not httptools even where it is installed: h11 refuses a request whose headers
    # pass 16 KiB (400), httptools reads headers without a bound.
    uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, http="h11")).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
