"""The weight dance of one worker: take updates any time, apply them between steps, ack each.

A worker process and the in-process collector both step their model in a
thread while their event loop receives weight messages. A
:class:`WeightApplier` is the one place that decides when an update reaches
the model, which version the frames are stamped with, and where each ack goes:

* :meth:`~WeightApplier.deliver` (event loop): the receivers keep the newest
  update per model id; while the model is idle it is applied at once;
* :meth:`~WeightApplier.before_step` (the rollout thread, as the rollout's
  ``before_step`` hook): what is pending is applied between two steps, never
  inside one; :meth:`~WeightApplier.after_batch` catches what came after a
  batch's last step. While a version is written into the model itself
  (``ZmqWeightSyncScheme(in_place=True)``) the rollout waits there, and a
  half-written model fails the step instead of stepping;
* :meth:`~WeightApplier.send_acks` (a task) and :meth:`~WeightApplier.flush_acks`:
  each ack goes back the way its message came, its :class:`AckRoute`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import anyio

from transports import Message

from ._errors import WeightSyncError
from ._receiver import Acker, AckRoute, WeightAck, WeightReceiver, WeightReceiverGroup
from ._scheme import WeightSyncScheme

__all__ = ["Stampable", "WeightApplier"]

log = logging.getLogger("asyncrl.weights")

#: The model whose applied version stamps every frame (``("collector", "policy_version")``).
POLICY = "policy"


class Stampable(Protocol):
    """What an applier drives: a rollout's step hook and the version it stamps on frames."""

    before_step: Callable[[], None] | None
    policy_version: int


def _never_busy() -> bool:
    return False


class WeightApplier:
    """The receivers of one worker, applied at step boundaries, acked over each ack's route.

    ``direct`` is the link to the coordinator (a ``transports.Link``, or a
    :class:`~transports.LocalLink`); ``relay``, if any, the link to this
    host's relay. ``busy()`` says whether the model is in use (a batch or a
    control operation): an update that comes while it is not is applied at
    once, so that an awaited send between batches returns without waiting for
    a batch the trainer only asks for once it returned.

    >>> import anyio, torch
    >>> from torch import nn
    >>> from asyncrl.weights import WeightReceiver, WeightSender
    >>> from transports import LocalHub
    >>> async def main():
    ...     hub = LocalHub()
    ...     policy = nn.Linear(2, 1)
    ...     applier = WeightApplier(hub.connect(b"w0", deliver=lambda m: applier.deliver(m)))
    ...     applier.add(WeightReceiver("policy", policy))
    ...     sender = WeightSender("policy", hub, workers={0: b"w0"})
    ...     await sender.send_async({"weight": torch.ones(1, 2), "bias": torch.zeros(1)})
    ...     await applier.flush_acks()              # or run applier.send_acks() in a task
    ...     return await sender.wait_ack(timeout=5), applier.policy_version
    >>> anyio.run(main)
    ({0: 1}, 1)
    """

    def __init__(self, direct: Acker, *, relay: Acker | None = None,
                 busy: Callable[[], bool] = _never_busy) -> None:
        self.receivers = WeightReceiverGroup(on_apply=self._on_apply)
        #: The coordinator instance followed (see :meth:`follow`); "" until told.
        self.instance = ""
        self._links: dict[AckRoute, Acker | None] = {AckRoute.DIRECT: direct,
                                                      AckRoute.RELAY: relay}
        self._busy = busy
        self._rollout: Stampable | None = None
        self._acks_due = anyio.Event()
        self._closed = False
        #: Notified (event loop) when a model written in place is let go (see before_step).
        self._in_place_done = threading.Condition()
        self._whole = anyio.Event()  # set when a model written in place is let go

    def __repr__(self) -> str:
        return f"{type(self).__name__}(versions={self.receivers.versions})"

    # -- building ---------------------------------------------------------------------------
    def add(self, receiver: WeightReceiver) -> None:
        """Apply ``receiver``'s model id here (it must not have its own ``on_apply``)."""
        self.receivers.add(receiver)
        receiver.on_ready = self._ready

    def add_schemes(self, schemes: Mapping[str, WeightSyncScheme], *, root: Any) -> None:
        """A receiver for each model id of ``schemes``, its model resolved on ``root``."""
        for model_id, scheme in schemes.items():
            self.add(scheme.init_on_worker(model_id, root=root))

    def add_configs(self, configs: Mapping[str, Any], *, root: Any) -> None:
        """Receivers for the models the coordinator syncs (its welcome) and we have none for."""
        known = self.receivers.versions
        for model_id, config in configs.items():
            if model_id in known:
                continue
            scheme = WeightSyncScheme.from_config(config)
            receiver = scheme.init_on_worker(model_id, root=root)
            if receiver.model is None and scheme.name != "none":
                # Collecting with random actions while the trainer believes its weights
                # are in use would be a silent failure: stop with a clear error instead.
                raise ValueError(
                    f"the coordinator syncs the weights of {model_id!r}, but this worker has "
                    f"no {model_id!r} (no policy means random actions): start it with "
                    "--policy pkg.mod:factory returning the trainer's policy architecture")
            self.add(receiver)

    def follow(self, instance: str) -> None:
        """Count versions in coordinator ``instance``'s numbering (see ``WeightReceiver.follow``).

        Direct acks of weights that another instance sent are dropped from now on.
        """
        if instance:
            self.instance = instance
        self.receivers.follow(instance)

    def admitted(self, index: int) -> None:
        """The coordinator welcomed this worker as worker ``index`` (receivers that join a
        process group, such as the broadcast scheme's, start joining it now)."""
        self.receivers.admitted(index)

    def attach(self, rollout: Stampable) -> None:
        """Apply at ``rollout``'s step boundaries and stamp its frames with the policy version."""
        self._rollout = rollout
        rollout.policy_version = self.policy_version
        if len(self.receivers):  # else the hot loop keeps its no-hook fast path
            rollout.before_step = self.before_step

    @property
    def policy_version(self) -> int:
        """The version of ``"policy"`` applied (0: the worker's own weights, or no receiver)."""
        return self.receivers.versions.get(POLICY, 0)

    # -- event loop -------------------------------------------------------------------------
    def deliver(self, message: Message, route: AckRoute = AckRoute.DIRECT) -> None:
        """Take a ``weights`` message that came by ``route``; never raises for a bad one.

        A bad or unknown update is acked with its error; its acks go back by ``route``.
        """
        if self._links[route] is None:
            raise ValueError(f"weights came by {route.name} but this applier has no link to "
                             "ack them over: give it one (WeightApplier(..., relay=link))")
        self.receivers.on_message(message, route)
        if not self._busy():
            # Idle between batches: apply now (sync mode relies on it); a version
            # written in place is written as its chunks come.
            self.receivers.park()
            self.receivers.apply_pending()
        self._wake()

    def after_batch(self) -> None:
        """Apply what came after a batch's last step boundary (model idle, event loop).

        Else it would wait for the next batch while the trainer may be waiting
        for its ack before it asks for one.
        """
        if self.receivers.has_pending:
            self.receivers.park()
            self.receivers.apply_pending()
            self._wake()

    async def model_whole(self) -> None:
        """Wait until no version is being written into a model (in place), for a control
        operation that uses it; raise ``WeightSyncError`` if one is half-written. Call it
        holding what keeps the rollout idle."""
        while self.receivers.needs_park and not self._closed:
            self._whole = anyio.Event()
            self.receivers.park()  # idle: written as the chunks come
            if self.receivers.needs_park:
                await self._whole.wait()
        self.receivers.apply_pending()
        self.receivers.check_whole()

    async def flush_acks(self) -> int:
        """Send the acks due, each over its route; return how many went."""
        return await self.receivers.flush_routed_acks(self._link_for)

    async def send_acks(self) -> None:
        """Send acks as they fall due; run it as a task (it returns once :meth:`close` ran)."""
        while not self._closed:
            await self._acks_due.wait()
            self._acks_due = anyio.Event()
            await self.flush_acks()

    def close(self) -> None:
        """End :meth:`send_acks` (idempotent); acks still due stay unsent. A rollout waiting
        for a version written in place fails its step."""
        self._closed = True
        self._acks_due.set()
        self._whole.set()
        with self._in_place_done:
            self._in_place_done.notify_all()

    # -- rollout thread ---------------------------------------------------------------------
    def before_step(self) -> None:
        """The rollout's hook at every step boundary: a check per model unless an update waits
        (an attribute, and for live shared memory the published version word)."""
        if self.receivers.has_pending:
            if self.receivers.needs_park:
                self._wait_in_place()
            self.receivers.apply_pending()
            if self.receivers.has_acks:  # (a version read from shared memory is acked by nobody)
                anyio.from_thread.run_sync(self._wake)
            self.receivers.check_whole()  # a half-written model fails the step

    def _wait_in_place(self) -> None:
        """Hold the rollout here while a version is written into its model (in place)."""
        anyio.from_thread.run_sync(self.receivers.park)  # from now on the chunks go in
        rollout = self._rollout
        with self._in_place_done:
            while self.receivers.needs_park and not self._closed:
                hook = rollout.before_step if rollout is not None else None
                if hook is not None and hook != self.before_step:
                    hook()  # the rollout was asked to stop meanwhile: its hook raises that
                self._in_place_done.wait(0.05)
        if self.receivers.needs_park:
            raise WeightSyncError("the worker closed while a version was being written into "
                                  "its model (in_place=True): it does not step with it")

    # -- internals --------------------------------------------------------------------------
    def _wake(self) -> None:
        self._acks_due.set()  # (the event of now: send_acks swaps it after each wake-up)

    def _ready(self) -> None:
        # An update whose bytes came after its message (a broadcast) is in, or a model
        # written in place is let go: apply it now if the model is idle (else the next
        # step boundary or after_batch does), let a waiting rollout go on, and ack.
        if not self._busy():
            self.receivers.park()
            self.receivers.apply_pending()
        self._whole.set()
        with self._in_place_done:
            self._in_place_done.notify_all()
        self._wake()

    def _on_apply(self, model_id: str, version: int) -> None:
        # Runs where the update was applied (the rollout thread at a step boundary):
        # the rollout stamps the frames from this step on with the new version.
        if model_id == POLICY and self._rollout is not None:
            self._rollout.policy_version = version

    def _link_for(self, ack: WeightAck) -> Acker | None:
        instance = ack.message.meta.get("instance")
        if ack.route is AckRoute.DIRECT and isinstance(instance, str) \
                and instance != self.instance:
            # Its sender is gone; its sequence number would name another message of
            # the coordinator there now. (A relay drops such acks itself.)
            log.debug("dropped the ack of weights from coordinator instance %s", instance)
            return None
        return self._links[ack.route]
