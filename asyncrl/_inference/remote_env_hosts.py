"""Remote env hosts of AsyncBatchedCollector: their join, and every message they send, checked.

With ``listen="tcp://HOST:PORT"`` and ``remote_workers=K`` the collector's hub
listens on the network and up to K env workers (``asyncrl worker --role env``) join
it at a time. They join as every worker does: the one :class:`~asyncrl._protocol.Hello`
(``role="env"``, its ``specs`` its envs' layout: :class:`~asyncrl._protocol.EnvLayout`),
judged by the one :class:`~asyncrl._coordinator.admission.Admission` (protocol, role,
layout, ``remote_workers``, the registered id's import path for a host that lacks it)
into its one roster, refused with the one :class:`~asyncrl._protocol.Refuse`. What is
central inference's own: an admitted host gets a slot of the inference loop
(:mod:`.slot_occupants`) and two :class:`~asyncrl._inference.inline_blocks.InlineBlock`
s the loop reads and writes like shared memory, and its welcome says so
(:class:`~asyncrl._protocol.EnvWelcome`). Every message is decoded once, by its
declared kind (:mod:`asyncrl._protocol.central_inference`), bounded by what was agreed
at join, before it reaches the loop or a batch.

The rule for a remote worker that breaks the agreement (a wrongly shaped
observation, a malformed chunk, a second request before its answer) or goes
silent: it is told why (``refuse``), dropped, logged, and listed in
:attr:`RemoteEnvWorkers.refusals`; collection goes on with the other workers.
A remote host never stops the run, and never reaches the policy with bad data.
Its slot is free again for the next admitted host (nothing of the old occupant, its
request in the loop or its traj_ids, reaches the new one); the old identity is a
stranger again: whatever it sends is refused.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from transports import (
    CurveClient,
    CurveServer,
    Hub,
    Message,
    PeerEvent,
    ProtocolError,
    RateLimitedLog,
    parse_endpoint,
    peer_name,
    printable,
)

from .._coordinator.actions import Send
from .._coordinator.admission import Admission
from .._coordinator.records import Roster, WorkerInfo
from .._coordinator.registry import WorkerRegistry
from .._coordinator.worker_logs import WorkerLogs
from .._protocol import (
    EnvChunk,
    EnvLayout,
    EnvWelcome,
    ErrorReport,
    Hello,
    Observations,
    Refuse,
    ServedCall,
    WorkerLog,
    decode,
)
from .info_columns import InfoColumn
from .inline_blocks import InlineBlock, dtype_name
from .outputs import OutputLayout
from .slot_occupants import SlotOccupants
from .worker_blocks import WorkerBlocks

log = logging.getLogger("asyncrl.collectors")

Path = tuple[str, ...]


@dataclass(frozen=True)
class _EnvHost:
    """A remote env host, as its forwarded log records name it (see ``WorkerLogs``)."""

    peer: bytes
    index: int  # its slot
    name: str
    host: str
    pid: int


def env_layout(obs: dict[Path, torch.Tensor], outputs: OutputLayout, envs: int) -> EnvLayout:
    """The layout of ``envs`` of this collector's envs (a hello's ``specs``, ``role="env"``)."""
    dtype, shape = outputs.action
    entries: list[Any] = [(dtype_name(t.dtype), list(t.shape[1:])) for t in obs.values()]
    action: Any = (dtype_name(dtype), list(shape))
    return EnvLayout(envs=envs, obs=entries, action=action)


class RemoteEnvWorkers:
    """The remote slots ``first_slot ..`` of one collector, and what each must send.

    ``admission`` is the collector's one admission (its role ``"env"``) over ``roster``:
    it judges every hello, this class places the admitted ones in the inference loop and
    tells ``registry`` (``statistics()`` rows, events) who joined, was refused, left or
    was lost. A host is named by its slot there (index ``SLOT``, name ``env-SLOT``: the
    ``worker_id`` of its frames), as it is in its welcome.
    """

    def __init__(self, count: int, *, first_slot: int, obs: dict[Path, torch.Tensor],
                 outputs: OutputLayout, chunk_steps: int, max_envs: int,
                 blocks: dict[int, WorkerBlocks], submit: Callable[[int], Awaitable[None]],
                 on_chunk: Callable[[int, Message], None],
                 register: Callable[[int, WorkerInfo | None], None],
                 version: Callable[[], int], registry: WorkerRegistry, admission: Admission,
                 roster: Roster, infos: Sequence[InfoColumn] = (),
                 compact_obs: bool = False) -> None:
        self.count = count
        self.first_slot = first_slot
        self.obs_paths = list(obs)
        self.obs_spec = [(t.dtype, tuple(t.shape[1:])) for t in obs.values()]
        self.outputs = outputs
        self.chunk_steps = chunk_steps
        self.max_envs = max_envs
        #: The info columns (``info_keys``) every chunk holds: in each welcome, whole.
        self.infos = list(infos)
        #: ``compact_obs=True``: chunks without the ``("next", obs)`` twins (in each welcome).
        self.compact_obs = compact_obs
        self.blocks = blocks
        self._submit, self._on_chunk, self._register = submit, on_chunk, register
        self._version = version
        self.admission = admission
        self.roster = roster  # the admission's
        #: Every host admitted (statistics() rows, joined / refused / left / lost events).
        self.registry = registry
        self.slots = SlotOccupants(first_slot, count)
        self.slot_of = self.slots.slot_of  # peer -> slot, welcomed peers only
        #: Why each refused or dropped remote worker was (most recent last).
        self.refusals: list[str] = []
        # A stranger may try again and again: one warning line per reason and 5 s.
        self._limited = RateLimitedLog(log)
        #: Admitted hosts' log records, re-emitted into the trainer's ``asyncrl.worker``.
        self.logs = WorkerLogs()
        #: The served modules an admitted host's envs may call (their routes' configs, in
        #: its welcome) and the service its ``served_call`` messages go to, with the live
        #: admitted worker that sent each (set by the collector once its hub is open).
        self.served_routes: list[dict[str, Any]] = []
        self.served_call: Callable[[WorkerInfo | None, Message], Awaitable[None]] | None = None

    async def handle(self, hub: Hub, item: Message | PeerEvent) -> None:
        """A message (or event) from a peer that is not a local env worker; never raises."""
        try:
            await self._handle(hub, item)
        except Exception as exc:  # whatever a peer sends must not stop the dispatcher
            log.warning("remote env worker %r: %r", item.peer, exc)
            try:
                self._drop(hub, item.peer, f"failed: {exc!r}")
            except Exception:  # pragma: no cover - expel of a forgotten peer
                pass

    async def _handle(self, hub: Hub, item: Message | PeerEvent) -> None:
        if isinstance(item, PeerEvent):
            if item.event == "lost" and self._known(item.peer):
                if item.reason == "goodbye":  # it said so (SIGTERM to its host): a departure
                    self._drop(hub, item.peer, "left (it said goodbye)", left=True)
                elif item.reason == "disconnected":
                    self._drop(hub, item.peer, "lost: its connection closed (its process "
                               "died)")
                else:
                    self._drop(hub, item.peer, "went silent (peer_timeout): its host is gone")
            return
        slot = self.slot_of.get(item.peer)
        try:
            if item.peer in self.slots.queued:
                raise ProtocolError(f"sent {printable(str(item.kind), limit=64)!r} before its "
                                    "welcome")
            if slot is None:
                await self._join(hub, item)
            elif item.kind == Observations.KIND:
                await self._on_obs(item, slot)
            elif item.kind == EnvChunk.KIND:
                self._on_chunk_message(item, slot)
            elif item.kind == ErrorReport.KIND:
                report = decode(ErrorReport, item.body)
                self._drop(hub, item.peer, f"reported an error: {report.error.type}: "
                           f"{report.error.message}")
            elif item.kind == WorkerLog.KIND:
                self._on_log(item, slot)
            elif item.kind == ServedCall.KIND and self.served_call is not None:
                await self.served_call(self.roster.live(item.peer), item)  # never raises
            else:
                raise ProtocolError(f"unexpected message kind "
                                    f"{printable(str(item.kind), limit=64)!r}")
        except ProtocolError as exc:  # whatever it sent, and however: it is refused
            await self.refuse(hub, item.peer, str(exc))

    def _known(self, peer: bytes) -> bool:
        return peer in self.slot_of or peer in self.slots.queued

    async def _join(self, hub: Hub, message: Message) -> None:
        if message.kind != Hello.KIND:
            raise ProtocolError(f"a remote env worker must first send {Hello.KIND!r} (role "
                                f"'env'), got {printable(str(message.kind), limit=64)!r}")
        peer, hello = message.peer, decode(Hello, message.body)
        refusal = self.admission.refusal(peer, hello)
        if refusal:
            for action in refusal:
                if isinstance(action, Send) and isinstance(action.message, Refuse):
                    await self._send_refusal(hub, peer, action.message, hello)
                    if action.message.env_source is None:  # (else: an offer, hello again)
                        self._drop(hub, peer, f"refused: {action.message.reason}")
            return
        envs = EnvLayout.from_specs(hello.specs, max_envs=self.max_envs).envs  # checked above
        worker = self.admission.admit(peer, hello)
        placed = self.slots.place(peer, (worker, envs, hello.attempt))
        if placed is None:  # (the admission counts live hosts: never more than the slots)
            raise ProtocolError(f"all {self.count} remote_workers slots are taken; raise "
                                "remote_workers to admit more")
        if placed[1]:
            await self._welcome(hub, peer, placed[0], (worker, envs, hello.attempt))
        else:  # welcomed once the loop has answered the slot's last occupant (to nobody)
            log.info("remote env worker %r waits for slot %d: its last request is still being "
                     "served", peer, placed[0])

    async def _welcome(self, hub: Hub, peer: bytes, slot: int,
                       admitted: tuple[WorkerInfo, int, int]) -> None:
        """Give ``peer`` the free ``slot``: fresh blocks, a fresh traj tag, its welcome.
        ``admitted``: its roster entry, number of envs and hello's attempt."""
        worker, envs, attempt = admitted
        try:
            self.slots.next_tag(slot)
        except OverflowError as exc:
            await self.refuse(hub, peer, str(exc))
            return
        obs = {f"o{i}": (d, (envs, *s)) for i, (d, s) in enumerate(self.obs_spec)}
        act = {k: (t.dtype, tuple(t.shape))
               for k, t in self.outputs.block_tensors(envs).items()}
        self.blocks[slot] = WorkerBlocks(envs, InlineBlock(obs), InlineBlock(act))  # type: ignore[arg-type]
        hub.admit(peer)
        tag = self.slots.occupy(peer, slot)
        # Named by its slot from now on, as its frames are (worker_id): its row, its events.
        worker.index, worker.name = slot, f"env-{slot}"
        self._register(slot, worker)
        welcome = EnvWelcome(
            slot=slot, traj_tag=tag, chunk_steps=self.chunk_steps,
            obs_paths=[list(p) for p in self.obs_paths],
            extra_paths=[list(p) for p, _, _ in self.outputs.extras],
            act={k: (dtype_name(d), list(s)) for k, (d, s) in act.items()},  # type: ignore[misc]
            index=worker.index, attempt=attempt, served=list(self.served_routes),
            infos=[(list(p), d, list(s)) for p, d, s in self.infos],  # type: ignore[misc]
            compact_obs=self.compact_obs)
        await hub.send(peer, welcome.to_body(), kind=EnvWelcome.KIND)
        log.info("remote env worker %r joined as slot %d (traj tag %d) with %d env(s)", peer,
                 slot, tag, envs)
        self.registry.joined(worker)

    async def _on_obs(self, message: Message, slot: int) -> None:
        if slot in self.slots.waiting:
            raise ProtocolError("sent a second request before its answer")
        block = self.blocks[slot].obs
        request = decode(Observations, message.body, layout={
            k: (dtype_name(d), s) for k, (d, s) in block.layout.items()})
        block.write(request.arrays)  # type: ignore[call-arg]
        self.slots.waiting.add(slot)
        await self._submit(slot)

    async def reply(self, hub: Hub, slot: int, version: int) -> None:
        """Send a remote slot's occupant its outputs (inline), written by the loop into its
        block; the answer to a dropped occupant goes to nobody, and frees the slot. Never raises."""
        peer = self.slots.answered(slot)
        try:
            if peer is not None:
                block = self.blocks[slot].act
                await hub.send(peer, {"v": version, "a": block.tensors}, kind="act")  # type: ignore[attr-defined]
            elif slot not in self.slots.peer_at and (queued := self.slots.take_queued(slot)):
                await self._welcome(hub, queued[0], slot, queued[1])
        except Exception as exc:  # gone meanwhile: its loss (or a refusal) says the rest
            log.debug("could not answer remote env worker slot %d: %r", slot, exc)

    def _on_log(self, message: Message, slot: int) -> None:
        """Its records, into the trainer's ``asyncrl.worker`` logger (bounded, rate-limited)."""
        worker = self.roster.live(message.peer)
        if worker is None:
            return
        records = decode(WorkerLog, message.body)
        self.logs.emit(_EnvHost(worker.peer, slot, worker.name, worker.host, worker.pid),
                       records)

    def _on_chunk_message(self, message: Message, slot: int) -> None:
        schema = self.schema(self.blocks[slot].rows)
        try:
            chunk = decode(EnvChunk, message.body, schema=schema, tag=self.slots.tags[slot],
                           max_version=self._version())
        except ProtocolError as exc:
            raise ProtocolError(f"{exc}{self._infos_hint(message.body)}"
                                f"{self._twins_hint(message.body)}") from None
        chunk.data.get(("collector", "worker_id")).fill_(slot)  # whatever it claimed
        self._on_chunk(slot, message)

    def _infos_hint(self, body: Any) -> str:
        """Why a chunk may lack the asked info entries: a host that ignored its welcome's."""
        keys = body.keys(include_nested=True, leaves_only=True) if hasattr(body, "keys") else []
        got = {(k,) if isinstance(k, str) else tuple(k) for k in keys}
        missing = [("next", *p) for p, _, _ in self.infos if ("next", *p) not in got]
        if not missing:
            return ""
        return (f"; it lacks {missing[:8]}, the info entries this collector's info_keys "
                "asked for in its welcome: a host of an earlier asyncrl release ignores "
                "them, run the trainer's release there")

    def _twins_hint(self, body: Any) -> str:
        """Why a chunk may hold ``("next", obs)`` under ``compact_obs``: an earlier release."""
        keys = body.keys(include_nested=True, leaves_only=True) if hasattr(body, "keys") else []
        got = {(k,) if isinstance(k, str) else tuple(k) for k in keys}
        twins = [("next", *p) for p in self.obs_paths if ("next", *p) in got]
        if not self.compact_obs or not twins:
            return ""
        return (f"; it holds {twins[:8]}, which this collector's compact_obs=True told it in "
                "its welcome to leave out: a host of an earlier asyncrl release ignores "
                "that, run the trainer's release there")

    def schema(self, rows: int) -> dict[Path, tuple[torch.dtype, tuple[int, ...]]]:
        """The entries (dtype, shape) of a chunk of ``rows`` envs, as an env worker writes them."""
        return EnvChunk.schema(
            [(p, d, s) for p, (d, s) in zip(self.obs_paths, self.obs_spec, strict=True)],
            [(("action",), *self.outputs.action),
             *((tuple(p), d, tuple(s)) for p, d, s in self.outputs.extras)],
            rows=rows, steps=self.chunk_steps, flag=torch.bool, reward=torch.float32,
            counter=torch.int64,
            infos=[(p, getattr(torch, d), s) for p, d, s in self.infos],
            next_observations=not self.compact_obs)

    async def refuse(self, hub: Hub, peer: bytes, reason: str) -> None:
        """Tell ``peer`` why, then forget it (a stranger again if it comes back)."""
        await self._send_refusal(hub, peer, Refuse(f"remote env worker refused: "
                                                   f"{printable(reason, limit=2000)}"))
        self._drop(hub, peer, f"refused: {printable(reason, limit=2000)}")

    async def _send_refusal(self, hub: Hub, peer: bytes, refuse: Refuse,
                            hello: Hello | None = None) -> None:
        if not self._known(peer):  # (an admitted one is dropped: a loss, not a refusal)
            if hello is None:  # it never said who it is
                self.registry.refused(peer_name(peer), "", refuse.reason)
            else:
                self.registry.refused(hello.name, hello.host, refuse.reason, hello.pid)
        try:
            await hub.send(peer, refuse.to_body(), kind=Refuse.KIND)
        except Exception as exc:  # gone already
            log.debug("could not tell %r it was refused: %r", peer, exc)

    def _drop(self, hub: Hub, peer: bytes, reason: str, *, left: bool = False) -> None:
        slot = self.slots.release(peer)  # free again (once its request is answered)
        worker = self._forget(peer)
        where = f"remote env worker {peer!r}" + ("" if slot is None else f" (slot {slot})")
        if left:  # a departure is no fault: logged, not listed among the refusals
            log.info("%s %s", where, reason)
        else:
            self._limited.warning("admitted" if worker is not None else "stranger", "%s %s",
                                  where, reason)
            self.refusals.append(f"{where} {reason}")
            del self.refusals[:-100]  # bounded: a stranger may try again and again
        hub.expel(peer)
        self.logs.forget(peer)
        if slot is not None:
            self._register(slot, None)  # what it sent stays in its row
            self.registry.check_lost(reason, left=left)

    def _forget(self, peer: bytes) -> WorkerInfo | None:
        """Take ``peer`` off the roster: lost, and forgotten (a host may come and go for
        ever; its row lives on in the registry, which keeps the newest lost ones)."""
        worker = self.roster.workers.pop(peer, None)
        if worker is not None:
            worker.alive = False
        return worker

    def peers(self) -> Sequence[bytes]:
        return list(self.slot_of)


def check_listen(listen: str | None, remote_workers: int) -> None:
    """``remote_workers`` needs ``listen``; ``listen`` is a ZeroMQ tcp endpoint."""
    if remote_workers and listen is None:
        raise ValueError(f"remote_workers={remote_workers} needs listen='tcp://HOST:PORT' "
                         "(port 0 picks one: read collector.endpoint once open)")
    if listen is not None:
        parse_endpoint(listen, argument="listen", bind=True)  # a ValueError naming it
    if listen is not None and not listen.startswith("tcp://"):
        raise ValueError(f"listen={listen!r}: give a tcp endpoint 'tcp://HOST:PORT' for remote "
                         "env hosts (local env workers always use shared memory)")


def hub_keys(listen: str | None, curve_keys: str | None
             ) -> tuple[CurveServer | None, CurveClient | None]:
    """The listening hub's CURVE keys (``curve_keys``, or None: ASYNCRL_CURVE_* variables
    if set), and a pair of their own for the trainer's processes (env workers, the
    inference process), valid for this hub only, as a MultiCollector's local workers get."""
    if listen is None or (curve := CurveServer.load(curve_keys)) is None:
        return None, None
    return curve.with_local_client()

__all__ = ["RemoteEnvWorkers", "check_listen", "hub_keys"]
