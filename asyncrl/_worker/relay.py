"""A host's relay: each weight version crosses the network once per host, not once per worker.

``asyncrl worker --workers K`` runs one :class:`HostRelay` beside its K worker
processes. The relay joins the coordinator as a peer of its own and says
which workers it speaks for; the workers connect to it over ``ipc://`` as well
as to the coordinator. The coordinator then sends each weight version once
to the relay, which forwards the same frames (no copy in the relay) to the
members it names and acks for all of them with the version each applied.
A version streamed in chunks (``ZmqWeightSyncScheme(chunk_bytes=...)``) is
forwarded chunk by chunk as each arrives; only the last chunk is acked.

Only weights go through the relay. Batches, control messages and heartbeats
go straight between each worker and the coordinator: a relay hop would add
latency to every batch and save nothing, since each batch is different (see
``docs/bench/relay.md`` for the measurement). A worker's catch-up copy on
joining also goes direct, ahead of its first collect request on the same socket.

If the relay is lost the coordinator sends to its workers directly again; if
the coordinator is lost or restarted the relay registers again once it
answers.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import anyio

from transports import (
    ClosedResourceError,
    CurveClient,
    ErrorPayload,
    Hub,
    Link,
    Message,
    PeerEvent,
    PeerLostError,
    ProtocolError,
    RateLimitedLog,
    TaskGroupResource,
    Ticket,
    peer_name,
    random_identity,
)

from .._protocol import (
    MAX_RELAY_MEMBERS,
    PROTOCOL,
    RELAY_TO,
    WEIGHTS_KIND,
    Refuse,
    RelayAck,
    RelayAttached,
    RelayHello,
    RelayWelcome,
    WeightMeta,
    WeightsApplied,
    decode,
)
from .join import JOIN_BACKOFF, full_pause

log = logging.getLogger("asyncrl.relay")

#: Sent by the relay to a member once it is attached: its weights may now come this way.
ATTACHED_KIND = RelayAttached.KIND


def relay_identity() -> bytes:
    """``relay-host-pid-random``: the relay's identity on the coordinator's hub."""
    return random_identity(f"relay-{socket.gethostname()}-{os.getpid()}")


@dataclass(frozen=True)
class RelayStatistics:
    """What a relay did so far (see :meth:`HostRelay.statistics`)."""

    registered: bool  # the coordinator accepted it (and did not go away since)
    attached: int  # members connected to it now
    received: int  # weight messages received from the coordinator
    delivered: int  # copies handed to members (received x members, when all are attached)
    failed: int  # member deliveries that failed (error, lost, not attached)


class HostRelay(TaskGroupResource):
    """Receives weights once from the coordinator at ``connect``; fans them out to ``members``.

    ``members`` are the identities of this host's workers; start each with
    ``run_worker(..., identity=member, relay=relay.endpoint, relay_name=relay.name)``.
    ``endpoint`` (default: ``ipc://`` in a private temporary directory) is where
    the members connect. ``curve_keys`` is the workers' key directory, as for
    ``asyncrl worker --keys``. A relay refused only because the run is full (as many
    relays as ``remote_workers`` registered) says hello again, backing off from 0.5 s
    to 8 s, for ``join_timeout`` seconds (None: it does not); any other refusal is
    final. Until it is registered its workers get their weights directly.

    >>> async with HostRelay("tcp://trainer:5555", [b"w0", b"w1"]) as relay:  # doctest: +SKIP
    ...     relay.endpoint              # 'ipc:///tmp/asyncrl-relay-.../relay'
    ...     await run_worker(..., identity=b"w0", relay=relay.endpoint, relay_name=relay.name)
    """

    def __init__(self, connect: str, members: Iterable[bytes], *,
                 name: bytes | None = None, endpoint: str | None = None,
                 heartbeat_interval: float = 1.0, peer_timeout: float = 10.0,
                 curve_keys: str | CurveClient | None = None, max_in_flight: int = 64,
                 join_timeout: float | None = None) -> None:
        self.connect = connect
        self.members = frozenset(members)
        if not 0 < len(self.members) <= MAX_RELAY_MEMBERS:
            raise ValueError(f"a relay serves 1 to {MAX_RELAY_MEMBERS} workers, "
                             f"got {len(self.members)}")
        if not 0 < heartbeat_interval < peer_timeout:
            raise ValueError(f"need 0 < heartbeat_interval < peer_timeout, got "
                             f"{heartbeat_interval} and {peer_timeout}")
        self.name = name or relay_identity()
        self._endpoint = endpoint
        self._channel_options: dict[str, Any] = {"heartbeat_interval": heartbeat_interval,
                                                 "peer_timeout": peer_timeout}
        self._curve_keys = curve_keys
        #: Refused because the run is full: ask again (backing off) for this long; None:
        #: never (as ``asyncrl worker --join-timeout``; any other refusal is final).
        self.join_timeout = join_timeout
        self._in_flight = anyio.Semaphore(max_in_flight)
        # Both sides' input is hostile: what a peer makes the relay log is rate-limited.
        self._limited_log = RateLimitedLog(log)
        self._background = anyio.CancelScope()
        self._stopped = anyio.Event()
        self._began = False  # _run ran its first line (so it will set _stopped)
        self._tmpdir: str | None = None
        self._closed = False
        self._tasks: Any = None
        self.hub: Hub | None = None
        self.link: Link | None = None
        self.refused: str | None = None  # the coordinator's reason, if it refused us
        self._registered = False
        #: The coordinator instance we registered with: weight versions and message
        #: sequence numbers mean something only to that instance.
        self.instance = ""
        self._received = self._delivered = self._failed = 0

    @property
    def endpoint(self) -> str:
        """Where this host's workers connect (available once entered)."""
        if self.hub is None:
            raise RuntimeError("HostRelay is not open: use it with 'async with'")
        return self.hub.endpoint

    def statistics(self) -> RelayStatistics:
        attached = len(self.hub.peers & self.members) if self.hub is not None else 0
        return RelayStatistics(self._registered, attached, self._received, self._delivered,
                               self._failed)

    # -- life cycle --------------------------------------------------------------------
    async def _open(self) -> None:
        await self._task_group.start(self._run)

    async def _run(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        """Owns both sockets and the tasks that use them, so they close in this task."""
        self._began = True
        try:
            with self._background:
                endpoint = self._endpoint
                if endpoint is None:
                    self._tmpdir = tempfile.mkdtemp(prefix="asyncrl-relay-")  # 0700: ours only
                    endpoint = f"ipc://{self._tmpdir}/relay"
                curve = CurveClient.load(self._curve_keys) if self._curve_keys else None
                async with Hub(endpoint, **self._channel_options) as hub, \
                        Link(self.connect, identity=self.name, curve=curve,
                             **self._channel_options) as link:
                    self.hub, self.link = hub, link
                    async with anyio.create_task_group() as tg:
                        self._tasks = tg
                        tg.start_soon(self._serve_members)
                        tg.start_soon(self._serve_upstream)
                        task_status.started()
        finally:
            if self._tmpdir is not None:
                shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._stopped.set()

    async def aclose(self) -> None:
        """Stop relaying and close both sockets (idempotent, bounded)."""
        if self._closed or self._task_group is None:
            return  # closed already, or never opened
        self._closed = True
        self._background.cancel()
        if not self._began:
            # _open was cancelled before _run took its first step: _run never sets
            # _stopped (if it starts later, the cancelled _background ends it at once
            # and the task group's exit waits for that). A shielded wait would hang.
            return
        with anyio.CancelScope(shield=True):
            await self._stopped.wait()

    # -- the coordinator's side ------------------------------------------------------------
    async def _serve_upstream(self) -> None:
        assert self.link is not None
        link = self.link
        while True:
            try:
                await self._register(link)
                while True:
                    await self._on_upstream(link, await link.recv())
            except PeerLostError as exc:
                if link.hub_closed:
                    log.info("relay: the coordinator closed; registering again if it comes back")
                elif self._registered:
                    log.warning("relay: the coordinator is gone (%s); registering again when "
                                "it answers", exc)
                else:
                    log.warning("relay: no coordinator answered at %s; registering when one "
                                "does", self.connect)
                self._registered = False
                await link.wait_connected()

    async def _register(self, link: Link) -> None:
        hello = RelayHello(protocol=PROTOCOL, name=self.name.decode(errors="replace"),
                           host=socket.gethostname(), pid=os.getpid(),
                           members=sorted(self.members))
        deadline = None if self.join_timeout is None else anyio.current_time() + self.join_timeout
        backoff = JOIN_BACKOFF
        while True:
            await link.send(hello.to_body(), kind=RelayHello.KIND)
            refuse = await self._await_welcome(link)
            if refuse is None:
                return
            self.refused = refuse.reason
            if refuse.full and deadline is not None:
                pause, backoff = full_pause(backoff)
                if anyio.current_time() + pause <= deadline:
                    log.warning("relay: the run is full (%s); asking again in %.1f s",
                                refuse.reason, pause)
                    await anyio.sleep(pause)
                    continue
                log.error("relay: the coordinator refused this relay (%s), still full after "
                          "join_timeout %s s; this host's workers get their weights directly",
                          refuse.reason, self.join_timeout)
            else:
                log.error("relay: the coordinator refused this relay (%s); this host's "
                          "workers get their weights directly", refuse.reason)
            while True:  # idle until this coordinator goes (PeerLostError), then retry
                await link.recv()

    async def _await_welcome(self, link: Link) -> Refuse | None:
        """Until the coordinator answers the hello: None (welcomed) or its refusal."""
        while True:
            message = await link.recv()
            if message.kind == RelayWelcome.KIND:
                self._registered, self.refused = True, None
                try:
                    instance = decode(RelayWelcome, message.body).instance
                except ProtocolError as exc:  # never crash on what the network sent
                    log.warning("relay: a malformed welcome (%s); taking it as one from an "
                                "unnamed coordinator instance", exc)
                    instance = ""
                if self.instance and instance != self.instance:
                    log.warning("relay: the coordinator restarted (instance %s, was %s); "
                                "forwards of the old one are dropped", instance, self.instance)
                self.instance = instance
                log.info("relay: registered with %s for %d workers", self.connect,
                         len(self.members))
                return None
            if message.kind == Refuse.KIND:
                try:
                    return decode(Refuse, message.body)
                except ProtocolError as exc:
                    return Refuse(f"a malformed refusal: {exc}")
            await self._on_upstream(link, message)

    async def _on_upstream(self, link: Link, message: Message) -> None:
        if message.kind != WEIGHTS_KIND:
            if message.kind != RelayWelcome.KIND:  # a duplicate welcome is harmless
                self._limited_log.warning("upstream-kind", "relay: ignored a %r message from "
                                          "the coordinator", message.kind)
            return
        try:
            targets, meta, forward = self._targets(message)
        except ProtocolError as exc:
            self._limited_log.warning("bad-weights", "relay: refused a malformed weight "
                                      "message: %s", exc)
            if message.needs_ack:
                await link.ack(message, error=exc)
            return
        hub = self.hub
        assert hub is not None
        if not message.needs_ack:
            # A chunk of a streamed version (only its last one is acked): forwarded at
            # once, in order, so members copy it while the next is on its way here.
            await self._forward_chunk(targets, message, meta, forward)
            return
        await self._in_flight.acquire()  # bounds the forwards awaiting their members' acks
        try:
            if meta.chunk is None or meta.chunk.count == 1:
                self._received += 1  # (a stream counts once, at its first chunk)
            attached = [m for m in targets if m in hub.peers]
            # The same frames go to every member: the relay never copies the weights.
            ticket = await hub.send_async(attached, message.body, kind=WEIGHTS_KIND,
                                          meta=forward)
        except BaseException:
            self._in_flight.release()
            raise
        missing = [m for m in targets if m not in attached]
        # Keep what the ack needs, not the weights: once ZeroMQ sent the frames to
        # every member, their memory is free even while slow members apply them.
        receipt = Message(message.peer, message.kind, message.seq, None,
                          {"instance": self.instance}, message.needs_ack)
        self._tasks.start_soon(self._ack_when_delivered, link, receipt, meta, ticket, missing)

    async def _forward_chunk(self, targets: list[bytes], message: Message,
                             meta: WeightMeta, forward: dict[str, Any]) -> None:
        """Hand a chunk to each attached member; one that is not misses the stream.

        Its member then refuses the stream's last chunk (it lacks the ones before),
        and the relay's ack says so for that member.
        """
        assert self.hub is not None
        if meta.chunk is not None and meta.chunk.index == 0:
            self._received += 1
        for member in targets:
            if member not in self.hub.peers:
                continue
            try:
                await self.hub.send(member, message.body, kind=WEIGHTS_KIND, meta=forward)
            except PeerLostError:
                pass  # gone: the last chunk's ticket reports it

    def _targets(self, message: Message
                 ) -> tuple[list[bytes], WeightMeta, dict[str, Any]]:
        """The members to deliver ``message`` to, its meta as read, and the meta they get.

        The members get the meta whole, as the trainer wrote it (a field this relay
        does not know, a codec's, travels on), less ``relay_to`` and stamped with the
        instance: the relay reads what it routes by, never rebuilds the rest.
        """
        meta = decode(WeightMeta, message.meta)
        if not meta.relay_to:
            raise ProtocolError(f"relayed weights need a {RELAY_TO!r} list of 1 to "
                                f"{MAX_RELAY_MEMBERS} member identities")
        strangers = [m for m in meta.relay_to if m not in self.members]
        if strangers:
            raise ProtocolError(f"relayed weights name workers this relay does not serve: "
                                f"{strangers[:5]!r}; its members are {sorted(self.members)[:5]!r}")
        instance = meta.instance or self.instance  # unsaid: the one we registered with
        if instance != self.instance:
            raise ProtocolError(f"relayed weights from coordinator instance {instance!r}, "
                                f"but this relay registered with {self.instance!r}")
        # Stamped with the instance: members drop what another instance than theirs sent.
        forward = {key: value for key, value in message.meta.items() if key != RELAY_TO}
        forward["instance"] = instance
        return list(dict.fromkeys(meta.relay_to)), meta, forward

    async def _ack_when_delivered(self, link: Link, message: Message, meta: WeightMeta,
                                  ticket: Ticket, missing: list[bytes]) -> None:
        try:
            await ticket.done.wait()  # every member acks, fails, or is lost (its heartbeats)
        finally:
            self._in_flight.release()
        versions: dict[bytes, int] = {}
        failed = {member: ErrorPayload.from_exception(error)
                  for member, error in ticket.errors.items()}
        for member, result in ticket.acks.items():
            try:
                versions[member] = decode(WeightsApplied, result).version
            except ProtocolError as exc:  # the trainer hears of it; never a crash here
                failed[member] = ErrorPayload.from_exception(exc)
        for member in ticket.lost:
            failed[member] = RelayAck.lost("the worker left the relay before applying")
        for member in missing:
            failed[member] = RelayAck.lost("the worker is not attached to the relay")
        self._delivered += len(versions)
        self._failed += len(failed)
        sender, now = message.meta["instance"], link.hub_instance
        if sender != self.instance or (sender and now is not None and now != sender):
            # The coordinator that sent it is gone: its sequence number would name
            # another message of the restarted one there now.
            log.info("relay: dropped the ack of version %s of a previous coordinator",
                     meta.version)
            return
        if message.needs_ack:
            try:
                await link.ack(message, RelayAck(meta.model_id, versions, failed).to_body())
            except ClosedResourceError:
                pass  # closing: the coordinator sees the relay go

    # -- the members' side -----------------------------------------------------------------
    async def _serve_members(self) -> None:
        assert self.hub is not None
        async for item in self.hub:
            if item.peer not in self.members:
                self._refuse_stranger(item.peer)
            elif isinstance(item, PeerEvent):
                await self._on_member_event(item)
            else:
                self._limited_log.warning("member-kind", "relay: ignored a %r message from %r",
                                          item.kind, item.peer)

    def _refuse_stranger(self, peer: bytes) -> None:
        """A peer that is not one of this host's workers: refused and dropped (the hub
        forgets it: no pings, no place among the peers); if it speaks again, again."""
        assert self.hub is not None
        error = ProtocolError(f"{peer_name(peer)} is not one of this host's workers "
                              f"({len(self.members)} members): refused")
        self._limited_log.warning("stranger", "relay: %s", error)
        self.hub.expel(peer)

    async def _on_member_event(self, event: PeerEvent) -> None:
        assert self.hub is not None
        who = peer_name(event.peer)
        if event.event == "joined":
            try:
                await self.hub.send(event.peer, RelayAttached().to_body(), kind=RelayAttached.KIND)
            except PeerLostError:
                pass  # gone again already
        elif event.event == "lost":
            log.info("relay: worker %s left", who)  # a worker that closes says goodbye too
