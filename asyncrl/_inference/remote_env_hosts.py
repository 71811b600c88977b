"""Remote env hosts of AsyncBatchedCollector: join, checks, inline observations and actions.

With ``listen="tcp://HOST:PORT"`` and ``remote_workers=K`` the collector's hub
listens on the network and up to K ``asyncrl env-worker`` processes join it.
A remote worker's hello states its envs' layouts; :class:`RemoteEnvWorkers`
refuses any that differ from this collector's (or that come when every remote
slot is taken), otherwise it admits the peer, gives it a slot and two
:class:`~asyncrl._inference.inline_blocks.InlineBlock` s the inference loop reads and
writes like shared memory. Every ``obs`` message and chunk is checked against
what was agreed before it reaches the loop or a batch.

The rule for a remote worker that breaks the agreement (a wrongly shaped
observation, a malformed chunk, a second request before its answer) or goes
silent: it is told why (``refused``), dropped, logged, and listed in
:attr:`RemoteEnvWorkers.refusals`; collection goes on with the other workers.
A remote host never stops the run, and never reaches the policy with bad data.
Its slot is free again for the next hello (:mod:`.remote_slots`: nothing of the
old occupant, its request in the loop or its traj_ids, reaches the new one); the
old identity is a stranger again, whatever it sends is refused.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from tensordict import TensorDictBase

from transports import (
    CurveClient,
    CurveServer,
    Hub,
    Message,
    PeerEvent,
    ProtocolError,
    RateLimitedLog,
    parse_endpoint,
    printable,
)

from .._coordinator.worker_logs import WorkerLogs
from .._protocol import WorkerLog
from .chunk_buffer import SlotCounts
from .env_stepper import CHUNK, ERROR, OBS, REFUSED
from .inference_loop import OutputLayout, WorkerBlocks
from .inline_blocks import InlineBlock, describe, dtype_name
from .remote_env_stepper import HELLO, JOIN_PROTOCOL, WELCOME
from .remote_members import RemoteMembers
from .remote_slots import RemoteSlots

log = logging.getLogger("asyncrl.collectors")

Path = tuple[str, ...]
_FLAGS = ("done", "terminated", "truncated")


@dataclass(frozen=True)
class _EnvHost:
    """A remote env host, as its forwarded log records name it (see ``WorkerLogs``)."""

    peer: bytes
    index: int  # its slot
    name: str
    host: str
    pid: int


class RemoteEnvWorkers:
    """The remote slots ``first_slot ..`` of one collector, and what each must send."""

    def __init__(self, count: int, *, first_slot: int, obs: dict[Path, torch.Tensor],
                 outputs: OutputLayout, chunk_steps: int, max_envs: int,
                 blocks: dict[int, WorkerBlocks], submit: Callable[[int], Awaitable[None]],
                 on_chunk: Callable[[int, Message], None],
                 register: Callable[[int, bytes | None], SlotCounts | None],
                 version: Callable[[], int], members: RemoteMembers) -> None:
        self.count = count
        self.first_slot = first_slot
        self.obs_paths = list(obs)
        self.obs_spec = [(t.dtype, tuple(t.shape[1:])) for t in obs.values()]
        self.outputs = outputs
        self.chunk_steps = chunk_steps
        self.max_envs = max_envs
        self.blocks = blocks
        self._submit, self._on_chunk, self._register = submit, on_chunk, register
        self._version = version
        #: Who held each slot (statistics() rows, joined / left / lost events).
        self.members = members
        self.slots = RemoteSlots(first_slot, count)
        self.slot_of = self.slots.slot_of  # peer -> slot, admitted peers only
        #: Why each refused or dropped remote worker was (most recent last).
        self.refusals: list[str] = []
        # A stranger may try again and again: one warning line per reason and 5 s.
        self._limited = RateLimitedLog(log)
        #: Admitted hosts' log records, re-emitted into the trainer's ``asyncrl.worker``.
        self.logs = WorkerLogs()

    def expected_hello(self, envs: int) -> dict[str, Any]:
        dtype, shape = self.outputs.action
        return {"protocol": JOIN_PROTOCOL, "envs": envs,
                "obs": [[dtype_name(d), list(s)] for d, s in self.obs_spec],
                "action": [dtype_name(dtype), list(shape)]}

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
            if item.event == "lost" and item.peer in self.slot_of:
                if item.reason == "goodbye":  # it said so (SIGTERM to its host): a departure
                    self._drop(hub, item.peer, "left (it said goodbye)", left=True)
                elif item.reason == "disconnected":
                    self._drop(hub, item.peer, "lost: its connection closed (its process "
                               "died)")
                else:
                    self._drop(hub, item.peer, "went silent (peer_timeout): its host is gone")
            return
        slot = self.slot_of.get(item.peer)
        if item.peer in self.slots.queued:
            await self.refuse(hub, item.peer, f"sent {str(item.kind)[:64]!r} before its welcome")
        elif slot is None:
            await self._join(hub, item)
        elif item.kind == OBS:
            await self._on_obs(hub, item, slot)
        elif item.kind == CHUNK:
            await self._check_chunk(hub, item, slot)
        elif item.kind == ERROR:
            body = str(item.body)[:2000]
            self._drop(hub, item.peer, f"reported an error: {body}")
        elif item.kind == WorkerLog.KIND:
            await self._on_log(hub, item, slot)
        else:
            await self.refuse(hub, item.peer, f"unexpected message kind {item.kind!r}")

    async def _join(self, hub: Hub, message: Message) -> None:
        if message.kind != HELLO:
            await self.refuse(hub, message.peer, f"a remote env worker must first send "
                              f"{HELLO!r}, got {message.kind!r}")
            return
        body = message.body
        envs = body.get("envs") if isinstance(body, dict) else None
        if not isinstance(envs, int) or isinstance(envs, bool) or not 1 <= envs <= self.max_envs:
            await self.refuse(hub, message.peer, f"envs must be an int in 1..{self.max_envs} "
                              f"(max_batch_size), got {str(envs)[:64]}")
            return
        expected = self.expected_hello(envs)
        host, pid = body.get("host", ""), body.get("pid", 0)  # who it says it is: display only
        if not isinstance(host, str) or len(host) > 255 or not isinstance(pid, int) or \
                isinstance(pid, bool) or not 0 <= pid < 1 << 32:
            await self.refuse(hub, message.peer, f"host must be a str of at most 255 "
                              f"characters and pid an int >= 0, got {describe(host)} and "
                              f"{describe(pid)}")
            return
        host = printable(host, limit=255)  # shown in statistics(), events and logs
        layout = {k: v for k, v in body.items() if k not in ("host", "pid")}
        if layout != expected:
            await self.refuse(hub, message.peer, f"its envs do not match this collector's: "
                              f"expected {expected}, got {str(body)[:1000]}")
            return
        placed = self.slots.place(message.peer, (envs, host, pid))
        if placed is None:
            await self.refuse(hub, message.peer, f"all {self.count} remote_workers slots are "
                              "taken; raise remote_workers to admit more")
        elif placed[1]:
            await self._admit(hub, message.peer, placed[0], (envs, host, pid))
        else:  # welcomed once the loop has answered the slot's last occupant (to nobody)
            log.info("remote env worker %r waits for slot %d: its last request is still being "
                     "served", message.peer, placed[0])

    async def _admit(self, hub: Hub, peer: bytes, slot: int,
                     hello: tuple[int, str, int]) -> None:
        """Give ``peer`` the free ``slot``: fresh blocks, a fresh traj tag, its welcome.
        ``hello``: its number of envs, host and pid."""
        envs, host, pid = hello
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
        self._register(slot, peer)
        await hub.send(peer, {
            "slot": slot, "traj_tag": tag, "chunk_steps": self.chunk_steps,
            "obs_paths": [list(p) for p in self.obs_paths],
            "extra_paths": [list(p) for p, _, _ in self.outputs.extras],
            "act": {k: [dtype_name(d), list(s)] for k, (d, s) in act.items()}}, kind=WELCOME)
        log.info("remote env worker %r joined as slot %d (traj tag %d) with %d env(s)", peer,
                 slot, tag, envs)
        self.members.joined(slot, peer, host=host, pid=pid, envs=envs)

    async def _on_obs(self, hub: Hub, message: Message, slot: int) -> None:
        if slot in self.slots.waiting:
            await self.refuse(hub, message.peer, "sent a second request before its answer")
            return
        block = self.blocks[slot].obs
        try:
            block.fill(message.body, "observations")  # type: ignore[attr-defined]
        except ValueError as exc:
            await self.refuse(hub, message.peer, str(exc))
            return
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
                await self._admit(hub, queued[0], slot, queued[1])
        except Exception as exc:  # gone meanwhile: its loss (or a refusal) says the rest
            log.debug("could not answer remote env worker slot %d: %r", slot, exc)

    async def _on_log(self, hub: Hub, message: Message, slot: int) -> None:
        """Its records, into the trainer's ``asyncrl.worker`` logger (bounded, rate-limited)."""
        member = self.members.live.get(slot)
        if member is None:
            return
        try:
            records = WorkerLog.from_body(message.body)
        except ProtocolError as exc:
            await self.refuse(hub, message.peer, f"log: {exc}")
            return
        self.logs.emit(_EnvHost(member.peer, slot, f"env-{slot}", member.host, member.pid),
                       records)

    async def _check_chunk(self, hub: Hub, message: Message, slot: int) -> None:
        chunk = message.body
        rows = self.blocks[slot].rows
        schema = self._schema(rows)
        if not isinstance(chunk, TensorDictBase) or tuple(chunk.batch_size) != (
                rows, self.chunk_steps):
            got = tuple(chunk.batch_size) if isinstance(chunk, TensorDictBase) else describe(chunk)
            await self.refuse(hub, message.peer, f"chunk: expected a TensorDict of batch size "
                              f"{(rows, self.chunk_steps)}, got {got}")
            return
        got_schema = {(k,) if isinstance(k, str) else tuple(k): chunk.get(k)
                      for k in chunk.keys(include_nested=True, leaves_only=True)}
        bad = sorted(str(p) for p in set(schema) ^ set(got_schema)) or sorted(
            f"{p}: expected {dtype_name(d)}{list(s)}, got {describe(got_schema[p])}"
            for p, (d, s) in schema.items()
            if not isinstance(got_schema[p], torch.Tensor) or got_schema[p].dtype != d
            or tuple(got_schema[p].shape) != s)
        traj, tag = got_schema.get(("collector", "traj_ids")), self.slots.tags[slot]
        if not bad and isinstance(traj, torch.Tensor) and bool(((traj >> 32) != tag).any()):
            bad = [f"('collector', 'traj_ids') must carry its traj_tag {tag} in their high "
                   "32 bits (an env host older than this collector ignores it: update asyncrl "
                   "there)"]
        versions = got_schema.get(("collector", "policy_version"))
        if not bad and isinstance(versions, torch.Tensor) and bool(
                ((versions < 0) | (versions > self._version())).any()):
            bad = [f"('collector', 'policy_version') must be versions it was answered with "
                   f"(0..{self._version()}), got up to {int(versions.max())}"]
        if bad:
            await self.refuse(hub, message.peer, f"chunk: wrong entries {bad[:8]}")
            return
        chunk.get(("collector", "worker_id")).fill_(slot)  # whatever it claimed
        self._on_chunk(slot, message)

    def _schema(self, rows: int) -> dict[Path, tuple[torch.dtype, tuple[int, ...]]]:
        """The entries (dtype, shape) of a chunk, as :class:`EnvStepper` writes them."""
        lead = (rows, self.chunk_steps)
        schema: dict[Path, tuple[torch.dtype, tuple[int, ...]]] = {}
        for path, (dtype, shape) in zip(self.obs_paths, self.obs_spec, strict=True):
            schema[path] = schema[("next", *path)] = (dtype, (*lead, *shape))
        dtype, shape = self.outputs.action
        schema[("action",)] = (dtype, (*lead, *shape))
        for path, dt, sh in self.outputs.extras:
            schema[tuple(path)] = (dt, (*lead, *sh))
        for flag in _FLAGS:
            schema[(flag,)] = schema[("next", flag)] = (torch.bool, (*lead, 1))
        schema[("next", "reward")] = (torch.float32, (*lead, 1))
        for name in ("traj_ids", "policy_version", "worker_id"):
            schema[("collector", name)] = (torch.int64, lead)
        return schema

    async def refuse(self, hub: Hub, peer: bytes, reason: str) -> None:
        """Tell ``peer`` why, then forget it (a stranger again if it comes back)."""
        reason = printable(reason, limit=2000)  # it quotes what the peer sent
        if peer not in self.slot_of:
            self.members.refused(f"remote env worker refused: {reason}")
        try:
            await hub.send(peer, f"remote env worker refused: {reason}", kind=REFUSED)
        except Exception as exc:  # gone already
            log.debug("could not tell %r it was refused: %r", peer, exc)
        self._drop(hub, peer, f"refused: {reason}")

    def _drop(self, hub: Hub, peer: bytes, reason: str, *, left: bool = False) -> None:
        slot = self.slots.release(peer)  # free again (once its request is answered)
        where = f"remote env worker {peer!r}" + ("" if slot is None else f" (slot {slot})")
        if left:  # a departure is no fault: logged, not listed among the refusals
            log.info("%s %s", where, reason)
        else:
            self._limited.warning("admitted" if slot is not None else "stranger", "%s %s",
                                  where, reason)
            self.refusals.append(f"{where} {reason}")
            del self.refusals[:-100]  # bounded: a stranger may try again and again
        hub.expel(peer)
        self.logs.forget(peer)
        if slot is not None:
            sent = self._register(slot, None)
            self.members.end(slot, left=left, reason=reason, sent=sent)

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
