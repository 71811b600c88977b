"""The weight-sync scheme's base: how one model id travels from the trainer to its workers.

Each scheme lives in a module of its own with its sender and receiver:
:mod:`._zmq` (the default, any host), :mod:`._shared_memory` and
:mod:`._live_shared_memory` (same host), :mod:`._cuda_ipc` (same host, GPU
workers), :mod:`._distributed` (torch.distributed), :mod:`._ray` (Ray's object
store), :mod:`._in_process` and
:mod:`._no_weights`. The sender and receiver they build on are in
:mod:`._sender` and :mod:`._receiver`; what the tensors travel as is the
scheme's codec (:mod:`._codec`), and what is dropped for something newer is
:mod:`._newest`'s, whatever the transport.
"""

from __future__ import annotations

from typing import Any, ClassVar

from ._codec import FULL_TENSORS, WeightCodec
from ._errors import NotInitializedError
from ._paths import resolve_model_path
from ._receiver import WeightReceiver
from ._sender import HubLike, WeightSender, Workers
from ._strategy import WeightFormat, WeightStrategy, as_strategy

__all__ = ["WeightSyncScheme"]


class WeightSyncScheme:
    """Base class: configuration on both sides, a sender on the trainer, a receiver per worker.

    A scheme is created by the user (one per model id:
    ``weight_sync_schemes={"policy": ZmqWeightSyncScheme()}``), then initialised
    by the collector on the trainer (:meth:`init_on_sender`) and by each worker
    (:meth:`init_on_worker`). It pickles for a spawned worker without its
    runtime state, and :meth:`to_config` gives a msgpack form for remote hosts.

    >>> scheme = ZmqWeightSyncScheme(strategy="state_dict")
    >>> try:
    ...     scheme.get_sender()
    ... except NotInitializedError as exc:
    ...     print(str(exc)[:40])
    ZmqWeightSyncScheme has no sender yet: c
    """

    name: ClassVar[str] = "base"
    #: True when the workers a scheme serves are fixed once it is formed: a lost worker
    #: breaks it and no replacement can join (a collector then refuses any
    #: ``on_worker_loss`` but ``"raise"``).
    fixed_membership: ClassVar[bool] = False
    #: What the tensors travel as (:mod:`._codec`): a scheme that sends deltas or another
    #: dtype sets its codec here, and its sender and receiver use it.
    codec: ClassVar[WeightCodec] = FULL_TENSORS
    _sender_class: ClassVar[type[WeightSender]] = WeightSender
    _receiver_class: ClassVar[type[WeightReceiver]] = WeightReceiver
    _registry: ClassVar[dict[str, type[WeightSyncScheme]]] = {}

    def __init__(self, strategy: WeightFormat | WeightStrategy = "tensordict", *,
                 max_interval: int = 0) -> None:
        self.strategy = as_strategy(strategy)
        self.max_interval = max_interval
        self.model_id: str | None = None
        self._sender: WeightSender | None = None
        self._receiver: WeightReceiver | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("name"):
            WeightSyncScheme._registry[cls.name] = cls

    def __repr__(self) -> str:
        options = ", ".join(f"{k}={v!r}" for k, v in self._options().items())
        return f"{type(self).__name__}({options})"

    # -- trainer side ---------------------------------------------------------------------
    def init_on_sender(self, model_id: str = "policy", *, hub: HubLike, model: Any = None,
                       workers: Workers | None = None) -> WeightSender:
        """Create the trainer's sender for ``model_id`` over ``hub`` and return it.

        ``workers`` is ``{worker_id: peer}`` or a callable returning it (the
        scheduler's live workers); ``model`` is what ``send()`` without weights sends.
        """
        if not (self.codec.identity or self._sender_class.takes_codecs):
            raise ValueError(f"{type(self).__name__} moves the model's own tensors "
                             f"({self._sender_class.__name__}): it cannot send them encoded "
                             f"as {self.codec.name!r}; use the identity codec, or a scheme "
                             "built on ZmqWeightSyncScheme or SharedMemWeightSyncScheme")
        self.model_id = model_id
        self._sender = self._sender_class(
            model_id, hub, model=model, strategy=self.strategy, workers=workers,
            max_interval=self.max_interval, **self._sender_options())
        self._sender.codec = self.codec
        return self._sender

    def get_sender(self) -> WeightSender:
        if self._sender is None:
            raise NotInitializedError(
                f"{type(self).__name__} has no sender yet: call init_on_sender(model_id, "
                "hub=..., model=...) first (on the trainer)")
        return self._sender

    @property
    def initialized_on_sender(self) -> bool:
        return self._sender is not None

    # -- worker side ----------------------------------------------------------------------
    def init_on_worker(self, model_id: str = "policy", *, model: Any = None, root: Any = None,
                       on_apply: Any = None) -> WeightReceiver:
        """Create this worker's receiver for ``model_id`` and return it.

        The model is ``model`` or, if None, ``model_id`` resolved as an attribute
        path on ``root`` (``"policy"``, ``"env.transform[0]"``).
        ``on_apply(version)`` runs after each applied update.
        """
        self.model_id = model_id
        target = self._resolve(model_id, model, root)
        self._receiver = self._receiver_class(model_id, target, strategy=self.strategy,
                                              on_apply=on_apply, **self._receiver_options())
        self._receiver.codec = self.codec
        return self._receiver

    init_on_receiver = init_on_worker  # TorchRL's name

    def get_receiver(self) -> WeightReceiver:
        if self._receiver is None:
            raise NotInitializedError(
                f"{type(self).__name__} has no receiver yet: call init_on_worker(model_id, "
                "root=...) first (on the worker)")
        return self._receiver

    @property
    def initialized_on_worker(self) -> bool:
        return self._receiver is not None

    # -- lifetime, pickling, config ---------------------------------------------------------
    async def aclose(self) -> None:
        """Close the sender and receiver this scheme created (idempotent)."""
        sender, self._sender = self._sender, None
        receiver, self._receiver = self._receiver, None
        if sender is not None:
            await sender.aclose()
        if receiver is not None:
            await receiver.aclose()

    def __getstate__(self) -> dict[str, Any]:
        # A spawned worker gets the configuration only; runtime state stays here.
        return {**self.__dict__, "_sender": None, "_receiver": None}

    def to_config(self) -> dict[str, Any]:
        """A msgpack-able description, for a worker on another host (see ``from_config``)."""
        return {"scheme": self.name, "strategy": self.strategy.extract_as, **self._options()}

    @staticmethod
    def from_config(config: dict[str, Any]) -> WeightSyncScheme:
        """Rebuild a scheme from :meth:`to_config`'s output; unknown names raise ``ValueError``."""
        config = dict(config)
        cls = WeightSyncScheme._registry.get(config.pop("scheme", None))
        if cls is None:
            raise ValueError(f"unknown weight sync scheme in {config!r}; known: "
                             f"{sorted(WeightSyncScheme._registry)}")
        return cls(**config)

    def plan(self, *, workers: int, remote_workers: int = 0) -> None:
        """Told by a collector how it will run, before any worker starts.

        ``workers`` in all (``remote_workers`` of them on other hosts). A scheme
        that cannot serve such a run raises ``ValueError`` saying what to change;
        most schemes serve any run.
        """

    def _options(self) -> dict[str, Any]:
        return {"max_interval": self.max_interval} if self.max_interval else {}

    def _sender_options(self) -> dict[str, Any]:
        return {}

    def _receiver_options(self) -> dict[str, Any]:
        return {}

    def _resolve(self, model_id: str, model: Any, root: Any) -> Any:
        if model is not None:
            return model
        if root is None:
            raise ValueError(f"{type(self).__name__}.init_on_worker({model_id!r}): pass the "
                             "model or a root object to resolve the model id on")
        return resolve_model_path(root, model_id)
