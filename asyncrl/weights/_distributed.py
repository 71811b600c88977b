"""Weights by torch.distributed broadcast: bytes over a process group, the version over ZeroMQ.

:class:`DistributedWeightSyncScheme` with its two ends; the process group
itself (formation, broadcast, chain) is in :mod:`._collective`.

**Trainer** (:class:`DistributedWeightSender`, rank 0). The model's tensors
are copied into one preallocated contiguous buffer (one memcpy), a small
``weights`` message ``{"seq": n, "nbytes": ...}`` goes to *every* member over
its worker link (versioned and acknowledged like every other scheme), then
one ``broadcast`` of the buffer sends the bytes: one collective per update,
not one per tensor.

**Worker** (:class:`DistributedWeightReceiver`, rank ``index + 1``). Right
after its welcome a worker joins the group in a thread of its own. Each
``weights`` message tells that thread how many broadcasts the trainer has made
(``seq``); it receives them, in order, into one of two receive buffers. The
update is applied at a step boundary once its broadcast is in (a copy from
the receive buffer into the model) and acked with its version; an update
whose broadcast is still arriving waits for the next boundary, or is applied
at once when the worker is idle (``on_ready``).

A broadcast needs every member: the group is fixed when it is formed, every
send goes to all of them, and a member that dies breaks it (gloo says
"Connection closed by peer" at once; a member that hangs is cut off by the
group's ``timeout``). Nothing can rejoin: see
:class:`~asyncrl.weights.DistributedWeightSyncScheme`.
"""

from __future__ import annotations

import atexit
import logging
import threading
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel
import torch

from transports import Message, ProtocolError, RemoteError, copy_into

from ._collective import (
    CHAIN_CHUNK_BYTES,
    FlatLayout,
    Group,
    check_group_options,
    free_port,
)
from ._errors import WeightSyncError
from ._receiver import WeightReceiver
from ._scheme import WeightSyncScheme
from ._sender import THREAD_COPY_BYTES, HubLike, WeightSender, WorkerIds, Workers
from ._strategy import WeightFormat, WeightStrategy, flat_tensors

__all__ = ["DistributedWeightReceiver", "DistributedWeightSender", "DistributedWeightSyncScheme"]

log = logging.getLogger("asyncrl.weights")

#: Receive buffers per worker: one being received into while the other is applied.
RECEIVE_BUFFERS = 2
#: Seconds ``close()`` waits for the group's thread (idle, it wakes every WAKE_EVERY s).
JOIN_ON_CLOSE = 2.0
WAKE_EVERY = 0.1
#: What a failed collective means for every later send (the sender's errors end with it).
BROKEN_GROUP = ("A worker of the process group died or hung; the group is broken for good "
                "(its membership is fixed), so no later send can succeed")
#: The scheme's options at their defaults (left out of ``to_config()``), in config order.
_DEFAULT_OPTIONS: dict[str, Any] = {
    "backend": "gloo", "init_method": None, "world_size": None, "timeout": 60.0,
    "join_timeout": 300.0, "algorithm": "broadcast", "chunk_bytes": None}


def _sorted_flat(obj: Any, *, live: bool = False) -> dict[str, torch.Tensor]:
    flat = flat_tensors(obj, live=live)
    return {key: flat[key] for key in sorted(flat)}


def _prefix(model_id: str) -> str:
    return f"asyncrl/weights/{model_id}/"


class DistributedWeightSender(WeightSender):
    """Rank 0 of the weights' process group: one memcpy and one broadcast per send.

    Made by :meth:`DistributedWeightSyncScheme.init_on_sender
    <asyncrl.weights.WeightSyncScheme.init_on_sender>`. :meth:`connect` forms
    the group (the collectors run it at once, in :meth:`run`); a send waits for
    it, bounded by ``join_timeout``; each broadcast is bounded by ``timeout``.
    Every send goes to every member; a send after a member was lost, or after
    a failed collective, raises ``WeightSyncError``.

    >>> scheme = DistributedWeightSyncScheme(world_size=3)                 # doctest: +SKIP
    >>> sender = scheme.init_on_sender("policy", hub=hub, model=policy,
    ...                                workers=coordinator.roster.worker_peers)   # doctest: +SKIP
    >>> await sender.send(timeout=30)   # version over ZeroMQ, bytes by broadcast  # doctest: +SKIP
    """

    relayable = False  # every member receives the collective itself
    takes_codecs = False  # the collective writes into the workers' models

    def __init__(self, model_id: str, hub: Any, *, backend: str, init_method: str,
                 world_size: int, timeout: float, join_timeout: float, algorithm: str = "broadcast",
                 chunk_bytes: int = CHAIN_CHUNK_BYTES, **kwargs: Any) -> None:
        super().__init__(model_id, hub, **kwargs)
        self._chain = {"algorithm": algorithm, "chunk_bytes": chunk_bytes}
        if self.model is None:
            raise ValueError(f"DistributedWeightSyncScheme needs the model of {model_id!r} at "
                             "init_on_sender: its broadcast buffer is allocated once, in its "
                             "layout")
        self.backend = backend
        self.init_method = init_method
        self.world_size = world_size
        self.timeout = timeout
        self.join_timeout = join_timeout
        flat = _sorted_flat(self.strategy.extract_weights(self.model))
        self.layout = FlatLayout.of(flat)
        self._buffer = self.layout.empty(self._device(flat),
                                         pin=any(t.is_cuda for t in flat.values())
                                         and backend == "gloo")
        self._views = self.layout.views(self._buffer)
        self._group: Group | None = None
        self._failure: BaseException | None = None
        self._stop = threading.Event()
        self._form_lock = anyio.Lock()
        self._seq = 0  # broadcasts made
        self._due = False  # a prepared buffer waits for its broadcast
        self.broadcasts = 0  #: collectives completed (one per send; catch-ups make none)

    def _device(self, flat: dict[str, torch.Tensor]) -> torch.device:
        if self.backend != "nccl":
            return torch.device("cpu")
        cuda = [t.device for t in flat.values() if t.is_cuda]
        if cuda:
            return cuda[0]
        if not torch.cuda.is_available():
            raise ValueError("backend='nccl' needs CUDA on the trainer; use backend='gloo' "
                             "(CPU, or CUDA tensors staged through host memory)")
        return torch.device("cuda", torch.cuda.current_device())

    @property
    def members(self) -> list[int]:
        """The worker ids of the group's ranks ``1..world_size - 1``."""
        return list(range(self.world_size - 1))

    @property
    def connected(self) -> bool:
        return self._group is not None

    async def connect(self) -> None:
        """Form the process group (once); bounded by ``timeout``. Raises why it could not."""
        async with self._form_lock:
            if self._failure is not None:
                raise self._failure
            if self._group is not None:
                return
            try:
                self._group = await anyio.to_thread.run_sync(self._form, abandon_on_cancel=True)
            except Exception as exc:
                self._failure = WeightSyncError(
                    f"model {self.model_id!r}: the process group at {self.init_method} "
                    f"({self.backend}, {self.world_size} ranks) could not be formed: {exc}")
                self._failure.__cause__ = exc
                raise self._failure from exc

    def _form(self) -> Group:
        return Group.form(self.init_method, world_size=self.world_size, backend=self.backend,
                          timeout=self.timeout, join_timeout=self.join_timeout,
                          layout=self.layout,
                          prefix=_prefix(self.model_id), stop=self._stop, **self._chain)

    async def run(self) -> None:
        """Form the group, then transmit queued versions (see :meth:`WeightSender.run`)."""
        try:
            await self.connect()
        except WeightSyncError as exc:
            if not self._stop.is_set():  # (closed while forming: nothing to report)
                log.error("%s", exc)  # kept: every send raises it
        await super().run()

    async def send_async(self, weights: Any = None, worker_ids: WorkerIds = None) -> int:
        """Copy the weights into the buffer, tell every member, broadcast; return the version.

        ``worker_ids`` may only name every member (a collective reaches them all).
        The broadcast is over when this returns; the acks come with ``wait_ack``.
        """
        if worker_ids is not None:
            ids = {worker_ids} if isinstance(worker_ids, int) else set(worker_ids)
            if ids != set(self.members):
                raise ValueError(f"DistributedWeightSyncScheme broadcasts to every worker of "
                                 f"its process group ({self.members}); got worker_ids="
                                 f"{sorted(ids)}. Use ZmqWeightSyncScheme to update some")
        await self.connect()
        return await super().send_async(weights, None)

    async def _prepare(self, source: Any, version: int) -> tuple[Any, dict[str, Any]]:
        self._check_members()
        flat = _sorted_flat(self.strategy.extract_weights(source))
        if FlatLayout.of(flat) != self.layout:
            raise WeightSyncError(
                f"model {self.model_id!r}: these weights' keys, dtypes or shapes differ from "
                "the model the process group was formed for; its buffer has a fixed layout")
        if self.layout.nbytes > THREAD_COPY_BYTES:
            await anyio.to_thread.run_sync(self._fill, flat)
        else:
            self._fill(flat)
        self._seq += 1
        self._due = True
        return {"seq": self._seq, "nbytes": self.layout.nbytes}, {}

    def _fill(self, flat: dict[str, torch.Tensor]) -> None:
        for key, view in self._views.items():
            copy_into(view, flat[key])

    async def _dispatch(self) -> None:
        # Every notice goes out now, whatever is in transit: the broadcast that follows
        # waits for each member to read its notice (newest wins stays on the worker).
        for lane in self._lanes.values():
            lane.ticket = None
        await super()._dispatch()
        if self._due:
            self._due = False
            await self._broadcast()

    async def _broadcast(self) -> None:
        group = self._group
        assert group is not None
        try:
            # Not abandoned on cancel: the collective ends within the group's timeout.
            await anyio.to_thread.run_sync(group.broadcast, self._buffer)
        except Exception as exc:
            self._failure = WeightSyncError(
                f"model {self.model_id!r}: the broadcast of version {self._version} "
                f"failed ({str(exc).splitlines()[0][:300]}). {BROKEN_GROUP}")
            raise self._failure from exc
        self.broadcasts += 1

    async def wait_ack(self, timeout: float | None = None) -> dict[int, int]:
        try:
            return await super().wait_ack(timeout)
        except RemoteError as exc:
            # A chain's broken link is seen by the ranks beside it, not by the trainer's own
            # send: their report breaks the group here too, under the broadcast's own error.
            if not exc.remote_type.endswith(".WeightSyncError") or self._failure is not None:
                raise
            self._failure = WeightSyncError(
                f"model {self.model_id!r}: the broadcast of version {self._version} (or an "
                f"earlier one) failed at a worker ({exc.remote_message[:300]}). {BROKEN_GROUP}")
            raise self._failure from exc

    def _check_members(self) -> None:
        if self._failure is not None:
            raise self._failure
        live = self.workers
        gone = [w for w in self.members if w not in live]
        if gone:
            self._failure = WeightSyncError(
                f"model {self.model_id!r}: worker(s) {gone} of the process group are gone; a "
                "broadcast needs every member and nothing can rejoin a formed group. "
                "DistributedWeightSyncScheme serves runs whose workers stay (on_worker_loss="
                "'raise'); use ZmqWeightSyncScheme or SharedMemWeightSyncScheme (one host) "
                "for runs that lose or replace workers")
            raise self._failure

    async def aclose(self) -> None:
        self._stop.set()
        group, self._group = self._group, None
        await super().aclose()
        if group is not None:
            group.close()


class DistributedWeightReceiver(WeightReceiver):
    """Rank ``index + 1`` of the weights' process group: receives broadcasts, applies by copy.

    Made by the scheme's ``init_on_worker``; :meth:`admitted` (the worker's
    welcome) starts the thread that joins the group and receives the
    broadcasts each message announces. ``on_ready`` (set by the
    :class:`~asyncrl.weights.WeightApplier`) runs on the event loop when an
    update whose broadcast was still arriving is in.

    >>> receiver = scheme.init_on_worker("policy", root=worker)   # doctest: +SKIP
    >>> receiver.admitted(0)          # rank 1: joins in a thread  # doctest: +SKIP
    """

    def __init__(self, model_id: str, model: Any, *, backend: str, init_method: str,
                 world_size: int, timeout: float, join_timeout: float, algorithm: str = "broadcast",
                 chunk_bytes: int = CHAIN_CHUNK_BYTES, **kwargs: Any) -> None:
        super().__init__(model_id, model, **kwargs)
        self._chain = {"algorithm": algorithm, "chunk_bytes": chunk_bytes}
        self.backend = backend
        self.init_method = init_method
        self.world_size = world_size
        self.timeout = timeout
        self.join_timeout = join_timeout
        self._targets = _sorted_flat(model, live=True) if model is not None else {}
        self.layout = FlatLayout.of(self._targets)
        self._buffers: list[torch.Tensor] = []
        self._state = threading.Condition(self._lock)  # guards the fields below too
        self._wanted = 0  # broadcasts announced
        self._posted = 0  # broadcasts entered
        self._completed = 0  # broadcasts received
        self._reading: int | None = None  # the buffer an apply copies from
        self._failure: BaseException | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._rank = 0
        self._token: Any = None

    @property
    def rank(self) -> int:
        """This worker's rank in the group (0 until admitted)."""
        return self._rank

    @property
    def received(self) -> int:
        """Broadcasts received so far."""
        return self._completed

    def admitted(self, index: int) -> None:
        """Join the group as rank ``index + 1`` (event loop, after the welcome; returns at once)."""
        rank = index + 1
        if self._thread is not None:
            if rank != self._rank:
                raise WeightSyncError(
                    f"this worker was admitted again as worker {index}, but it is rank "
                    f"{self._rank} of the process group: a formed group cannot change. "
                    "Restart the run, or use ZmqWeightSyncScheme")
            return
        self._rank = rank
        self._token = anyio.lowlevel.current_token()
        self._thread = threading.Thread(target=self._serve, name=f"asyncrl-broadcast-{rank}",
                                        daemon=True)
        self._thread.start()
        atexit.register(self.close)  # end the group before the interpreter's finalisation

    # -- the group's thread ---------------------------------------------------------------
    def _serve(self) -> None:
        try:
            group = Group.join(self.init_method, rank=self._rank, world_size=self.world_size,
                               backend=self.backend, timeout=self.timeout,
                               join_timeout=self.join_timeout, layout=self.layout,
                               prefix=_prefix(self.model_id), stop=self._stop, **self._chain)
        except Exception as exc:
            self._fail(exc, "could not join the process group")
            return
        try:
            device = self._device()
            self._buffers = [self.layout.empty(device) for _ in range(RECEIVE_BUFFERS)]
            while self._receive_next(group):
                pass
        except Exception as exc:
            self._fail(exc, "a broadcast failed")
        finally:
            group.close()

    def _receive_next(self, group: Group) -> bool:
        with self._state:
            while self._wanted <= self._posted and not self._stop.is_set():
                self._state.wait(WAKE_EVERY)
            if self._stop.is_set():
                return False
            seq = self._posted + 1
            index = seq % RECEIVE_BUFFERS
            while self._reading == index and not self._stop.is_set():
                self._state.wait(WAKE_EVERY)  # an apply still copies the older broadcast out
            self._posted = seq
        group.broadcast(self._buffers[index])
        with self._state:
            self._completed = seq
        self._notify_ready()
        return True

    def _device(self) -> torch.device:
        if self.backend != "nccl":
            return torch.device("cpu")
        cuda = [t.device for t in self._targets.values() if t.is_cuda]
        if not cuda:
            raise WeightSyncError("backend='nccl' needs the worker's model on a CUDA device "
                                  "(policy_device='cuda'); use backend='gloo' for CPU workers")
        return cuda[0]

    def _fail(self, exc: BaseException, what: str) -> None:
        if self._stop.is_set():
            return  # closing: nothing waits for it
        failure = WeightSyncError(f"worker rank {self._rank}: {what}: "
                                  f"{str(exc).splitlines()[0][:300] if str(exc) else exc!r}")
        failure.__cause__ = exc
        log.error("%s", failure)
        with self._state:
            self._failure = failure
        self._notify_ready()

    def _notify_ready(self) -> None:
        callback = self.on_ready
        if callback is None or self._token is None:
            return
        try:
            anyio.from_thread.run_sync(callback, token=self._token)
        except Exception:  # the worker's event loop is gone: nobody to tell
            log.debug("could not reach the event loop to apply a received broadcast")

    # -- the receiver's three calls ---------------------------------------------------------
    def _load(self, message: Message) -> Any:
        body = message.body
        if not (isinstance(body, dict) and type(body.get("seq")) is int and body["seq"] >= 1
                and type(body.get("nbytes")) is int):
            raise ProtocolError("broadcast weights must be {'seq': int >= 1, 'nbytes': int}, "
                                f"got {body!r:.200}")
        if body["nbytes"] != self.layout.nbytes:
            raise WeightSyncError(f"the trainer broadcasts {body['nbytes']} bytes of "
                                  f"{self.model_id!r}, this worker's model has "
                                  f"{self.layout.nbytes}: not the same architecture")
        with self._state:
            if self._failure is not None:
                raise self._failure
            if body["seq"] > self._wanted:
                self._wanted = body["seq"]
                self._state.notify_all()
        return body["seq"]

    def apply_pending(self) -> bool:
        """Apply the newest update once its broadcast is in; True if the model changed."""
        if self._pending is None:  # hot-loop fast path
            return False
        with self._apply_lock:
            with self._state:
                update = self._pending
                if update is None:
                    return False
                failure = self._failure
                if failure is None and update.payload > self._completed:
                    return False  # still arriving: the next boundary (or on_ready) applies it
                waiting, self._pending, self._waiting = self._waiting, None, []
                if failure is None:
                    self._reading = update.payload % RECEIVE_BUFFERS
            if failure is not None:
                self.last_error = failure
                self._ack_all(waiting, None, failure)
                return False
            try:
                if update.version <= self._version:
                    self._ack_all(waiting, self._version, None)
                    return False
                self._copy(self._buffers[update.payload % RECEIVE_BUFFERS])
            except Exception as exc:
                self.last_error = exc
                self._ack_all(waiting, None, exc)
                return False
            finally:
                with self._state:
                    self._reading = None
                    self._state.notify_all()
            self._version = update.version
            if self.on_apply is not None:
                self.on_apply(update.version)
            self._ack_all(waiting, update.version, None)
            return True

    def _copy(self, buffer: torch.Tensor) -> None:
        views = self.layout.views(buffer)
        with torch.no_grad():
            for key, target in self._targets.items():
                copy_into(target, views[key])
        if buffer.is_cuda:
            torch.cuda.current_stream(buffer.device).synchronize()

    def close(self) -> None:
        self._stop.set()
        with self._state:
            self._state.notify_all()
        thread = self._thread
        atexit.unregister(self.close)
        if thread is not None and thread is not threading.current_thread():
            # The group is torn down in its own thread, before the process exits (a
            # process group destroyed by the interpreter's exit aborts the process).
            thread.join(JOIN_ON_CLOSE)
        super().close()


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
    rejoin (``fixed_membership``), so a collector with ``on_worker_loss`` other
    than ``"raise"`` is refused; use :class:`ZmqWeightSyncScheme` (or
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
    fixed_membership = True
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
        check_group_options(backend=backend, algorithm=algorithm, chunk_bytes=chunk_bytes,
                            init_method=init_method, world_size=world_size, timeout=timeout,
                            join_timeout=join_timeout)
        self.algorithm = algorithm
        self.chunk_bytes = chunk_bytes
        self.backend = backend
        self.init_method = init_method
        self.world_size = world_size
        self.timeout = float(timeout)
        self.join_timeout = float(join_timeout)

    def plan(self, *, workers: int, remote_workers: int = 0) -> None:
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
        return {name: getattr(self, name) for name, default in _DEFAULT_OPTIONS.items()
                if getattr(self, name) != default}

    def _group_options(self) -> dict[str, Any]:
        return {"backend": self.backend, "init_method": self.init_method,
                "world_size": self.world_size, "timeout": self.timeout,
                "join_timeout": self.join_timeout, "algorithm": self.algorithm,
                "chunk_bytes": self.chunk_bytes or CHAIN_CHUNK_BYTES}

    _sender_options = _group_options
    _receiver_options = _group_options
