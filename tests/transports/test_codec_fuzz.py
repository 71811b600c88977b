"""Property tests of the wire codec.

The decoder faces random bytes, random but well-formed-looking headers and
mutated valid messages: it must answer ``ProtocolError`` or a value, never any
other exception. Random tensors, TensorDicts and nested containers round-trip
bit for bit.
"""

from __future__ import annotations

import math
import os
from typing import Any

import msgpack
import numpy as np
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from tensordict import TensorDict, TensorDictBase, is_non_tensor
from torch import nn

from transports import ProtocolError, _codec, decode, encode
from transports._codec import encode_message

# ASYNCRL_FUZZ_EXAMPLES=20000 runs a deep fuzz; the default keeps the file a few seconds long.
EXAMPLES = int(os.environ.get("ASYNCRL_FUZZ_EXAMPLES", "250"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
ROUNDTRIP = settings(
    max_examples=max(1, EXAMPLES * 4 // 5),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

TORCH_DTYPES = sorted(_codec.TORCH_DTYPES.values(), key=str)
DTYPE_NAMES = sorted(_codec.TORCH_DTYPES)
EXT_CODES = [_codec._EXT_TENSOR, _codec._EXT_TENSOR, _codec._EXT_TENSORDICT, _codec._EXT_TENSORDICT,
             _codec._EXT_NDARRAY, 0, 4, 127]  # mostly known codes, to get past the first check


# ---------------------------------------------------------------- checking helpers


def touch(value: Any) -> None:
    """Use a decoded value the way an application would, to surface lazy breakage."""
    if isinstance(value, torch.Tensor):
        value.clone()  # reads every byte the tensor claims to own
    elif isinstance(value, np.ndarray):
        value.copy()
    elif isinstance(value, TensorDictBase):
        _ = value.batch_size, repr(value)
        for key in value.keys(include_nested=True, leaves_only=True):
            touch(value.get(key))
        value.clone()
    elif isinstance(value, dict):
        for item in value.values():
            touch(item)
    elif isinstance(value, list):
        for item in value:
            touch(item)


def decode_or_protocol_error(frames: list[Any]) -> None:
    """Decoding either works (and the value is usable) or raises ProtocolError."""
    try:
        value = decode(frames)
    except ProtocolError as exc:
        event("ProtocolError: " + " ".join(str(exc).split()[:3]))  # --hypothesis-show-statistics
        return
    event("decoded")
    touch(value)


def to_bytes(frames: list[Any]) -> list[bytes]:
    return [bytes(memoryview(f).cast("B")) for f in frames]


def raw_bytes(tensor: torch.Tensor) -> bytes:
    flat = torch.empty(tensor.numel(), dtype=tensor.dtype)  # stride 1, whatever the source
    flat.copy_(tensor.reshape(-1))
    return flat.view(torch.uint8).numpy().tobytes()


def assert_same(got: Any, want: Any) -> None:
    """Structural equality: tensors bit for bit, NaN equal to NaN, tuples as lists."""
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor)
        assert (got.dtype, got.shape) == (want.dtype, want.shape)
        assert raw_bytes(got) == raw_bytes(want)
    elif isinstance(want, TensorDictBase):
        assert isinstance(got, TensorDict)
        assert got.batch_size == want.batch_size
        assert list(got.keys()) == list(want.keys())
        for key in want.keys():
            expected, actual = want._get_str(key, None), got._get_str(key, None)
            if is_non_tensor(expected):
                assert is_non_tensor(actual)
                assert_same(actual.data, expected.data)
            else:
                assert_same(actual, expected)
    elif isinstance(want, dict):
        assert isinstance(got, dict) and list(got) == list(want)
        for key in want:
            assert_same(got[key], want[key])
    elif isinstance(want, list | tuple):
        assert isinstance(got, list) and len(got) == len(want)
        for a, b in zip(got, want, strict=True):
            assert_same(a, b)
    elif isinstance(want, float) and math.isnan(want):
        assert isinstance(got, float) and math.isnan(got)
    else:
        assert type(got) is type(want)
        assert got == want


# ---------------------------------------------------------------- strategies


def tensor_from_bytes(dtype: torch.dtype, shape: list[int], data: bytes) -> torch.Tensor:
    """Any bit pattern (NaNs, denormals, extremes); bools kept to 0/1."""
    raw = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(
        0, dtype=torch.uint8
    )
    if dtype is torch.bool:
        raw = raw & 1
    return raw.view(dtype).reshape(shape).clone()


@st.composite
def tensors(draw: st.DrawFn, batch: tuple[int, ...] = ()) -> torch.Tensor:
    dtype = draw(st.sampled_from(TORCH_DTYPES))
    extra = draw(st.lists(st.integers(0, 4), max_size=3))
    shape = [*batch, *extra]
    nbytes = math.prod(shape) * dtype.itemsize
    tensor = tensor_from_bytes(dtype, shape, draw(st.binary(min_size=nbytes, max_size=nbytes)))
    view = draw(st.sampled_from(["plain", "transpose", "step"]))
    if view == "transpose" and tensor.dim() >= 2:
        tensor = tensor.transpose(0, 1).contiguous().transpose(0, 1)  # same values, strided
    elif view == "step" and tensor.dim() >= 1 and not batch:
        tensor = tensor.repeat_interleave(2, dim=0)[::2]
    return tensor


msgpack_ints = st.integers(-(2**63), 2**64 - 1)
leaves = st.one_of(
    st.none(),
    st.booleans(),
    msgpack_ints,
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.binary(max_size=8),
)
keys = st.text(max_size=6)
plain_values = st.recursive(
    st.one_of(leaves, tensors()),
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(keys, children, max_size=4)
    ),
    max_leaves=12,
)
non_tensor_leaves = st.one_of(
    st.none(), st.booleans(), msgpack_ints, st.floats(allow_nan=False), st.text(max_size=8),
)


@st.composite
def tensordicts(
    draw: st.DrawFn, batch: tuple[int, ...] | None = None, depth: int = 0
) -> TensorDict:
    if batch is None:
        batch = tuple(draw(st.lists(st.integers(0, 3), max_size=3)))
    td = TensorDict({}, batch_size=list(batch))
    for key in draw(st.lists(st.text(min_size=1, max_size=5), max_size=4, unique=True)):
        kind = draw(st.sampled_from(["tensor", "tensor", "leaf", "td"] if depth < 3 else ["leaf"]))
        if kind == "tensor":
            td[key] = draw(tensors(batch=batch))
        elif kind == "leaf":
            td.set_non_tensor(key, draw(non_tensor_leaves))
        else:
            inner = batch + tuple(draw(st.lists(st.integers(0, 2), max_size=1)))
            td[key] = draw(tensordicts(batch=inner, depth=depth + 1))
    return td


# Hostile headers: well-formed enough to pass the version check and reach the body decoder.
dtype_names = st.one_of(st.sampled_from(DTYPE_NAMES), st.text(max_size=8), st.integers(-2, 20))
shapes_any = st.one_of(
    st.lists(st.integers(-2, 8), max_size=4), msgpack_ints, st.text(max_size=3), st.none()
)
tensor_refs = st.builds(
    lambda i, d, s: msgpack.packb([i, d, s]), st.integers(-1, 5), dtype_names, shapes_any
)


def _td_payloads(children: st.SearchStrategy[Any]) -> st.SearchStrategy[bytes]:
    entries = st.dictionaries(
        st.one_of(keys, st.binary(max_size=3)),
        st.one_of(children, st.builds(lambda v: [v], non_tensor_leaves)),
        max_size=3,
    )
    return st.builds(
        lambda b, dev, e: msgpack.packb([b, dev, e], use_bin_type=True),
        st.one_of(st.lists(st.integers(-1, 4), max_size=3), msgpack_ints, st.none()),
        st.sampled_from([None, "cpu", "cuda", 0]),
        entries,
    )


hostile_bodies = st.recursive(
    st.one_of(leaves, st.builds(msgpack.ExtType, st.sampled_from(EXT_CODES), tensor_refs)),
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(keys, children, max_size=4),
        st.builds(msgpack.ExtType, st.sampled_from(EXT_CODES), _td_payloads(children)),
        st.builds(msgpack.ExtType, st.sampled_from(EXT_CODES), st.binary(max_size=24)),
    ),
    max_leaves=10,
)


# ---------------------------------------------------------------- (1) random input


@FUZZ
@given(header=st.binary(max_size=300), extra=st.lists(st.binary(max_size=64), max_size=4))
def test_random_bytes_never_crash_the_decoder(header: bytes, extra: list[bytes]) -> None:
    decode_or_protocol_error([header, *extra])


@FUZZ
@given(
    body=hostile_bodies,
    meta=st.dictionaries(keys, leaves, max_size=3),
    seq=st.one_of(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1), st.text(max_size=2)),
    extra=st.lists(st.binary(max_size=40), max_size=5),
)
def test_random_structured_headers_never_crash_the_decoder(
    body: Any, meta: dict[str, Any], seq: Any, extra: list[bytes]
) -> None:
    header = msgpack.packb({"v": 1, "k": "data", "s": seq, "m": meta, "b": body})
    decode_or_protocol_error([header, *extra])


# ---------------------------------------------------------------- (2) mutated valid messages


def _templates() -> list[list[bytes]]:
    torch.manual_seed(0)
    batch = TensorDict(
        {
            "observation": torch.randn(3, 2),
            "action": torch.randint(0, 4, (3,)),
            "next": {"reward": torch.randn(3, 1), "done": torch.zeros(3, 1, dtype=torch.bool)},
            "collector": {"traj_ids": torch.arange(3)},
        },
        batch_size=[3],
    )
    batch.set_non_tensor("env", "cartpole")
    return [
        to_bytes(encode(torch.arange(12, dtype=torch.float32).reshape(3, 4))),
        to_bytes(encode(batch)),
        to_bytes(encode(nn.Linear(3, 2).state_dict())),
        to_bytes(encode({"a": [np.arange(4, dtype=np.int16), True],
                         "b": torch.ones((), dtype=torch.bool)})),
        to_bytes(encode_message({"w": torch.zeros(2, dtype=torch.complex64)}, kind="weights",
                                seq=7, meta={"model": "policy", "version": 3})),
        to_bytes(encode([torch.empty(0, 3), torch.tensor(1.5, dtype=torch.bfloat16)])),
    ]


TEMPLATES = _templates()
MUTATIONS = ["flip", "insert", "delete", "truncate", "extend", "drop", "duplicate", "swap"]


def mutate(frames: list[bytearray], data: st.DataObject) -> None:
    """Apply one random mutation in place."""
    kind = data.draw(st.sampled_from(MUTATIONS))
    index = data.draw(st.integers(0, len(frames) - 1))
    frame = frames[index]
    if kind == "flip" and frame:
        pos = data.draw(st.integers(0, len(frame) - 1))
        frame[pos] ^= data.draw(st.integers(1, 255))
    elif kind == "insert":
        pos = data.draw(st.integers(0, len(frame)))
        frame[pos:pos] = data.draw(st.binary(min_size=1, max_size=8))
    elif kind == "delete" and frame:
        pos = data.draw(st.integers(0, len(frame) - 1))
        del frame[pos : pos + data.draw(st.integers(1, 8))]
    elif kind == "truncate":
        del frame[data.draw(st.integers(0, len(frame))) :]
    elif kind == "extend":
        frame.extend(data.draw(st.binary(min_size=1, max_size=16)))
    elif kind == "drop" and len(frames) > 1:
        del frames[index]
    elif kind == "duplicate":
        frames.insert(index, bytearray(frame))
    elif kind == "swap":
        other = data.draw(st.integers(0, len(frames) - 1))
        frames[index], frames[other] = frames[other], frames[index]


@FUZZ
@given(template=st.integers(0, len(TEMPLATES) - 1), count=st.integers(1, 3), data=st.data())
def test_mutated_valid_messages_never_crash_the_decoder(
    template: int, count: int, data: st.DataObject
) -> None:
    frames = [bytearray(f) for f in TEMPLATES[template]]
    for _ in range(count):
        mutate(frames, data)
    writable = data.draw(st.booleans())
    decode_or_protocol_error(frames if writable else [bytes(f) for f in frames])


@FUZZ
@given(template=st.integers(0, len(TEMPLATES) - 1), data=st.data())
def test_header_byte_flips_never_crash_the_decoder(template: int, data: st.DataObject) -> None:
    frames = [bytearray(f) for f in TEMPLATES[template]]
    header = frames[0]
    for pos in data.draw(st.lists(st.integers(0, len(header) - 1), min_size=1, max_size=4)):
        header[pos] = data.draw(st.integers(0, 255))
    decode_or_protocol_error([bytes(f) for f in frames])


def test_unmutated_templates_decode() -> None:
    for frames in TEMPLATES:
        touch(decode(frames))


# ---------------------------------------------------------------- (3) round trips


@ROUNDTRIP
@given(tensor=tensors())
def test_random_tensors_roundtrip(tensor: torch.Tensor) -> None:
    assert_same(decode(to_bytes(encode(tensor))), tensor)
    assert_same(decode(encode(tensor)), tensor)


@ROUNDTRIP
@given(value=plain_values)
def test_random_nested_values_roundtrip(value: Any) -> None:
    assert_same(decode(to_bytes(encode(value))), value)


@ROUNDTRIP
@given(td=tensordicts())
def test_random_tensordicts_roundtrip(td: TensorDict) -> None:
    assert_same(decode(to_bytes(encode(td))), td)
    assert_same(decode(to_bytes(encode({"batch": td, "n": 1})))["batch"], td)
