"""Collectors that run as tasks in the trainer's process: weights without a socket."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from transports import LocalHub, Message

from ._errors import NotInitializedError
from ._receiver import WeightReceiver
from ._scheme import WeightSyncScheme
from ._sender import HubLike, WeightSender, Workers
from ._strategy import WeightFormat, WeightStrategy

__all__ = ["InProcessWeightSyncScheme"]


class _InProcessSender(WeightSender):
    """Skips the snapshot when every receiver steps with the sender's own model object."""

    takes_codecs = False  # it shares the model's own memory: identity only

    def __init__(self, *args: Any, stepping_models: Callable[[], list[Any]],
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._stepping_models = stepping_models  # the models the receivers step with, now

    async def _prepare(self, source: Any, version: int) -> tuple[Any, dict[str, Any]]:
        models = self._stepping_models()
        self.snapshot = not (models and all(m is source for m in models))
        return await super()._prepare(source, version)


class InProcessWeightSyncScheme(WeightSyncScheme):
    """Collectors that run as tasks in the trainer's process: no socket, no encoding.

    When a collector steps with the trainer's own model object nothing is
    copied: an update only moves the version (applied at the next step
    boundary, acked like any other). A separate copy (e.g. on another device)
    gets the weights copied in. Initialise the sender first, then each
    collector with :meth:`init_on_worker`; the receiver's ``flush_acks()`` needs
    no link.

    >>> import anyio
    >>> from torch import nn
    >>> policy = nn.Linear(2, 1)
    >>> scheme = InProcessWeightSyncScheme()
    >>> sender = scheme.init_on_sender("policy", model=policy)
    >>> receiver = scheme.init_on_worker("policy", model=policy)
    >>> async def main():
    ...     version = await sender.send_async()
    ...     receiver.apply_pending()                 # at the collector's step boundary
    ...     await receiver.flush_acks()
    ...     return await sender.wait_ack(timeout=5)
    >>> anyio.run(main)
    {0: 1}
    """

    name = "in_process"

    def __init__(self, strategy: WeightFormat | WeightStrategy = "tensordict", *,
                 max_interval: int = 0) -> None:
        super().__init__(strategy, max_interval=max_interval)
        self._hub: LocalHub | None = None
        self._receivers: dict[int, WeightReceiver] = {}

    def init_on_sender(self, model_id: str = "policy", *, hub: HubLike | None = None,
                       model: Any = None, workers: Workers | None = None) -> WeightSender:
        if hub is not None or workers:
            raise ValueError("InProcessWeightSyncScheme makes its own in-memory hub; "
                             "collectors join with init_on_worker()")
        self.model_id = model_id
        self._hub = LocalHub()
        self._receivers = {}
        self._sender = _InProcessSender(model_id, self._hub, model=model, strategy=self.strategy,
                                        max_interval=self.max_interval,
                                        stepping_models=self._stepping_models)
        return self._sender

    def init_on_worker(self, model_id: str = "policy", *, model: Any = None, root: Any = None,
                       on_apply: Any = None, worker_id: int | None = None,
                       deliver: Callable[[Message], Any] | None = None) -> WeightReceiver:
        """Create the receiver of collector ``worker_id`` (default: the next free id).

        Updates reach ``deliver(message)`` inside the sender's ``send_async``
        (default: the receiver's ``on_message``); a collector that applies at once
        when idle passes its own.
        """
        sender = self.get_sender()
        if worker_id is None:
            worker_id = max(self._receivers, default=-1) + 1
        receiver = WeightReceiver(model_id, self._resolve(model_id, model, root),
                                  strategy=self.strategy, on_apply=on_apply)
        assert self._hub is not None
        peer = f"in-process-{worker_id}".encode()
        receiver.link = self._hub.connect(peer, deliver=deliver or receiver.on_message)
        sender.add_worker(worker_id, peer)
        self._receivers[worker_id] = self._receiver = receiver
        return receiver

    init_on_receiver = init_on_worker

    def _stepping_models(self) -> list[Any]:
        return [receiver.model for receiver in self._receivers.values()]

    def get_receiver(self, worker_id: int | None = None) -> WeightReceiver:
        if worker_id is None:
            return super().get_receiver()
        try:
            return self._receivers[worker_id]
        except KeyError:
            raise NotInitializedError(f"no in-process receiver for worker {worker_id}; "
                                      f"known: {sorted(self._receivers)}") from None

    async def aclose(self) -> None:
        receivers, self._receivers = self._receivers, {}
        for receiver in receivers.values():
            await receiver.aclose()
        self._hub = None
        await super().aclose()

    def __getstate__(self) -> dict[str, Any]:
        return {**super().__getstate__(), "_hub": None, "_receivers": {}}
