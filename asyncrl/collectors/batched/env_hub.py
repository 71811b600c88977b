"""AsyncBatchedCollector's env workers on its hub: who joins, what they send, how they end.

The collector's face (:mod:`.collector`) opens the hub and cuts batches; this runs
the env workers' side of it. Every env worker, local or remote, says the one hello
(``role="env"``), passes the one :class:`~asyncrl._coordinator.admission.Admission`
(:func:`~asyncrl._inference.env_admission.env_admission`), sits in the one
:class:`~asyncrl._coordinator.records.Roster` and is a record of the one
:class:`~asyncrl._coordinator.registry.WorkerRegistry` a MultiCollector keeps: its rows
of ``statistics().workers`` and its ``joined`` / ``refused`` / ``left`` / ``lost``
events. An env worker is named by its slot there (index ``SLOT``, name ``env-SLOT``:
the ``worker_id`` of its frames).

:meth:`EnvHub.dispatch` routes what the hub receives: the inference process's
messages to its server, a remote env host's to
:class:`~asyncrl._inference.remote_env_hosts.RemoteEnvWorkers`, a local env worker's
hello to :meth:`EnvHub._join_local` and its error report to the run's failure. A
local worker's chunks come through its shared-memory ring
(:meth:`EnvHub.read_local_chunks`), a remote host's as messages; both land in the
collector's :class:`~asyncrl._inference.chunk_buffer.ChunkBuffer`, whose counts are
the rows' frames and batches (chunks). A local worker's silence, error or exit
fails the run (its envs are gone); a remote host's only drops it.

>>> from asyncrl._inference.chunk_buffer import ChunkBuffer
>>> from asyncrl._inference.local_channels import LocalChannels
>>> face = FaceHooks(fail=print, wake=lambda: None, closing=lambda: False,
...                  room=lambda: True, update_room=lambda: None)
>>> hub = EnvHub(num_workers=2, chunk_steps=8, peer_timeout=10.0, publish=print, face=face,
...              frames=ChunkBuffer(chunk_steps=8, capacity=64, trajectories=False),
...              channels=LocalChannels())
>>> hub.rows(None, None)   # nobody admitted yet, no process started
[]
"""

from __future__ import annotations

import logging
import secrets
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from typing import Any

import torch

from transports import ErrorPayload, Hub, Message, PeerEvent, ProtocolError, random_identity

from ..._coordinator.actions import Send
from ..._coordinator.admission import Admission
from ..._coordinator.records import Roster, WorkerInfo
from ..._coordinator.registry import WorkerRegistry
from ..._errors import BadBatchError, WorkerLostError, rebuild_remote_exception
from ..._inference.chunk_buffer import ChunkBuffer
from ..._inference.chunk_ring import TornChunkError
from ..._inference.env_admission import env_admission
from ..._inference.info_columns import InfoColumn
from ..._inference.local_channels import LocalChannels
from ..._inference.outputs import OutputLayout
from ..._inference.policy_server import PolicyServer
from ..._inference.remote_env_hosts import RemoteEnvWorkers, env_layout
from ..._observe.events import CollectorEvent
from ..._observe.statistics import WorkerStatistics
from ..._protocol import EnvClose, EnvWelcome, Hello, Refuse, decode
from ..._protocol.central_inference import ERROR_KIND, dtype_name
from ..._spawn.processes import WorkerProcesses, describe_exit

__all__ = ["EnvHub", "FaceHooks"]

log = logging.getLogger("asyncrl.collectors")

Path = tuple[str, ...]


@dataclass(frozen=True)
class FaceHooks:
    """What the env workers' side asks of the collector's face (all on its event loop)."""

    #: The run must stop with this error (the first one is what the user sees).
    fail: Callable[[BaseException], None]
    #: Frames came (or an error): wake a waiting batch.
    wake: Callable[[], None]
    #: Whether the collector is closing: env workers ending then is expected.
    closing: Callable[[], bool]
    #: Whether the env workers may be answered (room for frames, not paused).
    room: Callable[[], bool]
    #: Tell the server whether there is room now (back-pressure).
    update_room: Callable[[], Awaitable[None]]


class EnvHub:
    """The env workers of one AsyncBatchedCollector on its hub: admission, roster,
    registry, and every message they send.

    Made with the collector; :meth:`setup` (in a thread, once the env's layouts are
    known) makes the admission, names the local workers' identities and the remote
    slots; the collector's background task runs :meth:`dispatch` and
    :meth:`read_local_chunks` on the open hub, and its process watcher calls
    :meth:`on_process_exit`.
    """

    def __init__(self, *, num_workers: int, chunk_steps: int, peer_timeout: float,
                 frames: ChunkBuffer, channels: LocalChannels,
                 publish: Callable[[CollectorEvent], None], face: FaceHooks) -> None:
        self.num_workers = num_workers
        self.chunk_steps = chunk_steps
        self._peer_timeout = peer_timeout
        self._frames = frames  # the collector's: chunks in, batches out
        self._channels = channels  # the local workers' blocks, bells and rings
        self._face = face
        #: A local env worker's hello proves its spawn with it.
        self.token = secrets.token_hex(16)
        #: Every env worker, local and remote, is admitted into this one roster (by the
        #: one admission, made once the layouts are known: :meth:`setup`).
        self.roster = Roster()
        self.admission: Admission | None = None
        #: Every env worker admitted, live and lost: statistics() rows and events.
        self.registry = WorkerRegistry(publish)
        self.remote: RemoteEnvWorkers | None = None
        #: Set by the collector: its server once built, its hub once open.
        self.server: PolicyServer | None = None
        self.hub: Hub | None = None
        #: The local workers' identities (named before they start) and each slot's peer.
        self.slot_of: dict[bytes, int] = {}
        self.peer_of: dict[int, bytes] = {}
        #: Each slot's admitted occupant (a local worker, or the remote host sitting there).
        self._occupant: dict[int, WorkerInfo] = {}
        self._admitted: set[bytes] = set()  # the inference process's peers, admitted once

    def setup(self, obs: dict[Path, torch.Tensor], outputs: OutputLayout, *, max_envs: int,
              remote_workers: int, env_id: Any,
              submit_remote: Callable[[int], Awaitable[None]],
              version: Callable[[], int], infos: Sequence[InfoColumn] = (),
              compact_obs: bool = False) -> None:
        """The admission, the local workers' identities, the remote slots (in a thread:
        called while the server is built). ``max_envs``: the collector's
        ``max_batch_size``; ``env_id``: its env, offered to a host that lacks it;
        ``compact_obs``: the remote hosts' chunks hold no ``("next", obs)`` twins."""
        self.admission = env_admission(
            self.roster, env_layout(obs, outputs, 1), max_envs=max_envs,
            first_remote_index=self.num_workers, remote_workers=remote_workers,
            token=self.token, env_id=env_id, infos=[path for path, _, _ in infos])
        for slot in range(self.num_workers):  # named here: the inference process knows them
            ident = random_identity(f"env-{slot}")
            self.slot_of[ident] = slot
            self.peer_of[slot] = ident
        if remote_workers:
            self.remote = RemoteEnvWorkers(
                remote_workers, first_slot=self.num_workers, obs=obs, outputs=outputs,
                chunk_steps=self.chunk_steps, max_envs=max_envs,
                blocks=self._channels.blocks, submit=submit_remote,
                on_chunk=self._on_chunk, register=self._register_remote, version=version,
                registry=self.registry, admission=self.admission, roster=self.roster,
                infos=infos, compact_obs=compact_obs)

    # -- what the hub receives ---------------------------------------------------------------
    async def dispatch(self, hub: Hub) -> None:
        """Route every message (and peer event) of the hub, until it closes."""
        face = self._face
        async for item in hub:
            found = self.slot_of.get(item.peer)
            if found is None and self.server is not None and self.server.owns(item.peer):
                if hub.admission and item.peer not in self._admitted:
                    self._admitted.add(item.peer)  # our own child: full message sizes
                    hub.admit(item.peer)
                await self.server.receive(item)
                continue
            if found is None:
                if self.remote is not None and not face.closing():
                    await self.remote.handle(hub, item)  # a remote env worker, or a stranger
                    if self.server is not None and not face.room():
                        # Back-pressure: no more answers until a batch is taken.
                        await self.server.set_room(False)  # (a chunk filled the buffer)
                continue  # without listen the socket is private: not one of ours
            if isinstance(item, PeerEvent):
                if item.event == "lost" and not face.closing() and not self.server_gone():
                    reason = (f"went silent for {self._peer_timeout} s (peer_timeout): it is "
                              "stuck or its host is gone")
                    self._lost_local(item.peer, reason)
                    face.fail(WorkerLostError(f"env worker {found} {reason}"))
                continue
            slot = found
            if self.roster.live(item.peer) is None:  # not joined yet: its hello, or nothing
                await self._join_local(hub, item, slot)
            elif item.kind == ERROR_KIND:  # (its chunks come through its ring)
                self._on_error(slot, item)

    async def _join_local(self, hub: Hub, message: Message, slot: int) -> None:
        """A local env worker's hello: through the one admission (its slot, its spawn
        token), into the one roster and registry, welcomed. Our own child: whatever else it
        sends first, or a refusal, is a fault of this collector's making and ends the run."""
        assert self.admission is not None
        if message.kind == ERROR_KIND:  # (it failed before its hello: say why)
            self._on_error(slot, message)
            return
        try:
            if message.kind != Hello.KIND:
                raise ProtocolError(f"expected its {Hello.KIND!r} first, got "
                                    f"{str(message.kind)[:64]!r}")
            hello = decode(Hello, message.body)
            refusal = self.admission.refusal(message.peer, hello)
            if refusal:
                raise ProtocolError("; ".join(a.message.reason for a in refusal if isinstance(
                    a, Send) and isinstance(a.message, Refuse)))
        except ProtocolError as exc:
            self._face.fail(BadBatchError(f"env worker {slot} could not join: {exc}"))
            return
        worker = self.admission.admit(message.peer, hello)
        worker.name = f"env-{slot}"  # (its index is its slot: its hello's)
        self._occupant[slot] = worker
        self.registry.joined(worker)
        if hub.admission:
            hub.admit(message.peer)  # our own child: full message sizes
        act = self._channels.blocks[slot].act.layout
        welcome = EnvWelcome(
            slot=slot, traj_tag=slot, chunk_steps=self.chunk_steps, obs_paths=[], extra_paths=[],
            act={k: (dtype_name(d), list(s)) for k, (d, s) in act.items()},  # type: ignore[misc]
            index=worker.index, attempt=hello.attempt)
        try:
            await hub.send(message.peer, welcome.to_body(), kind=EnvWelcome.KIND)
        except Exception as exc:  # gone meanwhile (stopped, or died): its exit says the rest
            log.debug("could not welcome env worker %d: %r", slot, exc)

    def _on_error(self, slot: int, message: Message) -> None:
        try:
            payload = ErrorPayload.from_body(message.body, "env worker error")
        except ProtocolError as exc:
            self._face.fail(BadBatchError(
                f"env worker {slot} sent a malformed error report: {exc}"))
            return
        self._face.fail(rebuild_remote_exception(payload, peer=f"env worker {slot}"))

    # -- chunks ------------------------------------------------------------------------------
    async def read_local_chunks(self) -> None:
        """Take the local env workers' chunks from their rings whenever the chunk bell rings."""
        try:
            await self._channels.read_chunks(self._frames, self._after_chunks)
        except TornChunkError as exc:
            self._face.fail(BadBatchError(str(exc)))

    async def _after_chunks(self) -> None:
        """Chunks came: back-pressure once the buffer is full, and wake a waiting batch."""
        if not self._face.room():
            await self._face.update_room()  # no more answers until a batch is taken
        self._face.wake()

    def _on_chunk(self, slot: int, message: Message) -> None:
        """A remote host's chunk, decoded and checked (:class:`RemoteEnvWorkers`)."""
        problem = self._frames.add(slot, message.body, self._channels.blocks[slot].rows)
        if problem is not None:
            self._face.fail(BadBatchError(problem))
            return
        self._face.wake()  # (back-pressure: the dispatcher holds the server once it is full)

    # -- remote slots ------------------------------------------------------------------------
    def _register_remote(self, slot: int, worker: WorkerInfo | None) -> None:
        """A new occupant of remote ``slot`` (or none): what the old one sent stays in its
        row; its pieces of trajectories are lost."""
        old = self._occupant.pop(slot, None)
        if old is not None:
            self._count(slot, old)
        self._frames.forget(slot)
        if worker is not None:
            self._occupant[slot] = worker
            self.peer_of[slot] = worker.peer
        else:
            self.peer_of.pop(slot, None)

    async def reply_remote(self, slot: int, version: int) -> None:
        """A remote env worker's answer, written in its block by the server (local ones are
        rung by the loop itself)."""
        assert self.remote is not None and self.hub is not None
        await self.remote.reply(self.hub, slot, version)  # its occupant, or nobody

    # -- losses ------------------------------------------------------------------------------
    def server_gone(self) -> bool:
        # An env worker ends when the inference process does: the process's own
        # report (its error, or its exit) is the cause the user must see.
        return self.server is not None and self.server.gone

    def _lost_local(self, peer: bytes, reason: str) -> None:
        worker = self.roster.live(peer)
        if worker is not None:
            self._count(worker.index, worker)
            worker.alive = False
            self.registry.check_lost(reason)

    async def on_process_exit(self, slot: int, process: BaseProcess) -> bool:
        """A local env worker's process ended: its row is lost, with its exit code, and
        the run fails (its envs are gone) unless the collector is closing. Never respawned."""
        closing = self._face.closing()
        self._exited(slot, process, announce=not closing)
        if not closing and not self.server_gone():
            self._face.fail(WorkerLostError(
                f"env worker {slot} (pid {process.pid}) {describe_exit(process.exitcode)} "
                "while collecting; its envs are gone, so this collector stops. If it failed "
                "before reporting an error, look at its stderr."))
        return False

    def processes_ended(self, workers: WorkerProcesses) -> None:
        """Once the collector stopped them: each ended local process's row is lost, with
        its exit code (without an event: the collector stopped it)."""
        for slot, process in workers.slots.items():
            if process.exitcode is not None:
                self._exited(slot, process, announce=False)

    def _exited(self, slot: int, process: BaseProcess, *, announce: bool) -> None:
        worker = self._occupant.get(slot)
        if worker is not None and worker.pid == process.pid:
            self._count(slot, worker)
        reason = describe_exit(process.exitcode)
        if not announce:
            reason = f"stopped as the collector closed: it {reason}"
        self.registry.exited(process.pid or 0, process.exitcode, reason, announce=announce)

    # -- rows --------------------------------------------------------------------------------
    def _count(self, slot: int, worker: WorkerInfo) -> None:
        """Copy what ``slot``'s worker sent (chunks, frames, when) into its row: read from
        the buffer's counts when asked, so nothing is counted per chunk."""
        sent = self._frames.counts.get(slot)
        record = self.registry.record(worker)
        if sent is None or record is None:
            return
        worker.delivered = sent.chunks
        record.frames, record.last_batch = sent.frames, sent.last

    def rows(self, workers: WorkerProcesses | None, hub: Hub | None) -> list[WorkerStatistics]:
        """``statistics().workers``: every env worker admitted (lost ones too), by index
        (its slot), and the local processes still joining (``env-SLOT``)."""
        for slot, worker in self._occupant.items():
            if worker.alive:
                self._count(slot, worker)
        joining = [] if workers is None else [
            (slot, process.pid, socket.gethostname()) for slot, process in workers.slots.items()
            if process.pid is not None and process.is_alive()]
        return self.registry.statistics(heard=None if hub is None else hub.last_heard,
                                        joining=joining, joining_name="env")

    # -- close -------------------------------------------------------------------------------
    async def say_close(self, hub: Hub) -> None:
        """Tell every env worker with a slot to stop (best effort: one gone already is)."""
        for peer in list(self.peer_of.values()):
            try:
                await hub.send(peer, None, kind=EnvClose.KIND)
            except Exception:  # gone already
                pass
