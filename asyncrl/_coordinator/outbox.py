"""Doing what the coordinator's state decided: its actions, performed in order.

Each event the state handles returns the actions to take (see :mod:`.actions`);
:class:`Outbox` performs them, in order, on the hub: a :class:`Send` of a typed
message (an order only while its worker is alive), an :class:`Expel` (the hub,
the worker's log records, its batch segment and the registry forget it), a
:class:`CatchUp` (the latest weights of every attached sender, then the catch-up
hooks, before the newcomer's first order). It also serves the weight senders:
newcomers to catch up, and a count of delivered batches (``max_interval``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import anyio

from transports import Hub, PeerLostError

from .._protocol import Collect, Refuse, RelayWelcome, Welcome
from .actions import Action, CatchUp, Expel, Send
from .records import Roster, WorkerInfo
from .registry import WorkerRegistry
from .shared_batches import SharedBatches
from .worker_logs import WorkerLogs

if TYPE_CHECKING:
    from ..weights import WeightSender

__all__ = ["Outbox"]

log = logging.getLogger("asyncrl.coordinator")


class Outbox:
    """Performs the actions a state change returned (see the module docstring).

    ``lost(peer)`` is awaited when a send finds its peer gone; ``changed()`` is
    called before each batch of actions (the state changed: waiters look again).

    >>> outbox = Outbox(hub, Roster(), WorkerRegistry(), WorkerLogs(), shared,  # doctest: +SKIP
    ...                 lost=coordinator.on_lost, changed=coordinator.notify)
    """

    def __init__(self, hub: Hub, roster: Roster, registry: WorkerRegistry,
                 worker_logs: WorkerLogs, shared: SharedBatches, *,
                 lost: Callable[[bytes], Awaitable[None]], changed: Callable[[], None],
                 on_join: Callable[[WorkerInfo], Awaitable[None]] | None = None) -> None:
        self._hub = hub
        self._roster = roster
        self._registry = registry
        self._worker_logs = worker_logs
        self._shared = shared
        self._lost = lost
        self._changed = changed
        self._on_join = on_join  # awaited after the senders caught a newcomer up
        #: The attached weight senders (see :meth:`attach`).
        self.senders: list[WeightSender] = []
        #: Awaited for each newcomer after its catch-up weights, before its first order
        #: (the env state of the worker it replaces); each sends, none waits for an ack.
        self.catch_up_hooks: list[Callable[[WorkerInfo], Awaitable[None]]] = []
        # Newcomers whose catch-up weights are not handed to the hub yet: a collect order
        # for one of them (a round started by another task meanwhile) waits for them.
        self._catching_up: dict[bytes, anyio.Event] = {}

    def attach(self, sender: WeightSender) -> None:
        """Serve ``sender``: relay routes, newcomers' catch-up, delivered-batch counts.

        Its ``workers`` should be ``roster.worker_peers`` (the live workers).
        """
        if sender.relayable:
            sender.set_relay_routes(self._roster.relay_routes)
        self.senders.append(sender)

    def count_batch(self, worker: WorkerInfo, frames: int) -> None:
        """A batch of ``worker``'s was handed to the trainer."""
        self._registry.delivered(worker, frames)
        for sender in self.senders:
            sender.note_batch(worker.index)  # max_interval counts delivered batches

    def note_refusals(self, actions: list[Action], name: str, host: str, pid: int) -> None:
        """Record each refusal among ``actions`` (statistics, events)."""
        for action in actions:
            if isinstance(action, Send) and isinstance(action.message, Refuse):
                self._registry.refused(name, host, action.message.reason, pid)

    async def perform(self, actions: list[Action], lost_reason: str = "", *,
                       left: bool = False) -> None:
        """Take the actions a state change returned, in order (the state is current already).

        ``lost_reason``: why a worker this change dropped (an :class:`Expel`) was lost;
        ``left``: it left cleanly (a departure, not a loss).
        """
        self._changed()
        # Before any await: an order from another task (a round starting) must not
        # overtake a newcomer's catch-up. (Its own orders come after it in this list.)
        waits = {a.worker.peer: anyio.Event() for a in actions if isinstance(a, CatchUp)}
        self._catching_up.update(waits)
        try:
            for action in actions:
                if isinstance(action, Expel):
                    self._hub.expel(action.peer)
                    self._worker_logs.forget(action.peer)
                    self._shared.forget(action.peer)
                    self._registry.check_lost(lost_reason, left=left)
                elif isinstance(action, CatchUp):
                    await self._catch_up(action.worker, waits[action.worker.peer])
                elif action.worker is None or action.worker.alive:
                    if action.worker is not None and isinstance(action.message, Welcome):
                        self._registry.joined(action.worker)
                    await self._send(action)
                # else: an order to a worker lost since (by another task, during an await)
        finally:
            for peer, caught in waits.items():  # (a failure before its catch-up ran)
                self._caught_up(peer, caught)

    def _caught_up(self, peer: bytes, caught: anyio.Event) -> None:
        """``peer``'s catch-up is handed to the hub (or will never be): its orders may go."""
        if self._catching_up.get(peer) is caught:
            del self._catching_up[peer]
        caught.set()

    async def _send(self, send: Send) -> None:
        kind = send.message.KIND
        if kind == Collect.KIND and (caught := self._catching_up.get(send.peer)) is not None:
            await caught.wait()  # the latest weights go first, on the same socket
            if send.worker is not None and not send.worker.alive:
                return  # lost during its catch-up
        if kind in (Welcome.KIND, RelayWelcome.KIND):
            # Admitted before it is told so: its first batch may be large (see Hub.admit).
            self._hub.admit(send.peer)
        try:
            await self._hub.send(send.peer, send.message.to_body(), kind=kind)
        except PeerLostError:
            await self._lost(send.peer)
        if kind == Refuse.KIND:
            self._hub.expel(send.peer)  # a stranger again: small messages only, no say in the run

    async def _catch_up(self, worker: WorkerInfo, caught: anyio.Event) -> None:
        """The latest weights before its first frame; each await may see it lost."""
        for sender in self.senders:
            if not worker.alive:
                break  # lost while it joined (its process died, or its welcome bounced)
            await sender.on_worker_joined(worker.index)
        for hook in self.catch_up_hooks:
            if worker.alive:
                await hook(worker)
        self._caught_up(worker.peer, caught)  # handed to the hub: its orders may follow
        if worker.alive:
            log.info("worker %d joined (%s, pid %d on %s)", worker.index, worker.name,
                     worker.pid, worker.host)
        if self._on_join is not None and worker.alive:
            await self._on_join(worker)
