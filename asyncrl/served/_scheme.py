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

from typing import Any

from ..weights import WeightReceiver, WeightSender, WeightSyncScheme
from ..weights._sender import HubLike, WorkerIds, Workers
from ..weights._strategy import WeightFormat, WeightStrategy
from ._errors import ServedModuleError
from ._module import ServedModule

__all__ = ["ServedModuleScheme", "ServedModuleSender"]


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
                 strategy: WeightFormat | WeightStrategy = "tensordict") -> None:
        super().__init__(strategy)
        self.served = served

    def __repr__(self) -> str:
        return f"ServedModuleScheme(served={self.served!r})"

    def __getstate__(self) -> dict[str, Any]:
        return {**super().__getstate__(), "served": None}  # the trainer's alone

    def init_on_sender(self, model_id: str = "policy", *, hub: HubLike, model: Any = None,
                       workers: Workers | None = None) -> WeightSender:
        served = self.served if self.served is not None else _named(model_id)
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


def _named(model_id: str) -> ServedModule:
    try:
        return ServedModule.named(model_id)
    except KeyError as exc:
        raise ServedModuleError(str(exc.args[0])) from None
