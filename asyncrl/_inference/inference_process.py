"""The dedicated inference process of central inference (``server_backend="process"``).

With ``AsyncBatchedCollector(..., server_backend="process")`` the policy is
served by this process instead of a thread of the trainer's. It maps every env
worker's two shared-memory blocks (created and unlinked by the trainer), holds
the doorbells the trainer made (the request bell and each env worker's answer
bell, :mod:`.doorbell`, handed over when the process starts) and runs the same
:class:`~asyncrl._inference.inference_loop.InferenceLoop` as the thread server, in a
thread of its own: requests and answers never touch ZeroMQ. Chunks of
transitions go from the env workers to the trainer.

So collection goes on while the trainer's event loop is held by a training
step, and the policy's Python (its forward, a sampling distribution) never
waits for the trainer's GIL. The trainer talks to this process over its own
hub, as a peer (:class:`transports.Link`):

Their kinds are declared in :mod:`asyncrl._protocol.inference_process`:

====================  =====================================================
trainer -> here       ``weights`` (a state dict: answered ``applied`` with the
                      new version once the next call uses it), ``hold`` /
                      ``go`` (back-pressure, and pause: no answers while the
                      trainer's buffer of frames is full), ``close``
here -> trainer       ``ready`` (the version served), ``applied``, ``held``,
                      ``stats``
                      (every :data:`STATS_INTERVAL` s while calls are made),
                      ``error`` (the run stops)
trainer -> here       ``remote-obs`` ``{"slot", "obs"}``: a remote env host's
                      request (checked by the trainer; it owns the network)
here -> trainer       ``remote-act`` ``{"slot", "v", "a"}``: its answer, which
                      the trainer sends on to the host
====================  =====================================================

Remote env hosts (``listen=``) talk to the trainer's hub only: the trainer
checks what they send, then forwards each request here, where it joins the
same batches as the local workers' (one inline block per remote slot, made
again when an occupant with another number of envs asks).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import torch
from torch import nn

from transports import (
    CurveClient,
    ErrorPayload,
    Link,
    Message,
    PeerLostError,
    ProtocolError,
    SharedTensorBlock,
)

from .._protocol import Actions, EnvClose, decode
from .._protocol.central_inference import ERROR_KIND, dtype_name
from .._protocol.inference_process import (
    RemoteAnswer,
    RemoteRequest,
    ServerApplied,
    ServerGo,
    ServerHeld,
    ServerHold,
    ServerReady,
    ServerStatistics,
    ServerWeights,
)
from .._rollout.policies import ExplorationType, PolicyAdapter
from .._spawn.absent_modules import remember_absent_modules
from .._spawn.child import ending_error, exit_process
from .doorbell import DEFAULT_SPIN, EventFd
from .env_worker import serve_linked
from .inference_loop import InferenceLoop
from .inline_blocks import InlineBlock
from .outputs import OutputLayout
from .worker_blocks import WorkerBlocks

log = logging.getLogger("asyncrl.inference")

#: Seconds between two statistics reports while the loop serves.
STATS_INTERVAL = 0.2

Path = tuple[str, ...]


@dataclass(frozen=True)
class ServerConfig:
    """What the inference process is given (pickled by the trainer for its own child)."""

    blocks: dict[int, tuple[int, str, str]]  # slot -> (rows, obs block, act block)
    request_bell: EventFd  # rung by every env worker after its request
    answer_bells: dict[int, EventFd]  # slot -> rung here after its answer
    policy: Any  # the policy (an nn.Module, on the CPU) or None
    policy_factory: Callable[[], Any] | None
    action_spec: Any
    exploration_type: ExplorationType | str | None
    obs_paths: Sequence[Path]
    outputs: OutputLayout
    device: torch.device | None
    max_batch_size: int
    min_batch_size: int
    server_timeout: float
    version: int
    threads: int
    heartbeat_interval: float = 1.0
    peer_timeout: float = 10.0
    spin: float = DEFAULT_SPIN
    #: (dtype, per-env shape) of each observation: the loop's batch (there may be no block)
    obs_spec: Sequence[tuple[torch.dtype, tuple[int, ...]]] | None = None
    #: Slots from here on are remote env hosts' (their requests come as ``remote-obs``)
    first_remote_slot: int | None = None
    #: Rows of the CUDA graph the policy is captured in (None: eager calls)
    static_batch_size: int | None = None
    #: Its key for the trainer's hub when that hub speaks CURVE (``listen`` with keys)
    curve: CurveClient | None = None


class InferenceServer:
    """The loop, its blocks and the trainer's orders, in the inference process."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        policy = config.policy_factory() if config.policy_factory is not None else config.policy
        if isinstance(policy, nn.Module) and config.device is not None:
            policy = policy.to(config.device)
        self.policy = policy
        adapter = PolicyAdapter(policy, action_spec=config.action_spec,
                                exploration_type=config.exploration_type,
                                observation_keys=[p[0] if len(p) == 1 else p
                                                  for p in config.obs_paths])
        self.blocks: dict[int, WorkerBlocks] = {}
        try:
            for slot, (rows, obs, act) in config.blocks.items():
                self.blocks[slot] = WorkerBlocks(rows, SharedTensorBlock.attach(obs),
                                                 SharedTensorBlock.attach(act))
        except BaseException:
            self.close()
            raise
        self.loop = InferenceLoop(adapter, self.blocks, obs_paths=config.obs_paths,
                                  outputs=config.outputs, device=config.device,
                                  max_batch_size=config.max_batch_size,
                                  min_batch_size=config.min_batch_size,
                                  server_timeout=config.server_timeout, version=config.version,
                                  request_bell=config.request_bell,
                                  answer_bells=config.answer_bells, spin=config.spin,
                                  threads=config.threads, obs_spec=config.obs_spec,
                                  static_batch_size=config.static_batch_size)

    async def serve(self, trainer: Link) -> int:
        """Serve until the trainer says close (0), goes away (0) or this fails (1, reported)."""
        await trainer.send(ServerReady(self.loop.version).to_body(), kind=ServerReady.KIND)
        try:
            async with anyio.create_task_group() as tg:
                async def reply(slot: int, version: int) -> None:  # a remote host's answer
                    answer = Actions(version, self.blocks[slot].act.tensors)  # type: ignore[attr-defined]
                    await trainer.send(RemoteAnswer(slot, answer).to_body(),
                                       kind=RemoteAnswer.KIND)

                remote = self.config.first_remote_slot is not None
                tg.start_soon(self.loop.run, reply if remote else None)
                tg.start_soon(self._report, trainer)
                await self._orders(trainer)
                tg.cancel_scope.cancel()
        except Exception as exc:
            return await report_error(trainer, exc)
        return 0

    async def _orders(self, trainer: Link) -> None:
        while True:
            message = await trainer.recv()
            if message.kind == EnvClose.KIND:
                return
            if message.kind in (ServerHold.KIND, ServerGo.KIND):
                self.loop.set_room(message.kind == ServerGo.KIND)
                if message.kind == ServerHold.KIND:
                    await self.loop.held()  # the call under way (if any) has answered
                    await trainer.send(None, kind=ServerHeld.KIND)
            elif message.kind == ServerWeights.KIND:
                applied = await self._load(message)
                await trainer.send(applied.to_body(), kind=ServerApplied.KIND)
            elif message.kind == RemoteRequest.KIND:
                self._remote_request(message.body)

    def _remote_request(self, body: Any) -> None:
        """A remote host's observations (checked by the trainer): into its slot's block,
        made again for an occupant with another number of envs; then a request."""
        first, spec = self.config.first_remote_slot, self.config.obs_spec or ()
        request = decode(RemoteRequest, body, first_slot=(1 << 21) if first is None else first,
                         max_rows=self.config.max_batch_size, layout=lambda rows: {
                             f"o{i}": (dtype_name(d), (rows, *s)) for i, (d, s)
                             in enumerate(spec)})
        slot, obs = request.slot, request.obs.arrays
        rows = int(obs["o0"].shape[0])
        blocks = self.blocks.get(slot)
        if blocks is None or blocks.rows != rows:  # its request is answered: safe to swap
            layout = {k: (t.dtype, tuple(t.shape)) for k, t in obs.items()}
            act = {k: (t.dtype, tuple(t.shape))
                   for k, t in self.config.outputs.block_tensors(rows).items()}
            blocks = WorkerBlocks(rows, InlineBlock(layout), InlineBlock(act))  # type: ignore[arg-type]
            self.blocks[slot] = blocks
        blocks.obs.write(obs)  # type: ignore[call-arg]
        self.loop.submit(slot)

    async def _load(self, message: Message) -> ServerApplied:
        policy = self.policy
        if not isinstance(policy, nn.Module):
            return ServerApplied(error=f"the served policy is a {type(policy).__name__}, which "
                                       "has no weights to update")
        try:
            state = decode(ServerWeights, message.body).state
        except ProtocolError as exc:
            return ServerApplied(error=str(exc))

        def apply() -> None:
            with torch.no_grad():
                policy.load_state_dict(state)

        try:
            version = await self.loop.update(apply)
        except Exception as exc:  # a mismatch is the caller's error, not the run's
            return ServerApplied(error=f"{type(exc).__name__}: {exc}")
        return ServerApplied(version=version)

    async def _report(self, trainer: Link) -> None:
        sent = -1
        while True:
            await anyio.sleep(STATS_INTERVAL)
            stats = self.loop.statistics()
            if stats.calls != sent:
                sent = stats.calls
                report = ServerStatistics(stats.calls, stats.observations,
                                          sorted(stats.batch_sizes.items()))
                await trainer.send(report.to_body(), kind=ServerStatistics.KIND)

    def close(self) -> None:
        loop: InferenceLoop | None = getattr(self, "loop", None)  # None: failed to build
        if loop is not None:
            loop.stop()
            loop.close()
        for blocks in self.blocks.values():
            for block in (blocks.obs, blocks.act):
                block.close()  # the trainer unlinks them
        for bell in (self.config.request_bell, *self.config.answer_bells.values()):
            bell.close()  # this process's copies


async def run_inference_server(trainer_endpoint: str, identity: bytes, config: ServerConfig,
                               parent_pid: int | None = None) -> int:
    """The process's life: connect, build, serve; 0 on a requested close, 1 on an error."""
    return await serve_linked(trainer_endpoint, identity, config, parent_pid,
                              lambda trainer: _serve(trainer, config))


async def _serve(trainer: Link, config: ServerConfig) -> int:
    server: InferenceServer | None = None
    try:
        server = await anyio.to_thread.run_sync(InferenceServer, config)
        return await server.serve(trainer)
    except Exception as exc:  # building the server, or binding its hub
        return await report_error(trainer, exc)
    finally:
        if server is not None:
            server.close()


async def report_error(trainer: Link, exc: BaseException) -> int:
    """Send the trainer the error that ends this process; the exit code (never raises).

    0 when the error is the trainer's loss: there is nobody to report to.
    """
    exc = ending_error(exc)
    if isinstance(exc, PeerLostError):
        return 0
    log.debug("the inference process failed", exc_info=exc)
    with anyio.move_on_after(2):
        try:
            await trainer.send(ErrorPayload.from_exception(exc).to_body(), kind=ERROR_KIND)
        except Exception:  # the trainer is gone
            pass
    return 1


def inference_server_main(trainer_endpoint: str, identity: bytes, config: ServerConfig,
                          backend: str, parent_pid: int) -> None:
    """Entry point of the inference process (started by ``WorkerProcesses``)."""
    logging.basicConfig(level=logging.WARNING, format="inference %(process)d: %(message)s")
    torch.set_num_threads(config.threads)
    remember_absent_modules()  # our own process: tensordict's per-call probe answered at once
    run: Callable[[], Any] = lambda: run_inference_server(  # noqa: E731
        trainer_endpoint, identity, config, parent_pid)
    exit_process(anyio.run(run, backend=backend))


__all__ = ["InferenceServer", "ServerConfig", "inference_server_main", "run_inference_server"]
