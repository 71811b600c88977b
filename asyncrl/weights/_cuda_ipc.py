"""Same host, GPU workers: weights in CUDA memory shared by IPC handle; only a name travels.

The trainer keeps a small pool of CUDA buffers on its device, each one
allocation holding a whole copy of the weights. A send copies the weights
into a *free* buffer (device to device: about a millisecond for 50M float32
parameters on an H100; one host-to-device copy for a CPU learner) and
publishes the buffer's IPC handle and layout. A GPU worker on the same host
opens the handle once per buffer and, at a step boundary, points its
parameters at the buffer (``param.data = view``: nothing is copied), then
acks. Which buffers are free follows the acks exactly as for shared memory
(:class:`~asyncrl.weights.SharedMemWeightSyncScheme`): a buffer is rewritten
only once no worker can be stepping with the version it holds, so a frame's
version names the weights that acted.

The handle and layout come from the network, so they are validated (types,
sizes, offsets inside the allocation, dtypes from a fixed list) before CUDA
sees them; opening a handle that is not a live allocation of this host fails
with CUDA's error, which the receiver reports as a :class:`WeightSyncError`.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from transports import Message, ProtocolError, copy_into

from ._errors import WeightSyncError
from ._receiver import PendingUpdate, WeightReceiver
from ._shared_memory import (
    BlockCache,
    SharedBuffer,
    SharedMemWeightSender,
    SharedMemWeightSyncScheme,
)
from ._strategy import check_compatible, flat_tensors

__all__ = [
    "CudaIpcBlock",
    "CudaIpcWeightReceiver",
    "CudaIpcWeightSender",
    "CudaIpcWeightSyncScheme",
]

#: Each tensor starts on this boundary inside the allocation (CUDA's own alignment).
ALIGN = 256
#: Blocks a worker keeps open for reuse (the trainer's pool rotates through a few).
MAX_OPENED = 6
#: dtypes a layout may name (a hostile layout names nothing else).
DTYPES: dict[str, torch.dtype] = {
    str(dtype).removeprefix("torch."): dtype
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64,
                  torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool)
}
MAX_TENSORS = 100_000
MAX_DIMS = 16
MAX_HANDLE_BYTES = 1024
_names = itertools.count()


class CudaIpcBlock:
    """One copy of a model's weights in one CUDA allocation that other processes can open.

    ``describe(seq)`` gives the msgpack-safe body a worker needs to open it
    (:meth:`open`); ``views`` are tensors viewing the allocation, one per key.

    >>> block = CudaIpcBlock.create({"w": torch.ones(2)}, device="cuda")  # doctest: +SKIP
    >>> body = block.describe(seq=block.write({"w": torch.zeros(2)}, 1)[1])  # doctest: +SKIP
    >>> CudaIpcBlock.open(body).views["w"]           # in another process  # doctest: +SKIP
    tensor([0., 0.], device='cuda:0')
    """

    def __init__(self, name: str, storage: torch.Tensor,
                 layout: dict[str, tuple[torch.dtype, tuple[int, ...], int]],
                 handle: list[Any] | None) -> None:
        self.name = name
        self.storage = storage  # uint8, the whole allocation
        #: key -> (dtype, shape, byte offset)
        self.layout = layout
        self.views = {key: _view(storage, dtype, shape, offset)
                      for key, (dtype, shape, offset) in layout.items()}
        self.nbytes = storage.numel()
        self.handle = handle
        self.seq = 0
        self.closed = False

    # -- trainer side ---------------------------------------------------------------------
    @classmethod
    def create(cls, flat: Mapping[str, torch.Tensor], *,
               device: torch.device | str | None = None) -> CudaIpcBlock:
        """Allocate a block with ``flat``'s keys, dtypes and shapes on ``device``.

        ``device`` defaults to the CUDA device the tensors are on.
        """
        target = torch.device(device) if device is not None else _cuda_device_of(flat)
        if target.type != "cuda":
            raise ValueError(f"CUDA IPC shares CUDA memory: device={target} is not a CUDA device")
        layout: dict[str, tuple[torch.dtype, tuple[int, ...], int]] = {}
        offset = 0
        for key, tensor in flat.items():
            layout[key] = (tensor.dtype, tuple(tensor.shape), offset)
            offset += _aligned(tensor.numel() * tensor.element_size())
        storage = torch.empty(max(offset, ALIGN), dtype=torch.uint8, device=target)
        handle = list(storage.untyped_storage()._share_cuda_())  # type: ignore[no-untyped-call]
        name = f"cudaipc-{os.getpid()}-{next(_names)}"
        return cls(name, storage, layout, handle)

    def matches(self, flat: Mapping[str, torch.Tensor]) -> bool:
        """True if ``flat`` has this block's keys, dtypes and shapes, in order."""
        if len(flat) != len(self.layout):
            return False
        return all(key in self.layout and self.layout[key][:2] == (t.dtype, tuple(t.shape))
                   for key, t in flat.items())

    def write(self, flat: Mapping[str, torch.Tensor], version: int,
              slot: int = 0) -> tuple[int, int]:
        """Copy ``flat`` into the block; returns ``(slot, seq)`` once the copy is complete.

        The copies are queued on the current stream (after the work that wrote
        the weights) and waited for once: a worker in another process reads the
        memory with its own streams, so it must be complete before the name is
        published.
        """
        for key, view in self.views.items():
            source = flat[key].detach()
            if source.device.type == "cuda":
                view.copy_(source, non_blocking=True)
            else:
                view.copy_(source)  # a CPU learner: one host-to-device copy per tensor
        torch.cuda.current_stream(self.storage.device).synchronize()
        self.seq += 1
        return slot, self.seq

    def describe(self, seq: int) -> dict[str, Any]:
        """The message body that names this block's contents at ``seq``."""
        return {"block": self.name, "slot": 0, "seq": seq, "ipc": self.handle,
                "layout": [[key, str(dtype).removeprefix("torch."), list(shape), offset]
                           for key, (dtype, shape, offset) in self.layout.items()]}

    # -- worker side ----------------------------------------------------------------------
    @classmethod
    def open(cls, body: Mapping[str, Any]) -> CudaIpcBlock:
        """Open the block a validated body (see :func:`parse_body`) names, in this process."""
        handle = body["ipc"]
        try:
            # A process that has not touched CUDA yet must initialise it first: opening
            # a handle without a context crashes the process (seen on an H200).
            torch.cuda.init()  # type: ignore[no-untyped-call]
            untyped = torch.UntypedStorage._new_shared_cuda(*handle)
        except Exception as exc:  # CUDA's own error: not an allocation of this host
            raise WeightSyncError(
                f"cannot open CUDA IPC weights {body['block']!r}: {exc}. CudaIpcWeightSyncScheme "
                "needs the worker on the trainer's host with access to its GPU; use "
                "ZmqWeightSyncScheme across hosts") from exc
        storage = torch.empty(0, dtype=torch.uint8, device=untyped.device)
        storage.set_(untyped)
        layout = {key: (DTYPES[dtype], tuple(shape), offset)
                  for key, dtype, shape, offset in body["layout"]}
        for key, (dtype, shape, offset) in layout.items():
            end = offset + _numel(shape) * _itemsize(dtype)
            if end > storage.numel():
                raise ProtocolError(f"CUDA IPC layout: {key!r} ends at byte {end}, past the "
                                    f"{storage.numel()}-byte allocation")
        return cls(body["block"], storage, layout, None)

    def close(self) -> None:
        """Drop this process's views (the allocation lives while any process holds it)."""
        self.closed = True
        self.views = {}
        self.storage = torch.empty(0, dtype=torch.uint8)

    def unlink(self) -> None:
        """Nothing to unlink: CUDA frees the allocation once every process dropped it."""


def parse_body(body: Any) -> dict[str, Any]:
    """Check a CUDA IPC weights body from the network; return it, or raise ProtocolError."""
    def bad(why: str) -> ProtocolError:
        return ProtocolError(f"CUDA IPC weights must be {{'block': str, 'slot': 0, 'seq': int, "
                             f"'ipc': [8 fields], 'layout': [[key, dtype, shape, offset], ...]}}: "
                             f"{why}; got {body!r:.200}")

    if not isinstance(body, dict):
        raise bad("not a map")
    if not (isinstance(body.get("block"), str) and 0 < len(body["block"]) <= 128):
        raise bad("'block' is not a short string")
    if type(body.get("seq")) is not int or body.get("slot") != 0:
        raise bad("'seq' is not an int or 'slot' is not 0")
    ipc = body.get("ipc")
    if isinstance(ipc, tuple):
        ipc = body["ipc"] = list(ipc)
    if not (isinstance(ipc, list) and len(ipc) == 8):
        raise bad("'ipc' is not a list of 8 fields")
    kinds: tuple[type, ...] = (int, bytes, int, int, bytes, int, bytes, bool)
    for i, kind in enumerate(kinds):
        value: Any = ipc[i]
        if type(value) is not kind:
            raise bad(f"ipc[{i}] is a {type(value).__name__}, expected {kind.__name__}")
        if isinstance(value, bytes) and len(value) > MAX_HANDLE_BYTES:
            raise bad(f"ipc[{i}] is {len(value)} bytes, at most {MAX_HANDLE_BYTES}")
        if type(value) is int and not 0 <= value < 1 << 62:
            raise bad(f"ipc[{i}] = {value} is out of range")
    layout = body.get("layout")
    if not (isinstance(layout, list) and 0 < len(layout) <= MAX_TENSORS):
        raise bad("'layout' is not a non-empty list")
    for entry in layout:
        if not (isinstance(entry, list | tuple) and len(entry) == 4):
            raise bad(f"layout entry {entry!r:.80} is not [key, dtype, shape, offset]")
        key, dtype, shape, offset = entry
        if not (isinstance(key, str) and len(key) <= 1024):
            raise bad(f"layout key {key!r:.80} is not a string")
        if dtype not in DTYPES:
            raise bad(f"dtype {dtype!r:.40} of {key!r} is not one of {sorted(DTYPES)}")
        if not (isinstance(shape, list | tuple) and len(shape) <= MAX_DIMS
                and all(type(d) is int and 0 <= d < 1 << 40 for d in shape)):
            raise bad(f"shape of {key!r} is not a list of sizes")
        if not (type(offset) is int and 0 <= offset < 1 << 50 and offset % ALIGN == 0):
            raise bad(f"offset of {key!r} is not an aligned byte offset")
    return body


class CudaIpcWeightSender(SharedMemWeightSender):
    """A :class:`~asyncrl.weights.SharedMemWeightSender` whose buffers are CUDA allocations.

    ``device`` is where the buffers live (default: the CUDA device of the
    weights; required for a CPU learner).
    """

    takes_codecs = False  # it shares the model's own memory: identity only

    def __init__(self, model_id: str, hub: Any, *, device: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(model_id, hub, **kwargs)
        self.device = device

    async def _prepare(self, source: Any, version: int) -> tuple[Any, dict[str, Any]]:
        flat = flat_tensors(source)
        buffer = await self._free_buffer(flat)
        buffer.version, buffer.tickets = 0, []  # nobody reads it: see _free_buffer
        block = buffer.block
        assert isinstance(block, CudaIpcBlock)
        seq = block.write(flat, version)[1]  # device copies: fast, no thread needed
        buffer.version = version
        self._release(keep=buffer)
        return block.describe(seq), {"buffer": buffer}

    def _new_buffer(self, flat: Mapping[str, torch.Tensor]) -> SharedBuffer:
        if self.device is None and not any(t.device.type == "cuda" for t in flat.values()):
            raise ValueError(
                f"CudaIpcWeightSyncScheme for {self.model_id!r}: the weights are on the CPU and "
                "no device was given: pass CudaIpcWeightSyncScheme(device='cuda:0'), or use "
                "SharedMemWeightSyncScheme for CPU workers")
        buffer = SharedBuffer(CudaIpcBlock.create(flat, device=self.device))  # type: ignore[arg-type]
        self._buffers.append(buffer)
        return buffer


class CudaIpcWeightReceiver(WeightReceiver):
    """Points a GPU worker's parameters at the trainer's CUDA buffers (no copy).

    Parameters on the buffer's device with its dtype view it; everything else
    (buffers such as running statistics, parameters on another device or of
    another dtype, a model that is not an ``nn.Module``) is copied from it.
    """

    def __init__(self, *args: Any, zero_copy: bool = True, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.zero_copy = zero_copy
        self._blocks = BlockCache[CudaIpcBlock](MAX_OPENED)

    @property
    def block(self) -> CudaIpcBlock | None:
        """The block last applied from."""
        return self._blocks.latest()

    def _load(self, message: Message) -> Any:
        return parse_body(message.body)

    def _apply(self, update: PendingUpdate) -> int:
        body = update.payload
        block = self._blocks.get(body["block"], lambda: CudaIpcBlock.open(body))
        targets = flat_tensors(self.model, live=True)
        check_compatible(targets, block.views, what=f"CUDA IPC weights of {self.model_id!r}")
        share = self.zero_copy and isinstance(self.model, nn.Module)
        with torch.no_grad():
            for key, view in block.views.items():
                target = targets[key]
                if share and _shareable(target, view):
                    target.data = view
                else:
                    copy_into(target, view)
        self._blocks.use(block.name)
        return update.version

    def close(self) -> None:
        super().close()
        self._blocks.close()


def _shareable(target: torch.Tensor, view: torch.Tensor) -> bool:
    # Parameters only: buffers (running statistics) may be updated in place by a worker.
    return (isinstance(target, nn.Parameter) and target.dtype == view.dtype
            and target.device == view.device)


def _cuda_device_of(flat: Mapping[str, torch.Tensor]) -> torch.device:
    devices = {t.device for t in flat.values() if t.device.type == "cuda"}
    if len(devices) != 1:
        raise ValueError(f"CUDA IPC puts the weights in one allocation: they are on "
                         f"{sorted(map(str, devices)) or 'no CUDA device'}; pass device=")
    return devices.pop()


def _aligned(nbytes: int) -> int:
    return (nbytes + ALIGN - 1) // ALIGN * ALIGN


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty(0, dtype=dtype).element_size()


def _view(storage: torch.Tensor, dtype: torch.dtype, shape: tuple[int, ...],
          offset: int) -> torch.Tensor:
    nbytes = _numel(shape) * _itemsize(dtype)
    return storage[offset:offset + nbytes].view(dtype).view(shape)


class CudaIpcWeightSyncScheme(SharedMemWeightSyncScheme):
    """Same host, GPU workers, safe and zero-copy: weights stay in CUDA memory.

    A send copies the weights into a free CUDA buffer on ``device`` (device to
    device for a GPU learner; host to device for a CPU one) and only the
    buffer's IPC handle, layout and version travel; each GPU worker on this
    host points its parameters at the buffer at a step boundary (no copy) and
    acks. Buffers rotate exactly as :class:`SharedMemWeightSyncScheme`'s
    (``slots``, ``slot_timeout``), so frames keep exact versions. Workers on
    the CPU or another GPU get the weights copied from the buffer. Across
    hosts use :class:`ZmqWeightSyncScheme` (a CUDA learner is staged through
    pinned memory there).

    >>> CudaIpcWeightSyncScheme(device="cuda:0")
    CudaIpcWeightSyncScheme(device='cuda:0')
    """

    name = "cuda_ipc"
    _sender_class = CudaIpcWeightSender
    _receiver_class = CudaIpcWeightReceiver  # type: ignore[assignment]

    def __init__(self, strategy: Any = "tensordict", *, max_interval: int = 0,
                 slots: int | None = None, slot_timeout: float = 1.0, zero_copy: bool = True,
                 device: str | None = None) -> None:
        super().__init__(strategy, max_interval=max_interval, slots=slots,
                         slot_timeout=slot_timeout, zero_copy=zero_copy)
        if device is not None:
            device = str(torch.device(device))
            if not device.startswith("cuda"):
                raise ValueError(f"CudaIpcWeightSyncScheme(device={device!r}): the buffers are "
                                 "CUDA memory, pass a CUDA device such as 'cuda:0' (or use "
                                 "SharedMemWeightSyncScheme for CPU buffers)")
        self.device = device

    def _options(self) -> dict[str, Any]:
        options = super()._options()
        if self.device is not None:
            options["device"] = self.device
        return options

    def _sender_options(self) -> dict[str, Any]:
        return {**super()._sender_options(), "device": self.device}
