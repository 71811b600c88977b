"""Wire codec: Python objects with tensors <-> a msgpack header plus raw frames.

A message is ``[header, frame_1, ..., frame_n]``. The header is a msgpack map::

    {"v": 1, "k": kind, "s": seq, "m": meta, "b": body}

``body`` is plain msgpack in which each tensor is an extension object
``[frame_index, dtype, shape]`` and each TensorDict an extension object
``[batch_size, device, {key: value}]``. Tensor bytes travel in their own frame:
encoding hands ZeroMQ the tensor's memory, decoding builds tensors over the
received frames. Nothing is pickled; the decoder checks everything it reads
and raises :class:`ProtocolError` on any violation.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgpack
import numpy as np

from ._errors import ProtocolError
from ._torch_free import TORCH_FREE

if TYPE_CHECKING or not TORCH_FREE:  # a torch-free process: numpy arrays only
    import torch
    from tensordict import NonTensorData, NonTensorStack, TensorDict, TensorDictBase

__all__ = [
    "DEFAULT_MAX_BYTES",
    "PROTOCOL_VERSION",
    "ArrayDict",
    "Decoded",
    "decode",
    "decode_message",
    "encode",
    "encode_message",
]

PROTOCOL_VERSION = 1
#: Largest message (header plus frames) accepted unless the caller says otherwise.
DEFAULT_MAX_BYTES = 4 << 30
MAX_HEADER_BYTES = 64 << 20
MAX_FRAMES = 1 << 16
MAX_DEPTH = 32
MAX_DIMS = 32

_EXT_TENSOR = 1
_EXT_TENSORDICT = 2
_EXT_NDARRAY = 3

#: The torch dtypes a tensor may be held in, by name: on the wire and in a shared-memory
#: block's layout (:mod:`._shm_format`), the same names.
TORCH_DTYPES: dict[str, torch.dtype] = {} if TORCH_FREE else {
    name: getattr(torch, name)
    for name in (
        "bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64",
        "float16", "bfloat16", "float32", "float64", "complex64", "complex128",
    )
    if hasattr(torch, name)
}
TORCH_NAMES = {dtype: name for name, dtype in TORCH_DTYPES.items()}
_NUMPY_DTYPES: dict[str, np.dtype] = {
    name: np.dtype(name)
    for name in (
        "bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64",
        "float16", "float32", "float64", "complex64", "complex128",
    )
}
_NON_TENSOR_LEAVES = (str, int, float, bool, type(None))


@dataclass(slots=True)
class Decoded:
    """A decoded message: its kind, sequence number, metadata and body."""

    kind: str
    seq: int
    body: Any
    meta: dict[str, Any] = field(default_factory=dict)
    needs_ack: bool = False


# --------------------------------------------------------------------- encode


def encode(obj: Any) -> list[Any]:
    """Encode ``obj`` into ``[header, *frames]`` for a ZeroMQ multipart send.

    ``obj`` may be a tensor, a (nested) TensorDict, a numpy array, a state dict
    or any msgpack value containing those. Contiguous CPU tensors are not
    copied: their frames are views of the tensors' memory.

    >>> frames = encode({"w": torch.ones(3)})
    >>> decode(frames)["w"]
    tensor([1., 1., 1.])
    """
    return encode_message(obj)


def encode_message(
    body: Any,
    *,
    kind: str = "data",
    seq: int = 0,
    meta: Mapping[str, Any] | None = None,
    ack: bool = False,
) -> list[Any]:
    """Encode ``body`` with a message kind, a sequence number and metadata.

    ``ack=True`` asks the receiver to acknowledge ``seq`` (see ``Link.ack``).
    """
    frames: list[Any] = [b""]
    meta = dict(meta or {})
    if meta:
        _check_plain_meta(meta)
    header = {"v": PROTOCOL_VERSION, "k": kind, "s": seq, "m": meta, "b": body}
    if ack:
        header["a"] = True
    frames[0] = _pack(header, frames)
    return frames


def _check_plain_meta(meta: dict[str, Any]) -> None:
    # The decoder returns meta as-is (no tensors resolved): refuse what it could not rebuild.
    def default(value: Any) -> Any:
        if isinstance(value, np.generic):
            return value.item()
        raise TypeError(
            f"cannot encode {type(value).__qualname__} in message meta: meta holds plain "
            "msgpack values only; put tensors in the body"
        )

    try:
        msgpack.packb(meta, default=default, use_bin_type=True)
    except (ValueError, OverflowError) as exc:
        raise TypeError(f"cannot encode message meta: {exc}") from exc


def _pack(obj: Any, frames: list[Any], *, as_tensors: bool = TORCH_FREE) -> bytes:
    # as_tensors: numpy arrays travel as tensors (a torch-free process's, an ArrayDict's)
    def default(value: Any) -> Any:
        if not TORCH_FREE:  # (a torch-free process holds no tensor to send)
            if isinstance(value, torch.Tensor):
                return _tensor_ext(value, frames)
            if isinstance(value, TensorDictBase):
                return msgpack.ExtType(_EXT_TENSORDICT, _pack(_tensordict_body(value), frames))
        if isinstance(value, ArrayDict):
            return msgpack.ExtType(_EXT_TENSORDICT,
                                   _pack(value.body(), frames, as_tensors=True))
        if isinstance(value, np.ndarray):
            return _ndarray_ext(value, frames, _EXT_TENSOR if as_tensors else _EXT_NDARRAY)
        if isinstance(value, np.generic):
            return value.item()
        if isinstance(value, tuple):
            return list(value)
        raise TypeError(
            f"cannot encode {type(value).__qualname__}: expected tensors, TensorDicts, "
            "numpy arrays or msgpack values (dict, list, str, bytes, int, float, bool, None)"
        )

    try:
        packed: bytes = msgpack.packb(obj, default=default, use_bin_type=True,
                                      strict_types=False)
        return packed
    except (ValueError, OverflowError) as exc:
        raise TypeError(f"cannot encode message: {exc}") from exc


def _tensor_ext(tensor: torch.Tensor, frames: list[Any]) -> msgpack.ExtType:
    if tensor.layout != torch.strided:
        raise TypeError(f"cannot encode a {tensor.layout} tensor: only dense tensors travel")
    name = TORCH_NAMES.get(tensor.dtype)
    if name is None:
        raise TypeError(f"cannot encode a tensor of dtype {tensor.dtype}")
    if tensor.device.type == "meta":
        raise TypeError("cannot encode a tensor on the meta device: it holds no data")
    tensor = tensor.detach()
    if tensor.device.type != "cpu":
        tensor = tensor.cpu()
    tensor = tensor.resolve_conj().resolve_neg()
    if not tensor.is_contiguous():
        tensor = tensor.contiguous()
    shape = list(tensor.shape)
    # A flat byte view shares the tensor's memory; numpy keeps the tensor alive. Not
    # reshape(-1): a contiguous tensor may keep any stride on a size-0/1 dimension
    # (t[1:2, 0] has stride 3), which view(uint8) rejects.
    flat = tensor.as_strided((tensor.numel(),), (1,))
    frames.append(flat.view(torch.uint8).numpy())
    return msgpack.ExtType(_EXT_TENSOR, msgpack.packb([len(frames) - 1, name, shape]))


def _ndarray_ext(array: np.ndarray, frames: list[Any], code: int = _EXT_NDARRAY
                 ) -> msgpack.ExtType:
    # (as _EXT_TENSOR: torch's dtype names are numpy's for every dtype numpy has)
    name = array.dtype.name
    if name not in _NUMPY_DTYPES or array.dtype.byteorder == ">":
        raise TypeError(f"cannot encode a numpy array of dtype {array.dtype}")
    shape = list(array.shape)  # np.ascontiguousarray turns a 0-d array into shape (1,)
    array = np.ascontiguousarray(array)
    frames.append(array.reshape(-1).view(np.uint8))
    return msgpack.ExtType(code, msgpack.packb([len(frames) - 1, name, shape]))


class ArrayDict:
    """A TensorDict's wire form made of numpy arrays: what a torch-free process sends.

    ``entries`` maps str keys to arrays whose shapes start with ``batch_size``, or to
    mappings of the same (nested entries, as ``("next", "observation")``). It is encoded
    exactly as a TensorDict of the same tensors: the receiver, which has torch, decodes
    a TensorDict; a torch-free receiver refuses it (:func:`decode`).

    >>> frames = encode(ArrayDict([2], {"x": np.zeros((2, 3), np.float32),
    ...                                 "next": {"r": np.ones(2, np.int64)}}))
    >>> td = decode(frames)
    >>> td.batch_size, td["next", "r"].tolist()
    (torch.Size([2]), [1, 1])
    """

    __slots__ = ("batch_size", "entries")

    def __init__(self, batch_size: Sequence[int], entries: Mapping[str, Any]) -> None:
        self.batch_size = [int(d) for d in batch_size]
        self.entries = entries

    def body(self) -> list[Any]:
        entries = {key: ArrayDict(self.batch_size, value) if isinstance(value, Mapping)
                   else value for key, value in self.entries.items()}
        return [self.batch_size, None, entries]


def _tensordict_body(td: TensorDictBase) -> list[Any]:
    entries: dict[str, Any] = {}
    for key, value in td.items():
        if isinstance(value, NonTensorData):
            data = value.data
            if not isinstance(data, _NON_TENSOR_LEAVES):
                raise TypeError(
                    f"cannot encode non-tensor entry {key!r} of type {type(data).__qualname__}: "
                    "only str, int, float, bool and None travel as non-tensor leaves"
                )
            entries[key] = [data]  # a one-element list marks a non-tensor leaf
        elif isinstance(value, NonTensorStack):
            # A NonTensorStack is a TensorDictBase with no items: it would travel as an
            # empty TensorDict and silently lose its data.
            raise TypeError(
                f"cannot encode non-tensor entry {key!r}: a NonTensorStack (non-tensor values "
                "that differ along the batch) does not travel; store one value or a tensor"
            )
        elif isinstance(value, torch.Tensor | TensorDictBase):
            entries[key] = value
        else:
            raise TypeError(f"cannot encode TensorDict entry {key!r} of type {type(value)}")
    device = None if td.device is None else str(td.device)
    if device is not None and device != "cpu":
        device = "cpu"  # tensors always arrive on the CPU
    return [list(td.batch_size), device, entries]


# --------------------------------------------------------------------- decode


def decode(frames: Sequence[Any], *, max_bytes: int | None = None) -> Any:
    """Decode what :func:`encode` produced; raises :class:`ProtocolError` if malformed.

    ``frames`` may hold ``bytes``, memoryviews or ``zmq.Frame`` objects. Tensors
    are built over the frames' memory without a copy and keep them alive.
    """
    return decode_message(frames, max_bytes=max_bytes).body


def decode_message(frames: Sequence[Any], *, max_bytes: int | None = None) -> Decoded:
    """Decode a whole message, header fields included."""
    buffers = _buffers(frames, DEFAULT_MAX_BYTES if max_bytes is None else max_bytes)
    header = _unpack_header(buffers[0])
    decoder = _BodyDecoder(buffers)
    try:
        body = decoder.resolve(header["b"], 0)
    except ProtocolError:
        raise
    except Exception as exc:  # anything else a hostile body can provoke
        raise ProtocolError(f"malformed message body: {type(exc).__name__}: {exc}") from None
    unused = len(buffers) - 1 - decoder.used
    if unused:
        raise ProtocolError(
            f"message has {len(buffers) - 1} data frames but its header references "
            f"{decoder.used}: {unused} frame(s) unaccounted for"
        )
    return Decoded(kind=header["k"], seq=header["s"], body=body, meta=header["m"],
                   needs_ack=header.get("a") is True)


def _buffers(frames: Sequence[Any], max_bytes: int) -> list[memoryview]:
    if not isinstance(frames, Sequence) or len(frames) == 0:
        raise ProtocolError("expected a non-empty list of frames, got none")
    if len(frames) > MAX_FRAMES:
        raise ProtocolError(f"message has {len(frames)} frames; at most {MAX_FRAMES} accepted")
    buffers = []
    total = 0
    for frame in frames:
        raw = getattr(frame, "buffer", frame)  # zmq.Frame exposes .buffer
        try:
            view = memoryview(raw).cast("B")
        except TypeError as exc:
            raise ProtocolError(f"frame of type {type(frame).__name__} is not bytes-like") from exc
        total += view.nbytes
        buffers.append(view)
    if total > max_bytes:
        raise ProtocolError(
            f"message of {total} bytes exceeds the limit of {max_bytes} bytes; "
            "raise max_bytes if such messages are expected"
        )
    return buffers


def _unpack_header(raw: memoryview) -> dict[str, Any]:
    if raw.nbytes > MAX_HEADER_BYTES:
        raise ProtocolError(f"header of {raw.nbytes} bytes exceeds {MAX_HEADER_BYTES} bytes")
    try:
        header = msgpack.unpackb(raw, raw=False, strict_map_key=True, use_list=True)
    except Exception as exc:
        raise ProtocolError(f"header is not valid msgpack: {type(exc).__name__}: {exc}") from None
    if not isinstance(header, dict):
        raise ProtocolError(f"header must be a msgpack map, got {type(header).__name__}")
    if type(header.get("v")) is not int or header["v"] != PROTOCOL_VERSION:
        raise ProtocolError(
            f"protocol version {header.get('v')!r} received, {PROTOCOL_VERSION} expected: "
            "run the same asyncrl version on both ends"
        )
    missing = {"k", "s", "m", "b"} - header.keys()
    if missing:
        raise ProtocolError(f"header lacks field(s) {sorted(missing)}")
    if not isinstance(header["k"], str) or type(header["s"]) is not int:
        raise ProtocolError("header kind must be a string and seq an integer")
    if not isinstance(header["m"], dict):
        raise ProtocolError(f"header meta must be a map, got {type(header['m']).__name__}")
    _check_depth(header["m"])
    return header


def _check_depth(value: Any) -> None:
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ProtocolError(f"message nests deeper than {MAX_DEPTH} levels")
        if isinstance(item, msgpack.ExtType):
            raise ProtocolError("header meta must hold plain msgpack values, found an extension")
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)


class _BodyDecoder:
    """Turns the unpacked body into objects, building tensors over the frames."""

    def __init__(self, buffers: list[memoryview]) -> None:
        self.buffers = buffers
        self.seen = bytearray(len(buffers))
        self.used = 0

    def resolve(self, value: Any, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise ProtocolError(f"message nests deeper than {MAX_DEPTH} levels")
        if isinstance(value, msgpack.ExtType):
            return self.ext(value, depth)
        if isinstance(value, dict):
            return {k: self.resolve(v, depth + 1) for k, v in value.items()}
        if isinstance(value, list):
            return [self.resolve(v, depth + 1) for v in value]
        return value

    def ext(self, ext: msgpack.ExtType, depth: int) -> Any:
        if ext.code == _EXT_TENSOR:
            # A torch-free process takes a tensor as the numpy array of the same bytes.
            return self.ndarray(ext.data) if TORCH_FREE else self.tensor(ext.data)
        if ext.code == _EXT_NDARRAY:
            return self.ndarray(ext.data)
        if ext.code == _EXT_TENSORDICT:
            if TORCH_FREE:
                raise ProtocolError("a TensorDict came to a torch-free process (an env "
                                    "worker): it takes numpy arrays and msgpack values only")
            return self.tensordict(ext.data, depth)
        raise ProtocolError(f"unknown extension type {ext.code}")

    def frame_for(self, ref: bytes, names: Mapping[str, Any]) -> tuple[memoryview, Any, list[int]]:
        try:
            index, dtype_name, shape = msgpack.unpackb(ref, raw=False, use_list=True)
        except Exception:
            raise ProtocolError("tensor reference must be [frame, dtype, shape]") from None
        if type(index) is not int or not 1 <= index < len(self.buffers):
            raise ProtocolError(f"tensor references frame {index!r}; message has "
                                f"frames 1..{len(self.buffers) - 1}")
        if self.seen[index]:
            raise ProtocolError(f"frame {index} is referenced twice")
        dtype = names.get(dtype_name) if isinstance(dtype_name, str) else None
        if dtype is None:
            raise ProtocolError(f"dtype {dtype_name!r} is not accepted; expected one of "
                                f"{sorted(names)}")
        if (not isinstance(shape, list) or len(shape) > MAX_DIMS
                or not all(type(d) is int and 0 <= d < (1 << 48) for d in shape)):
            raise ProtocolError(f"invalid tensor shape {shape!r}")
        self.seen[index] = 1
        self.used += 1
        return self.buffers[index], dtype, shape

    def tensor(self, ref: bytes) -> torch.Tensor:
        buf, dtype, shape = self.frame_for(ref, TORCH_DTYPES)
        itemsize = dtype.itemsize
        _check_size(buf, shape, itemsize)
        if buf.nbytes == 0:
            return torch.empty(shape, dtype=dtype)
        if buf.readonly:
            with warnings.catch_warnings():  # a read-only frame stays read-only: documented
                warnings.simplefilter("ignore")
                flat = torch.frombuffer(buf, dtype=torch.uint8)
        else:
            flat = torch.frombuffer(buf, dtype=torch.uint8)
        if flat.data_ptr() % itemsize:
            # misaligned: a small frame lies at any offset of ZeroMQ's receive buffer (about
            # 6 of the 13 tensors of a 63-step chunk); one copy keeps element access legal
            flat = flat.clone()
        # max() scans without the full-size temporary that (flat > 1).any() allocates.
        if dtype is torch.bool and int(flat.max()) > 1:
            raise ProtocolError("bool tensor holds bytes other than 0 and 1")
        return flat.view(dtype).view(shape)

    def ndarray(self, ref: bytes) -> np.ndarray:
        buf, dtype, shape = self.frame_for(ref, _NUMPY_DTYPES)
        _check_size(buf, shape, dtype.itemsize)
        flat = np.frombuffer(buf, dtype=np.uint8)
        if flat.ctypes.data % max(dtype.itemsize, 1):
            flat = flat.copy()
        if dtype == np.bool_ and flat.size and int(flat.max()) > 1:
            raise ProtocolError("bool array holds bytes other than 0 and 1")
        array: np.ndarray = flat.view(dtype).reshape(shape)
        return array

    def tensordict(self, data: bytes, depth: int) -> TensorDict:
        try:
            body = msgpack.unpackb(data, raw=False, strict_map_key=True, use_list=True)
        except Exception:
            raise ProtocolError("TensorDict extension is not valid msgpack") from None
        if not (isinstance(body, list) and len(body) == 3 and isinstance(body[2], dict)):
            raise ProtocolError("TensorDict must be [batch_size, device, entries]")
        batch_size, device, entries = body
        if (not isinstance(batch_size, list) or len(batch_size) > MAX_DIMS
                or not all(type(d) is int and d >= 0 for d in batch_size)):
            raise ProtocolError(f"invalid TensorDict batch size {batch_size!r}")
        if device not in (None, "cpu"):
            raise ProtocolError(f"TensorDict device must be 'cpu' or none, got {device!r}")
        td = TensorDict({}, batch_size=batch_size, device=device)
        for key, raw in entries.items():
            if not isinstance(key, str):
                raise ProtocolError(f"TensorDict keys must be strings, got {key!r}")
            if isinstance(raw, list) and len(raw) == 1 and isinstance(raw[0], _NON_TENSOR_LEAVES):
                td.set_non_tensor(key, raw[0])
                continue
            value = self.resolve(raw, depth + 1)
            if not isinstance(value, torch.Tensor | TensorDictBase):
                raise ProtocolError(f"TensorDict entry {key!r} is neither tensor nor TensorDict")
            if tuple(value.shape[: len(batch_size)]) != tuple(batch_size):
                raise ProtocolError(
                    f"TensorDict entry {key!r} has shape {list(value.shape)}, "
                    f"which does not start with the batch size {batch_size}"
                )
            td._set_str(key, value, validated=True, inplace=False)
        return td


def _check_size(buf: memoryview, shape: list[int], itemsize: int) -> None:
    expected = math.prod(shape) * itemsize
    if expected != buf.nbytes:
        raise ProtocolError(
            f"tensor of shape {shape} and item size {itemsize} needs {expected} bytes, "
            f"its frame holds {buf.nbytes}"
        )
