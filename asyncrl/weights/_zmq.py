"""The ZeroMQ scheme (the default, any host) and its two ends: big versions streamed in chunks.

Trainer: a version bigger than ``chunk_bytes`` goes out as a sequence of chunk
messages, views of the snapshot (see :mod:`._chunks`); only the last one asks
for an acknowledgement, which covers the stream since ZeroMQ keeps a
connection's order.

Worker: each chunk is checked and copied into a receive buffer as it arrives
(while the next one is on the wire), never into the model: the policy may be
stepping with it, and a stream cut off or refused halfway must leave the model
whole. Once the last chunk is in, the version is pending like any other; at
the next step boundary the model's parameters are pointed at the buffer
(``param.data = buffer``, no copy) and their previous storage becomes the
receive buffer of the next version. So a worker holds its model, one receive
buffer and one chunk in flight, never a whole message besides: frames keep
exact versions, as with whole messages.

``in_place`` (for models too big to hold twice): no receive buffer. From a
stream's first chunk the receiver *holds* the model: the worker's rollout
waits at its next step boundary (:meth:`WeightApplier.before_step
<asyncrl.weights.WeightApplier.before_step>`), or the model is idle between
batches, and the receiver is told so (:meth:`StreamedWeightReceiver.park`);
from then on each chunk is written into the model's own tensors as it comes
(the chunks that came before wait in a backlog). After the last one the version
is applied (nothing left to copy) and the rollout goes on. A stream that fails
once writing began leaves the model *torn*: the next step fails with a
``WeightSyncError`` instead of stepping with it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import anyio
import torch
from torch import nn

from transports import Message, PeerLostError, ProtocolError, Ticket, copy_into

from .._protocol import WEIGHTS_KIND, WeightChunk, WeightMeta
from ._chunks import (
    DEFAULT_CHUNK_BYTES,
    ChunkAssembly,
    ChunkFilling,
    Layout,
    check_layout,
    chunk_bodies,
    empty_buffers,
    plan_chunks,
    streamable,
    total_nbytes,
)
from ._errors import WeightSyncError
from ._newest import Offer, offer
from ._receiver import AckRoute, PendingUpdate, WeightReceiver
from ._scheme import WeightSyncScheme
from ._sender import WeightSender
from ._strategy import WeightFormat, WeightStrategy, flat_tensors

__all__ = ["StreamedWeightReceiver", "StreamingWeightSender", "ZmqWeightSyncScheme"]


class StreamingWeightSender(WeightSender):
    """A :class:`WeightSender` that streams versions above ``chunk_bytes`` in chunks (0: never).

    ``ZmqWeightSyncScheme(chunk_bytes=...).init_on_sender(...)`` builds it.

    >>> from torch import nn
    >>> from asyncrl.weights import ZmqWeightSyncScheme
    >>> from transports import LocalHub
    >>> sender = ZmqWeightSyncScheme(chunk_bytes=1 << 20).init_on_sender(
    ...     "policy", hub=LocalHub(), model=nn.Linear(1024, 1024), workers={})
    >>> len(sender._plan(sender.model.state_dict()))   # 4.2 MB in chunks of 1 MiB
    5
    """

    def __init__(self, *args: Any, chunk_bytes: int = DEFAULT_CHUNK_BYTES, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if chunk_bytes < 0:
            raise ValueError(f"chunk_bytes must be >= 0 (0: never chunk), got {chunk_bytes}")
        self.chunk_bytes = chunk_bytes
        #: Chunk messages handed to the hub (each counts once per peer).
        self.chunks_sent = 0

    async def _prepare(self, source: Any, version: int) -> tuple[Any, dict[str, Any]]:
        """A snapshot buffer that the chunks fill as they go out (see :class:`ChunkFilling`).

        The first transmission copies chunk *i* into the buffer just before
        handing it to ZeroMQ, so the copy of the next chunk overlaps the wire;
        :meth:`_prepared` completes the copy before ``send_async`` returns.
        """
        weights = self._encoded(self.strategy.extract_weights(source))
        flat = flat_tensors(weights)
        if not (self.snapshot and self.chunk_bytes and streamable(flat)
                and total_nbytes(flat) > self.chunk_bytes):
            return await self._snapshot(weights)
        stage = self._free_stage(weights, flat)
        filling = ChunkFilling(stage.payload, flat, flat_tensors(stage.payload),
                           plan_chunks(flat, self.chunk_bytes))
        return stage.payload, {"stage": stage, "filling": filling}

    async def _prepared(self, extra: dict[str, Any]) -> None:
        filling = extra.pop("filling", None)
        if filling is not None:
            with anyio.CancelScope(shield=True):  # never leave a half-written snapshot
                await filling.upto(len(filling.chunks) - 1)

    async def _send_payload(self, peers: list[bytes], payload: Any, meta: WeightMeta) -> Ticket:
        chunks = self._plan(payload)
        if chunks is None:
            return await super()._send_payload(peers, payload, meta)
        filling = self._filling_of(payload)
        views = flat_tensors(payload)
        live = list(peers)
        for chunk in chunks[:-1]:
            if filling is not None:
                await filling.upto(chunk.index)
            body = chunk_bodies(views, chunk)
            chunk_meta = replace(meta, chunk=chunk).to_meta()
            for peer in list(live):
                try:
                    await self.hub.send(peer, body, kind=WEIGHTS_KIND, meta=chunk_meta)
                except PeerLostError:
                    live.remove(peer)  # the last chunk's ticket reports it lost
                else:
                    self.chunks_sent += 1
        last = chunks[-1]
        if filling is not None:
            await filling.upto(last.index)
        self.chunks_sent += len(peers)
        return await self.hub.send_async(peers, chunk_bodies(views, last), kind=WEIGHTS_KIND,
                                         meta=replace(meta, chunk=last).to_meta())

    def _filling_of(self, payload: Any) -> ChunkFilling | None:
        """The snapshot being filled for ``payload``, if it is not complete yet."""
        for queued in self._lanes.queued():
            if queued.payload is payload:
                filling = queued.extra.get("filling")
                if isinstance(filling, ChunkFilling) and not filling.done:
                    return filling
        return None

    def _plan(self, payload: Any) -> list[WeightChunk] | None:
        """The chunks of ``payload``, or None to send it whole (small, or not byte-addressable)."""
        if not self.chunk_bytes:
            return None
        views = flat_tensors(payload)
        if not streamable(views):
            return None
        if total_nbytes(views) <= self.chunk_bytes:
            return None
        return plan_chunks(views, self.chunk_bytes)


@dataclass(eq=False)
class Staged:
    """A complete version in a receive buffer, waiting for a step boundary."""

    layout: Layout
    buffers: dict[str, torch.Tensor]


@dataclass(eq=False)
class InPlace:
    """A version already written into the model (``in_place``): nothing left to copy."""

    version: int


@dataclass(eq=False)
class ChunkStream:
    """The chunks of one version coming by one route."""

    version: int
    count: int
    assembly: ChunkAssembly | None  # None: not written (stale, superseded or failed)
    error: BaseException | None = None
    next_index: int = 0
    #: ``in_place``: its assembly writes into the model itself.
    in_place: bool = False
    #: ``in_place``: chunks that came before the model was held, in order.
    backlog: list[tuple[WeightChunk, Any]] = field(default_factory=list)
    #: ``in_place``: the last chunk's message and route, once it came (acked on completion).
    last: tuple[Message, AckRoute] | None = None
    #: ``in_place``: a chunk of it was written into the model.
    written: bool = False


class StreamedWeightReceiver(WeightReceiver):
    """A :class:`WeightReceiver` that also assembles versions streamed in chunks.

    Chunks are checked against the model's own layout and written into a
    receive buffer as they come; the model changes only when the complete
    version is applied at a step boundary: its parameters then point at the
    buffer (``zero_copy``, the default) or the buffer is copied into them
    (``zero_copy=False``, for modules that cache tensors derived from their
    parameters; buffers such as running statistics are always copied). A
    refused chunk (wrong version, index, key, offset or size) fails its
    stream with a ``ProtocolError`` sent back with the last chunk's ack; the
    model keeps the version it had.

    >>> receiver = ZmqWeightSyncScheme().init_on_worker("policy", model=policy)  # doctest: +SKIP
    >>> receiver.chunks_received                                               # doctest: +SKIP
    17
    """

    takes_chunks = True

    def __init__(self, *args: Any, zero_copy: bool = True, in_place: bool = False,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.zero_copy = zero_copy
        self.in_place = in_place
        #: Chunk messages taken (observability).
        self.chunks_received = 0
        #: ``in_place``: why the model is half-written (a stream failed after writing
        #: began), until a complete version is written; None while it is whole.
        self.torn: str | None = None
        self._streams: dict[AckRoute, ChunkStream] = {}  # event loop only
        self._spare: Staged | None = None  # the receive buffer when no stream holds it (_lock)
        self._hold: ChunkStream | None = None  # in_place: the stream that holds the model
        self._parked = False  # in_place: the model is not in use until the hold ends
        self._handing_over = False  # in_place: _start runs (see _release)

    @property
    def has_pending(self) -> bool:
        """Cheap check for the hot loop (no lock): an update, a hold, or a torn model."""
        return self._pending is not None or self._hold is not None or self.torn is not None

    @property
    def needs_park(self) -> bool:
        """``in_place``: a stream is being written into the model; it must not be used."""
        return self._hold is not None

    def park(self) -> None:
        """The model is not in use until the stream under way completes (event loop): its
        chunks that came are written now, the next ones as they come."""
        stream = self._hold
        if stream is None or self._parked:
            return
        self._parked = True
        self._drain(stream)

    # -- event loop ------------------------------------------------------------------------
    def on_message(self, message: Message, route: AckRoute = AckRoute.DIRECT) -> None:
        try:
            meta = self._read_meta(message)
            payload = None if meta.chunk is not None else self._load(message)
        except Exception as exc:
            self._ack_all([(message, route)], None, exc)
            return
        if meta.chunk is None:
            self._offer(meta.version, payload, message, route)
        else:
            self.chunks_received += 1
            self._on_chunk(message, route, meta.version, meta.chunk)

    def follow(self, instance: str) -> bool:
        changed = super().follow(instance)
        if changed:
            held = self._hold  # (in_place, its last chunk in: no longer among the streams)
            for stream in [*self._streams.values(), *([held] if held is not None else [])]:
                stream.last = None  # its version meant something to the old instance only
                self._release(stream)
            self._streams.clear()
        return changed

    def _on_chunk(self, message: Message, route: AckRoute, version: int,
                  chunk: WeightChunk) -> None:
        stream = self._streams.get(route)
        error: BaseException | None
        try:
            if chunk.index == 0:
                stream = self._start(route, version, chunk)
            elif stream is None or stream.version != version:
                raise ProtocolError(
                    f"weights chunk {chunk.index} of {chunk.count} of version {version} "
                    f"arrived with no stream of that version under way (expected "
                    + (f"chunk {stream.next_index} of version {stream.version}" if stream
                       else "a chunk 0") + "): chunks were lost, reordered or forged")
            if stream.error is None:
                self._take(stream, chunk, message.body)
            error = stream.error
        except Exception as exc:
            error = exc
            if stream is not None:  # a connection keeps order: its stream is broken
                self._fail(stream, exc)
        if chunk.last:
            if stream is not None and self._streams.get(route) is stream \
                    and stream.version == version:
                del self._streams[route]
            self._finish(stream if stream is not None and stream.version == version else None,
                         error, message, route, version)
        elif error is not None and message.needs_ack:
            self._ack_all([(message, route)], None, error)

    def _start(self, route: AckRoute, version: int, chunk: WeightChunk) -> ChunkStream:
        """A new stream on ``route`` (dropping an unfinished one): written, or skipped if stale."""
        held = self._hold
        self._handing_over = True  # in_place: a newer stream takes the held model over
        try:
            return self._start_stream(route, version, chunk)
        finally:
            self._handing_over = False
            if held is not None and self._hold is held and held.assembly is None:
                self._let_go(held)  # released, and no stream took the model over

    def _start_stream(self, route: AckRoute, version: int, chunk: WeightChunk) -> ChunkStream:
        abandoned = self._streams.pop(route, None)
        if abandoned is not None:
            self._release(abandoned)  # its last chunk never came: no ack is owed
        stream = ChunkStream(version, chunk.count, None)
        self._streams[route] = stream
        if version <= self._newest_known():
            return stream  # a newer version is applied, pending or on its way: skip this one
        for other in self._streams.values():
            if other is not stream and other.assembly is not None:
                self._release(other)  # an older version on another route: superseded
        targets = flat_tensors(self.model, live=True)
        try:
            if self.codec.identity:  # else what comes is the codec's: its decode checks it
                check_layout(chunk.layout, targets, f"streamed weights of {self.model_id!r}")
            elif self.in_place:
                raise WeightSyncError(
                    f"in_place=True writes the chunks of {self.model_id!r} into the model as "
                    f"they come, but they are encoded as {self.codec.name!r}: use a receive "
                    "buffer (in_place=False) with this codec")
        except Exception as exc:
            stream.error = exc
            return stream
        if self.in_place:
            return self._start_in_place(stream, chunk, targets)
        stream.assembly = ChunkAssembly(version, chunk.count, chunk.layout,
                                        self._claim(chunk.layout, version))
        return stream

    def _start_in_place(self, stream: ChunkStream, chunk: WeightChunk,
                        targets: Mapping[str, torch.Tensor]) -> ChunkStream:
        bad = [key for key, t in targets.items()
               if not (t.is_contiguous() and t.device.type == "cpu")]
        if bad:
            stream.error = WeightSyncError(
                f"in_place=True writes each chunk into the tensors of {self.model_id!r}, which "
                f"must be contiguous CPU tensors; {bad[:5]} are not: use "
                "ZmqWeightSyncScheme() (a receive buffer, swapped in at a step boundary)")
            return stream
        with self._lock:
            if self._pending is not None and self._pending.version < stream.version:
                # Never applied now (it would overwrite what this stream writes): its
                # messages are acked with this version once it is in, or its failure.
                dropped, self._pending = self._pending, None
                self._discard(dropped.payload)
        if self._hold is not None and self._hold is not stream:
            self._release(self._hold)  # an older one (its last chunk may have come): superseded
        stream.in_place = True
        stream.assembly = ChunkAssembly(stream.version, chunk.count, chunk.layout,
                                        {key: t.detach() for key, t in targets.items()})
        self._hold = stream
        return stream

    def _take(self, stream: ChunkStream, chunk: WeightChunk, body: Any) -> None:
        if stream.in_place and stream.assembly is not None and not self._parked:
            stream.backlog.append((chunk, body))  # the model may be stepping: not yet
            return
        if stream.assembly is not None:
            stream.assembly.write(chunk, body)  # (checks the whole chunk before a byte)
            stream.written |= stream.in_place
            stream.next_index = stream.assembly.next_index
            return
        if chunk.index != stream.next_index or chunk.count != stream.count:
            raise ProtocolError(f"weights chunk {chunk.index} of {chunk.count} of version "
                                f"{stream.version}: expected chunk {stream.next_index} of "
                                f"{stream.count}")
        stream.next_index += 1

    def _fail(self, stream: ChunkStream, error: BaseException) -> None:
        owned = stream.assembly is not None
        if stream.last is not None:  # in_place: its last chunk came, its backlog failed
            last, stream.last = stream.last, None
            self._ack_all([last], None, error)
        self._release(stream)
        if stream.error is None:
            stream.error = error  # the first error says what went wrong
        if owned:
            with self._lock:
                if self._pending is None and self._waiting:
                    # They waited for this version (it superseded theirs), which now fails.
                    waiting, self._waiting = self._waiting, []
                    for message, route in waiting:
                        self._queue_ack(message, route, None, WeightSyncError(
                            f"version {stream.version} of {self.model_id!r} superseded this "
                            f"one but its stream failed: {error}"))

    def _finish(self, stream: ChunkStream | None, error: BaseException | None, message: Message,
                route: AckRoute, version: int) -> None:
        """The last chunk of ``version`` came: offer the version, or ack the failure."""
        if error is not None:
            self._ack_all([(message, route)], None, error)
            return
        assert stream is not None
        assembly = stream.assembly
        if stream.in_place and assembly is not None:
            stream.last = (message, route)
            if not stream.backlog:
                self._complete_in_place(stream)
            return  # else once the model is held and the backlog written (park)
        if assembly is not None and assembly.complete:
            stream.assembly = None
            self._offer(version, Staged(assembly.layout, assembly.buffers), message, route)
            return
        newer = self._newest_known()
        with self._lock:  # skipped: answered by what is held, pending or on its way
            decision = offer(version, self._version, newer)
            if decision is Offer.HELD:
                self._queue_ack(message, route, self._version, None)
                return
            if decision is Offer.SUPERSEDED:  # acked with the version applied next (or failed)
                self._waiting.append((message, route))
                return
        self._ack_all([(message, route)], None, WeightSyncError(
            f"version {version} of {self.model_id!r} was skipped for a newer stream that did "
            "not complete; send again"))

    def _newest_known(self) -> int:
        """The newest version applied, pending, or being assembled."""
        newest = max(self._version, self.pending_version or 0)
        if self._hold is not None and self._hold.assembly is not None:
            newest = max(newest, self._hold.version)  # (its last chunk may have come)
        for stream in self._streams.values():
            if stream.assembly is not None:
                newest = max(newest, stream.version)
        return newest

    def _claim(self, layout: Layout, version: int) -> dict[str, torch.Tensor]:
        """The receive buffer for ``layout``: the spare, a pending older version's, or a new one."""
        with self._lock:
            spare, self._spare = self._spare, None
            if spare is None and self._pending is not None \
                    and isinstance(self._pending.payload, Staged) \
                    and self._pending.version < version:
                spare, self._pending = self._pending.payload, None  # its acks wait for ours
        if spare is not None and spare.layout == layout:
            return spare.buffers
        return empty_buffers(layout)  # first stream, or the layout changed

    def _release(self, stream: ChunkStream) -> None:
        """``stream`` stops writing; its buffer becomes the spare (``in_place``: the model is
        let go, torn if the stream had written into it)."""
        assembly, stream.assembly = stream.assembly, None
        if assembly is None:
            return
        if not stream.in_place:
            with self._lock:
                self._keep_spare(Staged(assembly.layout, assembly.buffers))
            return
        stream.backlog.clear()
        if stream.last is not None:  # superseded after its last chunk came: acked with
            with self._lock:         # the version applied next (or its failure)
                self._waiting.append(stream.last)
            stream.last = None
        if stream.written:
            self.torn = (f"the stream of version {stream.version} of {self.model_id!r} "
                         f"ended after {stream.next_index} of its {stream.count} chunks were "
                         "written into the model (in_place=True): it is half-written until "
                         "a complete version comes")
        if not self._handing_over:
            self._let_go(stream)

    def _drain(self, stream: ChunkStream) -> None:
        """Write ``stream``'s backlog into the held model; complete it if its last chunk came."""
        while stream.backlog and stream.error is None and stream.assembly is not None:
            chunk, body = stream.backlog.pop(0)
            try:
                self._take(stream, chunk, body)
            except Exception as exc:
                self._fail(stream, exc)
        if stream.last is not None and stream.assembly is not None:
            self._complete_in_place(stream)

    def _complete_in_place(self, stream: ChunkStream) -> None:
        assert stream.last is not None and stream.assembly is not None
        if not stream.assembly.complete:  # (ChunkAssembly checks the last chunk covers all)
            self._fail(stream, ProtocolError(
                f"version {stream.version} of {self.model_id!r} ended incomplete"))
            return
        stream.assembly = None
        self.torn = None  # every byte of the model is of this version now
        last, stream.last = stream.last, None
        self._offer(stream.version, InPlace(stream.version), *last)
        self._let_go(stream)

    def _let_go(self, stream: ChunkStream) -> None:
        """The model is no longer held by ``stream``: a waiting rollout goes on (or fails)."""
        if self._hold is stream:
            self._hold = None
            self._parked = False
        if self.on_ready is not None:
            self.on_ready()

    def _keep_spare(self, staged: Staged) -> None:
        if self._spare is None:
            self._spare = staged  # (one spare at most: a second one is freed)

    def _discard(self, payload: Any) -> None:
        if isinstance(payload, Staged):
            self._keep_spare(payload)

    # -- any thread, at a step boundary ---------------------------------------------------
    def _apply(self, update: PendingUpdate) -> int:
        staged = update.payload
        if isinstance(staged, InPlace):
            return update.version  # written into the model while the rollout waited
        if not isinstance(staged, Staged):
            return super()._apply(update)
        targets = flat_tensors(self.model, live=True)
        if not self.codec.identity:  # what came is not the model's tensors: decode, copy
            self.strategy.apply_weights(self.model, self._decoded(staged.buffers))
            with self._lock:
                self._keep_spare(staged)
            return update.version
        check_layout(staged.layout, targets, f"streamed weights of {self.model_id!r}")
        share = self.zero_copy and isinstance(self.model, nn.Module)
        freed: dict[str, torch.Tensor] = {}
        for key, buffer in staged.buffers.items():
            target = targets[key]
            if share and _swappable(target, buffer):
                freed[key], target.data = target.data, buffer
            else:
                copy_into(target, buffer)
                freed[key] = buffer
        with self._lock:
            self._keep_spare(Staged(staged.layout, _reusable(freed, staged.buffers)))
        return update.version

    def close(self) -> None:
        super().close()
        self._streams.clear()
        self._hold = None
        self._parked = False
        with self._lock:
            self._spare = None


def _swappable(target: torch.Tensor, buffer: torch.Tensor) -> bool:
    # Parameters only (a worker never writes them); buffers such as running
    # statistics may be updated in place and are copied.
    return (isinstance(target, nn.Parameter) and target.dtype == buffer.dtype
            and target.device.type == "cpu" and tuple(target.shape) == tuple(buffer.shape))


def _reusable(freed: Mapping[str, torch.Tensor], like: Mapping[str, torch.Tensor]
              ) -> dict[str, torch.Tensor]:
    """The next receive buffer: the storage the parameters left, where it has the right form."""
    out = {}
    for key, tensor in freed.items():
        want = like[key]
        out[key] = tensor if (tensor.is_contiguous() and tensor.dtype == want.dtype
                              and tuple(tensor.shape) == tuple(want.shape)
                              and tensor.device.type == "cpu") else torch.empty_like(want)
    return out


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
