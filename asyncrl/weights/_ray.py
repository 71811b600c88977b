"""Weights through Ray's object store: one ``ray.put`` per version, the version over ZeroMQ.

:class:`RayWeightSyncScheme` with its two ends (TorchRL's ``RayTransport``).

**Trainer** (:class:`RayWeightSender`). A send copies the model's tensors into
one flat ``uint8`` buffer (sorted keys, the layout of
:class:`~asyncrl.weights._collective.FlatLayout`) and ``ray.put``\\ s it once:
tensors only, no module is pickled. Its ``ObjectRef`` is published in a small
store actor the sender owns (``num_cpus=0``, on the trainer's node, named
``asyncrl-weights-<id>``): an ``ObjectRef`` cannot travel in our messages
(nothing is pickled on the wire, and a ref rebuilt from its id is not
registered with its owner), but one returned by an actor call is, with Ray's
borrower accounting. Then the usual ``weights`` message, versioned and
acknowledged, carries only ``{store, namespace, version, nbytes, layout}``.

**Worker** (:class:`RayWeightReceiver`, inside a Ray worker: the actors of
:func:`asyncrl.launch.ray.launch_workers` / ``launch_hosts``). On the message
it asks the store for the version's ref (an actor call, not awaited); at the
next step boundary it gets the buffer (``ray.get``: Ray moves it to this node
once, every worker of the node then maps the same copy), checks its size,
copies it into the model and acks with the version. Newest wins as in every
scheme: a pending version replaced by a newer one is never fetched, and a version
older than or equal to the one held is acked with that one, never applied.

**What a worker checks.** Ray unpickles what it moves, so the trust boundary is Ray's
cluster: whoever can run code on it can run code in the workers. Still, before
asking Ray anything, the message is checked (``ProtocolError``): its fields and
bounds, the trainer's layout read back (:func:`read_layout`: bounded JSON) and held
against this model with the check every receiver makes (``check_compatible``:
missing, unexpected or mis-shaped keys, plus dtypes since bytes are copied as they
are: ``WeightMismatchError``), its size against the model's. The fetched object must
be a flat, contiguous ``uint8`` array of exactly that size, copied through this
model's own layout: a claim never decides what is allocated or written where.

**Lifetime.** The sender keeps a version's ref (and the store keeps its copy)
while it is the latest (a late joiner gets it) or a message announcing it is
queued or unacknowledged; then both are dropped and Ray frees the object once
no worker borrows it. Every Ray call is bounded by ``timeout``.
"""

from __future__ import annotations

import os
import uuid
import warnings
from typing import Any, NamedTuple

import anyio
import torch

from transports import Message, ProtocolError, Ticket, copy_into

from ._collective import FlatLayout, read_layout
from ._errors import WeightSyncError
from ._newest import Queued
from ._receiver import PendingUpdate, WeightReceiver
from ._scheme import WeightSyncScheme
from ._sender import THREAD_COPY_BYTES, WeightSender, WorkerIds
from ._strategy import WeightFormat, WeightStrategy, check_compatible, flat_tensors

__all__ = ["RayWeightReceiver", "RayWeightSender", "RayWeightSyncScheme"]

STORE_PREFIX = "asyncrl-weights-"
#: Longest store name or namespace a worker accepts (hostile input is bounded).
MAX_NAME = 200
#: Longest layout description a worker accepts (about 40 bytes per tensor).
MAX_LAYOUT = 1 << 22


def _ray(*, connect: bool = False) -> Any:
    """The ``ray`` module, connected. ``connect``: a worker process that a Ray actor
    spawned (``launch_hosts``) is not a Ray worker itself; it joins the cluster named by
    ``RAY_ADDRESS``, which the actor sets for its children."""
    try:
        import ray
    except ImportError as exc:  # pragma: no cover - depends on the optional extra
        raise WeightSyncError("RayWeightSyncScheme needs Ray: pip install 'asyncrl[ray]', "
                              "or use ZmqWeightSyncScheme") from exc
    address = os.environ.get("RAY_ADDRESS")
    if connect and address and not ray.is_initialized():
        ray.init(address=address, log_to_driver=False, configure_logging=False)
    if not ray.is_initialized():
        raise WeightSyncError(
            "RayWeightSyncScheme needs a connected Ray: call ray.init() in the trainer, and "
            "start the workers inside Ray (asyncrl.launch.ray.launch_workers / launch_hosts); "
            "for workers outside Ray use ZmqWeightSyncScheme")
    return ray


def _sorted_flat(obj: Any, *, live: bool = False) -> dict[str, torch.Tensor]:
    flat = flat_tensors(obj, live=live)
    return {key: flat[key] for key in sorted(flat)}


class WeightStore:
    """The Ray actor that holds each live version's ref for the workers (one per sender)."""

    def __init__(self) -> None:
        self.refs: dict[int, Any] = {}

    def publish(self, version: int, refs: list[Any]) -> None:
        # Wrapped in a list so that Ray hands the ref over instead of resolving it.
        self.refs[version] = refs[0]

    def fetch(self, version: int) -> list[Any] | None:
        ref = self.refs.get(version)
        return None if ref is None else [ref]

    def drop(self, versions: list[int]) -> None:
        for version in versions:
            self.refs.pop(version, None)


class RayWeightSender(WeightSender):
    """A :class:`WeightSender` that puts each version once in Ray's object store.

    Made by :meth:`RayWeightSyncScheme.init_on_sender
    <asyncrl.weights.WeightSyncScheme.init_on_sender>` in a process where
    ``ray.init()`` ran. ``refs_held`` says how many versions' objects it keeps
    alive (the latest, and those announced but not yet acknowledged).

    >>> scheme = RayWeightSyncScheme()                                 # doctest: +SKIP
    >>> sender = scheme.init_on_sender("policy", hub=hub, model=policy,
    ...                                workers=coordinator.roster.worker_peers)   # doctest: +SKIP
    >>> await sender.send(timeout=30)   # one ray.put; the version over ZeroMQ  # doctest: +SKIP
    """

    relayable = False  # the message is tiny; Ray itself moves the bytes once per node
    takes_codecs = False  # what Ray moves is applied as it is

    def __init__(self, model_id: str, hub: Any, *, timeout: float = 60.0, **kwargs: Any) -> None:
        super().__init__(model_id, hub, snapshot=False, **kwargs)
        self.timeout = timeout
        self._store: Any = None
        self._store_name = ""
        self._namespace = ""
        self._layout: FlatLayout | None = None
        self._buffer: torch.Tensor | None = None
        self._refs: dict[int, Any] = {}  # version -> ObjectRef, kept alive here
        self._tickets: dict[int, list[Ticket]] = {}  # version -> messages announcing it

    @property
    def refs_held(self) -> int:
        """Versions whose object this sender keeps alive now."""
        return len(self._refs)

    @property
    def store_name(self) -> str:
        """The store actor's name ('' before the first send)."""
        return self._store_name

    async def _prepare(self, source: Any, version: int) -> tuple[Any, dict[str, Any]]:
        ray = _ray()
        flat = _sorted_flat(self.strategy.extract_weights(source))
        layout = FlatLayout.of(flat)
        if layout != self._layout or self._buffer is None:
            self._layout, self._buffer = layout, layout.empty(torch.device("cpu"))
        if layout.nbytes > THREAD_COPY_BYTES:
            ref = await anyio.to_thread.run_sync(self._put, ray, flat)
        else:
            ref = self._put(ray, flat)
        store = await self._get_store(ray)
        await anyio.to_thread.run_sync(self._call, ray, store.publish.remote(version, [ref]))
        self._refs[version] = ref
        self._release()
        body = {"store": self._store_name, "namespace": self._namespace, "version": version,
                "nbytes": layout.nbytes, "layout": layout.describe()}
        return body, {}

    def _put(self, ray: Any, flat: dict[str, torch.Tensor]) -> Any:
        """One copy into the flat buffer, one into the object store (``ray.put``)."""
        assert self._layout is not None and self._buffer is not None
        for key, view in self._layout.views(self._buffer).items():
            copy_into(view, flat[key].detach())
        return ray.put(self._buffer.numpy())

    def _call(self, ray: Any, pending: Any) -> Any:
        try:
            return ray.get(pending, timeout=self.timeout)
        except Exception as exc:
            raise WeightSyncError(
                f"model {self.model_id!r}: the weight store actor {self._store_name!r} did not "
                f"answer within {self.timeout} s ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0][:200] if str(exc) else ''}); is the Ray cluster "
                "alive? Raise RayWeightSyncScheme(timeout=...) for a slow cluster") from exc

    async def _get_store(self, ray: Any) -> Any:
        if self._store is None:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            here = ray.get_runtime_context()
            self._store_name = f"{STORE_PREFIX}{self.model_id[:40]}-{uuid.uuid4().hex[:12]}"
            self._namespace = here.namespace
            self._store = ray.remote(num_cpus=0)(WeightStore).options(
                name=self._store_name, namespace=self._namespace, max_restarts=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(here.get_node_id(), soft=True),
            ).remote()
        return self._store

    def _on_transmit(self, queued: Queued, ticket: Ticket) -> None:
        self._tickets.setdefault(queued.version, []).append(ticket)

    def _release(self) -> None:
        """Drop the refs of versions nobody can fetch any more (see the module docstring)."""
        used = {self._version, max(self._refs, default=0)}
        used.update(queued.version for queued in self._lanes.queued())
        for version, tickets in list(self._tickets.items()):
            tickets[:] = [t for t in tickets if t.pending]
            if tickets:
                used.add(version)
            else:
                del self._tickets[version]
        freed = [v for v in self._refs if v not in used]
        for version in freed:
            del self._refs[version]
        if freed and self._store is not None:
            self._store.drop.remote(freed)  # not awaited: the store answers in order

    async def wait_ack(self, timeout: float | None = None) -> dict[int, int]:
        try:
            return await super().wait_ack(timeout)
        finally:
            self._release()

    async def send_async(self, weights: Any = None, worker_ids: WorkerIds = None) -> int:
        version = await super().send_async(weights, worker_ids)
        self._release()
        return version

    async def aclose(self) -> None:
        await super().aclose()
        store, self._store = self._store, None
        self._refs.clear()
        self._tickets.clear()
        if store is not None:
            try:
                _ray().kill(store)
            except Exception:  # Ray already shut down: the store went with it
                pass


class RayWeightReceiver(WeightReceiver):
    """A :class:`WeightReceiver` that fetches each version from Ray's object store.

    Built on a worker that runs inside Ray (``ray.is_initialized()``). The
    version's ref is asked for when the message comes; the bytes are fetched
    and copied into the model at the next step boundary (bounded by
    ``timeout``): the buffer is checked against this model's layout first.

    >>> receiver = RayWeightSyncScheme().init_on_worker("policy", model=policy)  # doctest: +SKIP
    """

    def __init__(self, model_id: str, model: Any, *, timeout: float = 60.0,
                 **kwargs: Any) -> None:
        super().__init__(model_id, model, **kwargs)
        self.timeout = timeout
        self._targets = _sorted_flat(model, live=True) if model is not None else {}
        self.layout = FlatLayout.of(self._targets)
        self._described = self.layout.describe()
        self._stores: dict[tuple[str, str], Any] = {}
        self.fetched = 0  #: versions fetched from the object store

    def _load(self, message: Message) -> Any:
        body = message.body
        version = self._check_body(body)
        if version != self._read_meta(message).version:
            raise ProtocolError(f"Ray weights say version {version}, their message "
                                f"{self._read_meta(message).version}")
        ray = _ray(connect=True)
        key = (body["namespace"], body["store"])
        store = self._stores.get(key)
        if store is None:
            try:
                store = ray.get_actor(body["store"], namespace=body["namespace"])
            except ValueError as exc:
                raise WeightSyncError(f"weights for {self.model_id!r}: no weight store actor "
                                      f"{body['store']!r} in namespace {body['namespace']!r} "
                                      "(the trainer's sender is gone?)") from exc
            self._stores = {key: store}  # one trainer at a time: forget a former one's
        # Asked now, not awaited: the ref is on its way while the rollout steps.
        return store.fetch.remote(version)

    def _check_body(self, body: Any) -> int:
        if not (isinstance(body, dict) and isinstance(body.get("store"), str)
                and body["store"].startswith(STORE_PREFIX) and len(body["store"]) <= MAX_NAME
                and isinstance(body.get("namespace"), str) and len(body["namespace"]) <= MAX_NAME
                and type(body.get("version")) is int and body["version"] >= 1
                and type(body.get("nbytes")) is int and isinstance(body.get("layout"), str)
                and len(body["layout"]) <= MAX_LAYOUT):
            raise ProtocolError(
                "Ray weights must be {'store': 'asyncrl-weights-...', 'namespace': str, "
                f"'version': int >= 1, 'nbytes': int, 'layout': str}}, got {body!r:.200}")
        if body["layout"] != self._described:  # (the same text: the same layout)
            self._check_layout(body["layout"])
        if body["nbytes"] != self.layout.nbytes:
            raise ProtocolError(f"Ray weights of {body['nbytes']} bytes for a layout of "
                                f"{self.layout.nbytes}")
        return int(body["version"])

    def _check_layout(self, description: str) -> None:
        """The trainer's layout against this model: the check every receiver makes
        (``check_compatible``: keys and shapes), and dtypes, since the bytes are copied as
        they are. ``ProtocolError`` for a malformed description."""
        claims = read_layout(description)
        check_compatible(self._targets, {k: _Claim(shape, getattr(torch, dtype))
                                         for k, (dtype, shape) in claims.items()},
                         what=f"the trainer's weights of {self.model_id[:100]!r}", dtypes=True)

    def _apply(self, update: PendingUpdate) -> int:
        ray = _ray()
        try:
            refs = ray.get(update.payload, timeout=self.timeout)
            if refs is None:
                raise WeightSyncError(f"version {update.version} of {self.model_id!r} is no "
                                      "longer in the trainer's weight store")
            if not (isinstance(refs, list) and len(refs) == 1
                    and isinstance(refs[0], ray.ObjectRef)):
                raise ProtocolError(f"the weight store answered {type(refs).__name__} "
                                    f"{refs!r:.100} for version {update.version} of "
                                    f"{self.model_id!r}, expected [ObjectRef]")
            buffer = ray.get(refs[0], timeout=self.timeout)
        except (WeightSyncError, ProtocolError):
            raise
        except Exception as exc:
            raise WeightSyncError(
                f"could not fetch version {update.version} of {self.model_id!r} from Ray's "
                f"object store within {self.timeout} s: {type(exc).__name__}: "
                f"{str(exc).splitlines()[0][:200] if str(exc) else ''}") from exc
        self._copy(buffer, update.version)
        self.fetched += 1
        return update.version

    def _copy(self, buffer: Any, version: int) -> None:
        import numpy as np

        if not (isinstance(buffer, np.ndarray) and buffer.dtype == np.uint8
                and buffer.ndim == 1 and buffer.size == max(self.layout.nbytes, 1)
                and buffer.flags.c_contiguous):
            what = (f"{buffer.dtype} array of shape {list(buffer.shape)}"
                    + ("" if buffer.flags.c_contiguous else ", not contiguous")
                    if isinstance(buffer, np.ndarray) else type(buffer).__name__)
            raise ProtocolError(f"version {version} of {self.model_id!r} in Ray's object store "
                                f"is not a flat uint8 buffer of {self.layout.nbytes} bytes: "
                                f"a {what[:200]} came")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # read-only: we only read it
            flat = torch.from_numpy(buffer)
        views = self.layout.views(flat)
        with torch.no_grad():
            for key, target in self._targets.items():
                copy_into(target, views[key])


class _Claim(NamedTuple):
    """A tensor as the trainer's layout describes it (what ``check_compatible`` reads)."""

    shape: tuple[int, ...]
    dtype: torch.dtype


class RayWeightSyncScheme(WeightSyncScheme):
    """Weights through Ray's object store (TorchRL's ``RayTransport``), versioned and acked.

    A send ``ray.put``\\ s one flat buffer of the model's tensors (no module is
    pickled); the version travels over the worker's link like every scheme's,
    and each worker fetches the object by reference at a step boundary (Ray
    moves it once per node), copies it into its model and acks with the
    version: frames carry exact versions, newest wins, a lost worker is
    reported by the collector (``WorkerLostError``). The trainer must have
    called ``ray.init()`` and the workers must run inside Ray
    (:func:`asyncrl.launch.ray.launch_workers` / ``launch_hosts``). Every Ray
    call is bounded by ``timeout`` seconds.

    >>> scheme = RayWeightSyncScheme(timeout=30)
    >>> scheme
    RayWeightSyncScheme(timeout=30.0)
    >>> WeightSyncScheme.from_config(scheme.to_config())
    RayWeightSyncScheme(timeout=30.0)
    """

    name = "ray"
    _sender_class = RayWeightSender
    _receiver_class = RayWeightReceiver

    def __init__(self, strategy: WeightFormat | WeightStrategy = "tensordict", *,
                 max_interval: int = 0, timeout: float = 60.0) -> None:
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
        super().__init__(strategy, max_interval=max_interval)
        self.timeout = float(timeout)

    def _options(self) -> dict[str, Any]:
        options = super()._options()
        if self.timeout != 60.0:
            options["timeout"] = self.timeout
        return options

    def _sender_options(self) -> dict[str, Any]:
        return {"timeout": self.timeout}

    _receiver_options = _sender_options
