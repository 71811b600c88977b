"""The served module as a weight-sync scheme: ``weight_sync_schemes={name: ServedModuleScheme()}``.

TorchRL updates a module served by a Ray actor (``RayModuleTransform``) by model id
with the same ``update_policy_weights_`` as the policy, through its
``RayModuleTransformScheme``. Here the scheme's sender loads the weights into the
:class:`~._module.ServedModule` (one copy, in the trainer's process) instead of
sending them to workers: ``collector.update_policy_weights(w, model_id=name)``
returns once the module's next call uses them, and the version it reports is the
module's, the one every answer (and so every frame, ``("next", "served_versions",
name)``) carries. The workers get a receiver that holds nothing: no weights ever
travel to them for this model.

>>> scheme = ServedModuleScheme()          # finds the module open under the model id
>>> scheme                                  # doctest: +ELLIPSIS
ServedModuleScheme(served=None)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from .._protocol import ServedCall
from ..weights import WeightReceiver, WeightSender, WeightSyncScheme
from ..weights._sender import HubLike, WorkerIds, Workers
from ..weights._strategy import WeightFormat, WeightStrategy
from ._errors import ServedModuleError
from ._module import ServedModule
from ._remote_calls import RemoteCalls, ServedCallRouter, route_of

__all__ = ["ServedModuleScheme", "ServedModuleSender", "serve_remote_calls"]


class _ServedElsewhere:
    """A worker's stand-in for a model it never holds (the trainer serves it)."""

    def __init__(self, model_id: str) -> None:
        self.model_id = model_id

    def __repr__(self) -> str:
        return f"<{self.model_id!r}: served by the trainer>"


class ServedModuleSender(WeightSender):
    """A sender whose "send" loads the weights into a :class:`ServedModule`.

    ``version`` is the module's; a send returns once the module's next call uses the
    weights (there is nothing to acknowledge afterwards: :meth:`wait_ack` returns {}).
    """

    relayable = False

    def __init__(self, model_id: str, hub: HubLike, *, served: ServedModule,
                 strategy: WeightStrategy | str = "tensordict",
                 workers: Workers | None = None, max_interval: int = 0) -> None:
        super().__init__(model_id, hub, model=served.module, strategy=strategy,
                         workers=workers, max_interval=max_interval)
        self.served = served
        #: Remote workers' calls (over the collector's hub, from its admitted workers).
        self.remote_calls = RemoteCalls(served, self.send_to_peer)

    async def send_to_peer(self, peer: bytes, body: Any, kind: str) -> None:
        await self.hub.send(peer, body, kind=kind)

    async def run(self) -> None:
        """Serve remote workers' calls (no version is ever queued: a send loads at once)."""
        await self.remote_calls.run()

    @property
    def version(self) -> int:
        return self.served.version

    async def send(self, weights: Any = None, worker_ids: WorkerIds = None, *,
                   timeout: float | None = None) -> int:
        return await self.send_async(weights, worker_ids)

    async def send_async(self, weights: Any = None, worker_ids: WorkerIds = None) -> int:
        if worker_ids is not None:
            raise ValueError(f"model {self.model_id!r} is served once for every worker: "
                             "leave worker_ids out (there is one copy to update)")
        version = await self.served.update(weights)
        if self.on_applied is not None:
            self.on_applied(self.model_id, version, 0.0)
        return version

    async def send_latest(self, worker_ids: WorkerIds = None, *,
                          direct: bool = False) -> int | None:
        return None  # the workers hold nothing to catch up

    async def on_worker_joined(self, worker_id: int) -> int | None:
        return None

    async def wait_ack(self, timeout: float | None = None) -> dict[int, int]:
        return {}


class ServedModuleScheme(WeightSyncScheme):
    """Updates a :class:`ServedModule` by model id, through a collector's weight calls.

    ``served``: the module (None: the one open in this process under the model id
    this scheme is registered for). TorchRL's ``RayModuleTransformScheme`` translates
    to this scheme.

    >>> collector = MultiSyncCollector(make_env, policy, ...,           # doctest: +SKIP
    ...     weight_sync_schemes={"env.transform[0]": ServedModuleScheme(served)})
    >>> await collector.update_policy_weights(model, model_id="env.transform[0]")  # doctest: +SKIP
    """

    name = "served"

    def __init__(self, served: ServedModule | None = None,
                 strategy: WeightFormat | WeightStrategy = "tensordict", *,
                 route: Mapping[str, Any] | None = None) -> None:
        super().__init__(strategy)
        self.served = served
        #: How a remote worker calls the module (set from its welcome; the worker's
        #: ``ServedCalls`` reads it there, checked): data, never code.
        self.route = None if route is None else dict(route)

    def __repr__(self) -> str:
        return f"ServedModuleScheme(served={self.served!r})"

    def __getstate__(self) -> dict[str, Any]:
        return {**super().__getstate__(), "served": None}  # the trainer's alone

    def to_config(self) -> dict[str, Any]:
        """The welcome's form: with the route a remote worker's envs call the module by
        (its layouts and ``call_timeout``; found by model id once the collector set it)."""
        config = super().to_config()
        served = self.served
        if served is None and self.model_id is not None:
            try:
                served = ServedModule.named(self.model_id)
            except KeyError:
                return config  # init_on_sender will say so
        if served is not None:
            try:
                config["route"] = route_of(served).to_config()
            except ServedModuleError:  # not open: init_on_sender fails saying so
                pass
        return config

    def init_on_sender(self, model_id: str = "policy", *, hub: HubLike, model: Any = None,
                       workers: Workers | None = None) -> WeightSender:
        served = self.served if self.served is not None else _named(model_id)
        if not _is_open(served):
            raise ServedModuleError(
                f"weight_sync_schemes[{model_id!r}]: served module {served.name!r} is not "
                "open: open the ServedModule ('async with ServedModule(...)') before the "
                "collector, which tells every worker how to call it when it joins (a module "
                "opened later is offered to no worker)")
        if served.name != model_id:
            raise ServedModuleError(f"weight_sync_schemes[{model_id!r}] serves the module "
                                    f"named {served.name!r}: register it under its name")
        self.model_id = model_id
        self._sender = ServedModuleSender(model_id, hub, served=served,
                                          strategy=self.strategy, workers=workers)
        return self._sender

    def init_on_worker(self, model_id: str = "policy", *, model: Any = None, root: Any = None,
                       on_apply: Any = None) -> WeightReceiver:
        self.model_id = model_id
        self._receiver = WeightReceiver(model_id, _ServedElsewhere(model_id),
                                        strategy=self.strategy, on_apply=on_apply)
        return self._receiver


def _is_open(served: ServedModule) -> bool:
    try:
        return ServedModule.named(served.name) is served
    except KeyError:
        return False


def _named(model_id: str) -> ServedModule:
    try:
        return ServedModule.named(model_id)
    except KeyError as exc:
        raise ServedModuleError(str(exc.args[0])) from None


def serve_remote_calls(services: dict[str, Any], senders: Mapping[str, WeightSender],
                       publish: Callable[[Any], None] | None = None
                       ) -> ServedCallRouter | None:
    """Route remote workers' ``served_call`` messages (the coordinator's ``services``) to
    the served modules among ``senders`` (none: nothing is routed, and such a call is
    ignored as any unknown kind); refusals are counted in the router returned and
    published as ``publish`` (the collector's events) says."""
    served = [s for s in senders.values() if isinstance(s, ServedModuleSender)]
    if not served:
        return None
    router = ServedCallRouter(served[0].send_to_peer, publish=publish)
    for sender in served:
        router.add(sender.remote_calls)
    services[ServedCall.KIND] = router.on_message
    return router

