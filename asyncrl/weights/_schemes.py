"""Weight-sync schemes: how one model id travels from the trainer to its workers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from transports import LocalHub, Message

from ._chunks import DEFAULT_CHUNK_BYTES
from ._collective import ALGORITHMS, BACKENDS, CHAIN_CHUNK_BYTES, free_port, parse_init_method
from ._distributed import DistributedWeightReceiver, DistributedWeightSender
from ._errors import NotInitializedError, WeightSyncError
from ._paths import resolve_model_path
from ._receiver import WeightReceiver
from ._sender import HubLike, WeightSender, WorkerIds, Workers
from ._shared_memory import (
    LiveSharedMemWeightReceiver,
    LiveSharedMemWeightSender,
    SharedMemWeightReceiver,
    SharedMemWeightSender,
)
from ._strategy import WeightFormat, WeightStrategy, as_strategy
from ._streamed import StreamedWeightReceiver, StreamingWeightSender

__all__ = [
    "DistributedWeightSyncScheme",
    "InProcessWeightSyncScheme",
    "LiveSharedMemWeightSyncScheme",
    "NoWeightSyncScheme",
    "SharedMemWeightSyncScheme",
    "WeightSyncScheme",
    "ZmqWeightSyncScheme",
]


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
        self.model_id = model_id
        self._sender = self._sender_class(
            model_id, hub, model=model, strategy=self.strategy, workers=workers,
            max_interval=self.max_interval, **self._sender_options())
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

    def plan(self, *, workers: int, remote_workers: int = 0,
             on_worker_loss: str = "raise") -> None:
        """Told by a collector how it will run, before any worker starts.

        ``workers`` in all (``remote_workers`` of them on other hosts), and what a
        lost worker does to the run. A scheme that cannot serve such a run raises
        ``ValueError`` saying which scheme can; most schemes serve any run.
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


class ZmqWeightSyncScheme(WeightSyncScheme):
    """The default: weights travel in ZeroMQ messages; works across hosts.

    A version of more than ``chunk_bytes`` (default 16 MiB; 0: never) is
    streamed as a sequence of chunk messages: the trainer hands ZeroMQ views
    of its snapshot, and each worker checks every chunk against its model's
    layout and copies it into a receive buffer while the next one is on the
    wire. The model changes only at a step boundary once every chunk arrived:
    its parameters then point at that buffer (``zero_copy=True``, the
    default: no copy; their previous storage receives the next version) or
    the buffer is copied into them (``zero_copy=False``, for modules that
    cache tensors derived from their parameters). A worker holds its model,
    one receive buffer and a chunk, never a whole message besides. Smaller
    versions travel in one message and are copied into the model.

    ``in_place=True`` (for models too big to hold twice): no receive buffer;
    each chunk is written straight into the model's own tensors as it comes,
    while the worker's rollout waits at a step boundary from the stream's first
    chunk to its last (a worker between batches is not held at all). One copy
    of the model, never two; the price is that pause, about one transfer of
    the model per update. Frames keep exact versions. A stream that fails
    after writing began leaves the model half-written: the worker's next step
    (or control operation) then fails with a ``WeightSyncError`` instead of
    stepping with it. For worker processes (``asyncrl worker``, a collector's
    workers); ``zero_copy`` does not apply.

    >>> scheme = ZmqWeightSyncScheme()
    >>> ZmqWeightSyncScheme.from_config(scheme.to_config())
    ZmqWeightSyncScheme()
    >>> ZmqWeightSyncScheme(chunk_bytes=4 << 20).to_config()["chunk_bytes"]
    4194304
    >>> ZmqWeightSyncScheme(in_place=True)
    ZmqWeightSyncScheme(in_place=True)
    """

    name = "zmq"
    _sender_class = StreamingWeightSender
    _receiver_class = StreamedWeightReceiver

    def __init__(self, strategy: WeightFormat | WeightStrategy = "tensordict", *,
                 max_interval: int = 0, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                 zero_copy: bool | None = None, in_place: bool = False) -> None:
        super().__init__(strategy, max_interval=max_interval)
        if type(chunk_bytes) is not int or chunk_bytes < 0:
            raise ValueError(f"chunk_bytes must be an int >= 0 (0: never chunk), "
                             f"got {chunk_bytes!r}")
        if in_place and zero_copy is not None:
            raise ValueError("in_place=True writes every chunk into the model's own tensors: "
                             "there is no receive buffer for zero_copy to swap or copy from; "
                             "leave zero_copy out")
        if in_place and not chunk_bytes:
            raise ValueError("in_place=True streams big versions in chunks: give chunk_bytes "
                             "> 0 (the default is 16 MiB)")
        self.chunk_bytes = chunk_bytes
        self.in_place = bool(in_place)
        self.zero_copy = not self.in_place if zero_copy is None else bool(zero_copy)

    def _options(self) -> dict[str, Any]:
        options = super()._options()
        if self.chunk_bytes != DEFAULT_CHUNK_BYTES:
            options["chunk_bytes"] = self.chunk_bytes
        if self.in_place:
            options["in_place"] = True
        elif not self.zero_copy:
            options["zero_copy"] = False
        return options

    def _sender_options(self) -> dict[str, Any]:
        return {"chunk_bytes": self.chunk_bytes}

    def _receiver_options(self) -> dict[str, Any]:
        return {"zero_copy": self.zero_copy, "in_place": self.in_place}


class SharedMemWeightSyncScheme(WeightSyncScheme):
    """Same host, safe and zero-copy: one memcpy per send, none on the workers.

    A send writes the weights into a free shared-memory buffer (one copy) and
    only ``(block, slot, seq)`` travels; each worker points its parameters at
    that buffer at a step boundary (``param.data = view``, no copy) and acks.
    A buffer is rewritten only once no worker can be stepping with it (the
    acks say which version each worker holds), so the weights that produce a
    frame are exactly those of its stamped version, whole. The pool holds
    ``slots`` buffers; while a worker holds on to an old version longer than
    ``slot_timeout`` seconds a send adds a buffer instead of waiting (memory,
    never a torn read). ``zero_copy=False`` copies into the workers' own
    tensors instead (for modules that cache tensors derived from their
    parameters); buffers (running statistics) are always copied.

    >>> SharedMemWeightSyncScheme(slots=4)
    SharedMemWeightSyncScheme(slots=4)
    """

    name = "shared_mem"
    _sender_class = SharedMemWeightSender
    _receiver_class = SharedMemWeightReceiver
    _default_slots = 3

    def __init__(self, strategy: WeightFormat | WeightStrategy = "tensordict", *,
                 max_interval: int = 0, slots: int | None = None, slot_timeout: float = 1.0,
                 zero_copy: bool = True) -> None:
        super().__init__(strategy, max_interval=max_interval)
        slots = self._default_slots if slots is None else slots
        if not 1 <= slots <= 8:
            raise ValueError(f"slots must be between 1 and 8, got {slots}")
        self.slots = slots
        self.slot_timeout = slot_timeout
        self.zero_copy = zero_copy

    def _options(self) -> dict[str, Any]:
        options = super()._options()
        if self.slots != self._default_slots:
            options["slots"] = self.slots
        if self.slot_timeout != 1.0:
            options["slot_timeout"] = self.slot_timeout
        if not self.zero_copy:
            options["zero_copy"] = False
        return options

    def _sender_options(self) -> dict[str, Any]:
        return {"slots": self.slots, "slot_timeout": self.slot_timeout}

    def _receiver_options(self) -> dict[str, Any]:
        return {"zero_copy": self.zero_copy}


class LiveSharedMemWeightSyncScheme(SharedMemWeightSyncScheme):
    """Same host, opt-in **live** weights, as TorchRL's ``SharedMemWeightSyncScheme``.

    The trainer's model is moved into shared memory when the sender is created
    (its parameters and buffers; the ``Parameter`` objects, hence the
    optimiser, stay the same) and trained in place; workers point their
    parameters at it. It is the fastest scheme and the weakest:

    * every optimiser step reaches the workers **immediately, mid-rollout**,
      and a worker may read parameters while the optimiser is writing them
      (**torn reads**: part of step *n*, part of step *n + 1*);
    * a frame's ``policy_version`` is a **lower bound**: the weights that
      acted are those of that version *or newer*, possibly a mix;
    * **an ack is not a message.** A worker's first update (and the first after
      it rejoins or is replaced) is a message naming the block, applied and
      acked. After that a send writes the version into a word of the block and
      returns: ``send()`` / ``wait_ack()`` count such a worker as acknowledged
      at once, and mean only this: every step it *starts* from then on stamps
      its frames with that version or newer (it reads the word at each step
      boundary, and copies the buffers then). A step already under way keeps
      the older stamp (a correct lower bound: the weights are live); an idle
      worker stamps it from its next step; a worker that died meanwhile does
      not delay the send (its loss is the collector's ``on_worker_loss``).

    The word belongs to the block, not to a worker: an attached worker that a
    send did not target (``worker_ids``, ``max_interval``) reads it too, which
    is as true of its live weights. A send copies nothing; buffers (running
    statistics) and parameters of another dtype are copied by each worker at
    the step that sees a new version. Use it when, like TorchRL's users, you
    accept all that; use :class:`SharedMemWeightSyncScheme` for exact
    versions and real acks at the cost of one memcpy per send. CPU models
    only; ``send()`` takes no ``weights``.

    >>> LiveSharedMemWeightSyncScheme()
    LiveSharedMemWeightSyncScheme()
    """

    name = "shared_mem_live"
    _sender_class = LiveSharedMemWeightSender
    _receiver_class = LiveSharedMemWeightReceiver
    _default_slots = 1

    def _sender_options(self) -> dict[str, Any]:
        return {}


class DistributedWeightSyncScheme(WeightSyncScheme):
    """Weights by ``torch.distributed`` broadcast (TorchRL's scheme of the same name).

    The trainer is rank 0 of a private process group (``backend="gloo"`` on
    CPU, ``"nccl"`` for CUDA workers), served at ``init_method``
    (``"tcp://HOST:PORT"``; default: a free port on 127.0.0.1, which only local
    workers reach: give the trainer's address when ``remote_workers`` join).
    Each worker joins as rank ``index + 1`` right after its welcome. A send
    copies the weights into one preallocated contiguous buffer and makes one
    broadcast of it; the version travels over the worker link and is acked
    like every other scheme's, and the worker copies its receive buffer into
    its model at a step boundary, so frames carry exact versions.

    **Fixed membership.** The group has ``world_size`` ranks (the collector's
    workers + 1) and forms once all of them joined; every send reaches every
    member. A worker that dies breaks the group: the next broadcast fails at
    once (gloo sees the closed connection) or after ``timeout`` seconds (a hung
    member), and every later send raises ``WeightSyncError``. Nothing can
    rejoin, so a collector with ``on_worker_loss`` other than ``"raise"`` is
    refused; use :class:`ZmqWeightSyncScheme` (or
    :class:`SharedMemWeightSyncScheme` on one host) for runs that lose or
    replace workers. Every wait is bounded: the formation by ``join_timeout``
    (seconds for every worker to start and join), each broadcast by
    ``timeout``. torch.distributed has no authentication: use it on a trusted
    network only.

    **Many hosts (gloo).** ``algorithm="chain"`` replaces gloo's broadcast (a
    tree sent stage after stage: the trainer's link carries one copy per child
    and the last rank waits for every stage) by a pipelined chain: rank r
    receives each ``chunk_bytes`` piece from rank r - 1 and forwards it to
    r + 1 as it comes, so every link carries one copy and the update takes
    about one copy's time however many hosts there are. The chain visits the
    workers host by host (each tells the trainer its address when it joins);
    ``timeout`` bounds the wait for each piece. NCCL's broadcast already
    pipelines along a ring: ``"chain"`` is for gloo.

    >>> scheme = DistributedWeightSyncScheme(init_method="tcp://127.0.0.1:29500")
    >>> scheme.plan(workers=4)
    >>> scheme.world_size
    5
    >>> DistributedWeightSyncScheme.from_config(scheme.to_config())
    DistributedWeightSyncScheme(init_method='tcp://127.0.0.1:29500', world_size=5)
    """

    name = "distributed"
    _sender_class = DistributedWeightSender
    _receiver_class = DistributedWeightReceiver

    def __init__(self, strategy: WeightFormat | WeightStrategy = "tensordict", *,
                 backend: str = "gloo", init_method: str | None = None,
                 world_size: int | None = None, timeout: float = 60.0,
                 join_timeout: float = 300.0, max_interval: int = 0,
                 algorithm: str = "broadcast", chunk_bytes: int | None = None) -> None:
        if max_interval:
            raise ValueError("DistributedWeightSyncScheme cannot skip workers (max_interval): "
                             "a broadcast reaches every member of its group")
        super().__init__(strategy)
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        if algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
        if algorithm == "chain" and backend == "nccl":
            raise ValueError("algorithm='chain' is for gloo: NCCL's own broadcast already "
                             "pipelines along a ring (use algorithm='broadcast' with nccl)")
        if chunk_bytes is not None:
            if algorithm != "chain":
                raise ValueError(f"chunk_bytes={chunk_bytes!r} is the piece of "
                                 "algorithm='chain'; the backend's broadcast cuts its own. "
                                 "Pass algorithm='chain' with it, or leave chunk_bytes out")
            if type(chunk_bytes) is not int or not 4096 <= chunk_bytes <= 1 << 30:
                raise ValueError(f"chunk_bytes must be an int in [4096, 2**30], "
                                 f"got {chunk_bytes!r}")
        self.algorithm = algorithm
        self.chunk_bytes = chunk_bytes
        if init_method is not None:
            parse_init_method(init_method)
        if world_size is not None and (type(world_size) is not int or world_size < 2):
            raise ValueError(f"world_size must be an int >= 2 (the trainer and at least one "
                             f"worker), got {world_size!r}")
        for name, value in (("timeout", timeout), ("join_timeout", join_timeout)):
            if not isinstance(value, int | float) or not 0 < value <= 86400:
                raise ValueError(f"{name} must be seconds in (0, 86400], got {value!r}")
        self.backend = backend
        self.init_method = init_method
        self.world_size = world_size
        self.timeout = float(timeout)
        self.join_timeout = float(join_timeout)

    def plan(self, *, workers: int, remote_workers: int = 0,
             on_worker_loss: str = "raise") -> None:
        if on_worker_loss != "raise":
            raise ValueError(
                f"DistributedWeightSyncScheme cannot serve on_worker_loss={on_worker_loss!r}: "
                "its process group has a fixed membership, a lost worker breaks every later "
                "broadcast and no replacement can join. Use on_worker_loss='raise', or "
                "ZmqWeightSyncScheme (any host) / SharedMemWeightSyncScheme (one host), whose "
                "workers may come and go")
        if self.world_size is not None and self.world_size != workers + 1:
            raise ValueError(f"DistributedWeightSyncScheme(world_size={self.world_size}) but "
                             f"the collector has {workers} workers: world_size is workers + 1 "
                             "(leave it out: the collector sets it)")
        self.world_size = workers + 1
        if self.init_method is None:
            if remote_workers:
                raise ValueError(
                    "DistributedWeightSyncScheme with remote workers needs init_method="
                    "'tcp://HOST:PORT', an address of the trainer that those hosts reach "
                    "(the default, a port on 127.0.0.1, serves local workers only)")
            self.init_method = f"tcp://127.0.0.1:{free_port()}"

    def init_on_sender(self, model_id: str = "policy", *, hub: HubLike, model: Any = None,
                       workers: Workers | None = None) -> WeightSender:
        self._require_planned()
        return super().init_on_sender(model_id, hub=hub, model=model, workers=workers)

    def init_on_worker(self, model_id: str = "policy", *, model: Any = None, root: Any = None,
                       on_apply: Any = None) -> WeightReceiver:
        self._require_planned()
        return super().init_on_worker(model_id, model=model, root=root, on_apply=on_apply)

    init_on_receiver = init_on_worker

    def _require_planned(self) -> None:
        if self.world_size is None or self.init_method is None:
            raise ValueError("DistributedWeightSyncScheme needs world_size= and init_method= "
                             "(a collector sets them: MultiCollector(..., weight_sync_schemes="
                             "{'policy': DistributedWeightSyncScheme()}))")

    def _options(self) -> dict[str, Any]:
        options: dict[str, Any] = {}
        if self.backend != "gloo":
            options["backend"] = self.backend
        if self.init_method is not None:
            options["init_method"] = self.init_method
        if self.world_size is not None:
            options["world_size"] = self.world_size
        if self.timeout != 60.0:
            options["timeout"] = self.timeout
        if self.join_timeout != 300.0:
            options["join_timeout"] = self.join_timeout
        if self.algorithm != "broadcast":
            options["algorithm"] = self.algorithm
        if self.chunk_bytes is not None:
            options["chunk_bytes"] = self.chunk_bytes
        return options

    def _group_options(self) -> dict[str, Any]:
        return {"backend": self.backend, "init_method": self.init_method,
                "world_size": self.world_size, "timeout": self.timeout,
                "join_timeout": self.join_timeout, "algorithm": self.algorithm,
                "chunk_bytes": self.chunk_bytes or CHAIN_CHUNK_BYTES}

    _sender_options = _group_options
    _receiver_options = _group_options


class _RefusingSender(WeightSender):
    async def send_async(self, weights: Any = None, worker_ids: WorkerIds = None) -> int:
        raise WeightSyncError(
            f"model {self.model_id!r} uses NoWeightSyncScheme: its weights are never sent. "
            "Use ZmqWeightSyncScheme or SharedMemWeightSyncScheme to update workers.")

    async def send_latest(self, worker_ids: WorkerIds = None, *,
                          direct: bool = False) -> int | None:
        return None  # nothing to catch up on: workers keep their own weights


class _RefusingReceiver(WeightReceiver):
    def _load(self, message: Message) -> Any:
        raise WeightSyncError(f"this worker does not sync the weights of {self.model_id!r} "
                              "(NoWeightSyncScheme)")


class NoWeightSyncScheme(WeightSyncScheme):
    """Workers keep their own weights. Sending raises instead of silently doing nothing.

    >>> NoWeightSyncScheme().to_config()
    {'scheme': 'none', 'strategy': 'tensordict'}
    """

    name = "none"
    _sender_class = _RefusingSender
    _receiver_class = _RefusingReceiver

    def _resolve(self, model_id: str, model: Any, root: Any) -> Any:
        return model  # nothing is ever applied: no model needed


class _InProcessSender(WeightSender):
    """Skips the snapshot when every receiver steps with the sender's own model object."""

    def __init__(self, *args: Any, scheme: InProcessWeightSyncScheme, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._scheme = scheme

    async def _prepare(self, source: Any, version: int) -> tuple[Any, dict[str, Any]]:
        models = [r.model for r in self._scheme._receivers.values()]
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
                                        max_interval=self.max_interval, scheme=self)
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
