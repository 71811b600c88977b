"""Wire codec: round trips, zero copy over real ZeroMQ sockets, and hostile input.

Round trips are checked bit for bit (dtype, shape, bytes). The decoder is fed
hand-built headers that break one rule each; every one must end in
``ProtocolError``, never in another exception.
"""

from __future__ import annotations

import gc
import math
import weakref
from collections.abc import Iterator
from typing import Any

import msgpack
import numpy as np
import pytest
import torch
import zmq
from tensordict import NonTensorStack, TensorDict, TensorDictBase, is_non_tensor
from torch import nn

import transports
from transports import PROTOCOL_VERSION, ProtocolError, _codec, decode, encode
from transports._codec import Decoded, decode_message, encode_message

TORCH_DTYPES = sorted(_codec.TORCH_DTYPES.values(), key=str)
NUMPY_DTYPES = sorted(_codec._NUMPY_DTYPES.values(), key=str)
RECV_TIMEOUT_MS = 10_000

# ---------------------------------------------------------------- helpers


def random_tensor(dtype: torch.dtype, shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    """Values that use the dtype's range (extremes included where it has room)."""
    gen = torch.Generator().manual_seed(seed)
    if dtype is torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    if dtype.is_floating_point or dtype.is_complex:
        return torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype) * 1e3
    info = torch.iinfo(dtype)
    low, high = max(info.min, -(2**62)), min(info.max, 2**62)
    values = torch.randint(low, high, shape, generator=gen, dtype=torch.int64)
    if dtype is torch.uint64:
        values = values.abs()
    return values.to(dtype)


def raw_bytes(tensor: torch.Tensor) -> bytes:
    """The tensor's logical contents as bytes (conj/neg bits resolved)."""
    flat = torch.empty(tensor.numel(), dtype=tensor.dtype)  # stride 1, whatever the source
    flat.copy_(tensor.detach().resolve_conj().resolve_neg().reshape(-1))
    return flat.view(torch.uint8).numpy().tobytes()


def assert_same_tensor(got: Any, want: torch.Tensor) -> None:
    """Same type, dtype, shape and bytes (NaNs compare equal bit for bit)."""
    assert isinstance(got, torch.Tensor)
    assert got.dtype == want.dtype
    assert got.shape == want.shape
    assert raw_bytes(got) == raw_bytes(want)


def assert_same_td(got: Any, want: TensorDictBase) -> None:
    """Same batch size, same keys in the same order, same leaves, recursively."""
    assert isinstance(got, TensorDict)
    assert got.batch_size == want.batch_size
    assert list(got.keys()) == list(want.keys())
    for key in want.keys():
        expected = want._get_str(key, None)
        actual = got._get_str(key, None)
        if is_non_tensor(expected):
            assert is_non_tensor(actual)
            assert actual.batch_size == expected.batch_size
            assert type(actual.data) is type(expected.data)
            assert actual.data == expected.data
        elif isinstance(expected, TensorDictBase):
            assert_same_td(actual, expected)
        else:
            assert_same_tensor(actual, expected)


def roundtrip(obj: Any) -> Any:
    """Encode, copy every frame to ``bytes`` (as a socket would), decode."""
    return decode([bytes(memoryview(f).cast("B")) for f in encode(obj)])


def frame_address(frame: Any) -> tuple[int, int]:
    """(start address, length) of a frame's memory."""
    buf = getattr(frame, "buffer", frame)
    array = np.frombuffer(buf, dtype=np.uint8)
    return array.ctypes.data, array.nbytes


def header(body: Any = None, **fields: Any) -> bytes:
    """A raw header; ``fields`` override (or, with value ``...``, drop) the defaults."""
    base: dict[str, Any] = {"v": PROTOCOL_VERSION, "k": "data", "s": 0, "m": {}, "b": body}
    for name, value in fields.items():
        if value is ...:
            base.pop(name)
        else:
            base[name] = value
    return msgpack.packb(base, use_bin_type=True)


def tensor_ref(index: Any, dtype: Any, shape: Any) -> msgpack.ExtType:
    return msgpack.ExtType(_codec._EXT_TENSOR, msgpack.packb([index, dtype, shape]))


def array_ref(index: Any, dtype: Any, shape: Any) -> msgpack.ExtType:
    return msgpack.ExtType(_codec._EXT_NDARRAY, msgpack.packb([index, dtype, shape]))


def td_ext(batch_size: Any, device: Any, entries: Any) -> msgpack.ExtType:
    return msgpack.ExtType(
        _codec._EXT_TENSORDICT, msgpack.packb([batch_size, device, entries], use_bin_type=True)
    )


def nested_list(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


# ---------------------------------------------------------------- sockets


@pytest.fixture(params=["pair", "push-pull"])
def socket_pair(request: pytest.FixtureRequest) -> Iterator[tuple[zmq.Socket, zmq.Socket]]:
    """A connected (sender, receiver) over inproc; closed with linger 0."""
    ctx = zmq.Context()
    kinds = (zmq.PAIR, zmq.PAIR) if request.param == "pair" else (zmq.PUSH, zmq.PULL)
    sender, receiver = ctx.socket(kinds[0]), ctx.socket(kinds[1])
    address = f"inproc://codec-{id(ctx)}"
    receiver.bind(address)
    sender.connect(address)
    try:
        yield sender, receiver
    finally:
        sender.close(linger=0)
        receiver.close(linger=0)
        ctx.term()


def send_recv(
    pair: tuple[zmq.Socket, zmq.Socket], frames: list[Any], *, copy: bool = False
) -> list[zmq.Frame]:
    sender, receiver = pair
    sender.send_multipart(frames, copy=copy)
    assert receiver.poll(RECV_TIMEOUT_MS, zmq.POLLIN), "message did not arrive in time"
    return receiver.recv_multipart(copy=False)


# ---------------------------------------------------------------- tensors


def test_whitelist_holds_the_documented_dtypes() -> None:
    names = set(_codec.TORCH_DTYPES)
    assert {"bool", "bfloat16", "complex64", "complex128", "uint16", "uint32", "uint64"} <= names
    assert {"float16", "float32", "float64", "int8", "int16", "int32", "int64"} <= names


@pytest.mark.parametrize("dtype", TORCH_DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(), (0,), (3, 0, 2), (1,), (5,), (2, 3, 4)], ids=str)
def test_tensor_roundtrip_every_dtype_and_shape(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    tensor = random_tensor(dtype, shape)
    assert_same_tensor(roundtrip(tensor), tensor)
    assert_same_tensor(decode(encode(tensor)), tensor)  # local frames, no copy


@pytest.mark.parametrize(
    ("dtype", "values"),
    [
        (torch.bool, [True, False, True]),
        (torch.uint8, [0, 255, 7]),
        (torch.int8, [-128, 127, 0]),
        (torch.uint16, [0, 65535, 300]),
        (torch.uint32, [0, 2**32 - 1, 70000]),
        (torch.uint64, [0, 2**64 - 1, 12345678901234567890]),
        (torch.int64, [-(2**63), 2**63 - 1, -1]),
        (torch.float16, [0.5, -65504.0, 1e-3]),
        (torch.bfloat16, [1.0, -3.0e38, 0.125]),
        (torch.float64, [math.pi, -0.0, 1e-300]),
        (torch.complex64, [1 + 2j, -3.5j, 0j]),
        (torch.complex128, [1e200 + 1j, -1j, 2.5 + 0j]),
    ],
    ids=lambda v: str(v) if isinstance(v, torch.dtype) else "",
)
def test_tensor_exact_values(dtype: torch.dtype, values: list[Any]) -> None:
    tensor = torch.tensor(values, dtype=dtype)
    got = roundtrip(tensor)
    assert got.dtype == dtype
    assert got.tolist() == tensor.tolist()


def test_float_specials_survive_bit_for_bit() -> None:
    tensor = torch.tensor([math.nan, math.inf, -math.inf, -0.0, 5e-324], dtype=torch.float64)
    got = roundtrip(tensor)
    assert_same_tensor(got, tensor)
    assert math.copysign(1.0, got[3].item()) == -1.0


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.arange(12.0).reshape(3, 4).T,
        lambda: torch.arange(20, dtype=torch.int32)[1::3],
        lambda: torch.arange(60.0).reshape(3, 4, 5)[:, ::2, 1:4],
        lambda: torch.arange(3.0).expand(4, 3),
        lambda: torch.arange(24, dtype=torch.bfloat16).reshape(2, 3, 4).permute(2, 0, 1),
        lambda: torch.tensor([1 + 2j, 3 - 4j, 5j]).conj(),
        lambda: torch.tensor([1 + 2j, 3 - 4j, 5j]).conj().imag,
        lambda: torch._neg_view(torch.arange(4.0)),
        lambda: torch.tensor([[1 + 1j, 2 - 2j], [3j, 4.0]], dtype=torch.complex128).conj().T,
        lambda: torch.arange(12.0).reshape(4, 3)[1:2, 0],
        lambda: torch.arange(8, dtype=torch.int16)[::2][:1],
        lambda: torch.empty(4, dtype=torch.bfloat16)[:0:2],
        lambda: torch.arange(6.0).reshape(2, 3)[1, 2],
    ],
    ids=["transposed", "step-slice", "3d-slices", "expanded", "permuted-bf16", "conj",
         "neg-bit", "neg-view", "conj-transposed", "size1-stride3", "size1-stride2",
         "empty-stride2", "0d-of-strided"],
)
def test_non_contiguous_and_lazy_views(make: Any) -> None:
    tensor = make()
    got = roundtrip(tensor)
    assert_same_tensor(got, tensor)
    assert got.is_contiguous()
    assert not got.is_conj() and not got.is_neg()
    assert got.tolist() == tensor.tolist()


def test_requires_grad_and_parameters_travel_as_plain_data() -> None:
    leaf = torch.randn(3, 2, requires_grad=True)
    nonleaf = leaf * 2
    param = nn.Parameter(torch.randn(4))
    got = roundtrip({"leaf": leaf, "nonleaf": nonleaf, "param": param})
    for key, want in [("leaf", leaf), ("nonleaf", nonleaf), ("param", param)]:
        assert type(got[key]) is torch.Tensor
        assert not got[key].requires_grad
        assert_same_tensor(got[key], want)


def test_decoded_tensors_over_writable_frames_are_independent() -> None:
    a, b = torch.zeros(4), torch.ones(4)
    frames = [bytearray(memoryview(f).cast("B")) for f in encode([a, b])]
    got = decode(frames)
    got[0].add_(5)
    assert got[0].tolist() == [5.0] * 4
    assert got[1].tolist() == [1.0] * 4
    assert a.tolist() == [0.0] * 4


# ---------------------------------------------------------------- TensorDicts


def make_batch() -> TensorDict:
    """A TorchRL-shaped rollout batch with nested keys and non-tensor leaves."""
    td = TensorDict(
        {
            "observation": torch.randn(4, 5, 3),
            "action": torch.randint(0, 3, (4, 5)),
            "sample_log_prob": torch.randn(4, 5),
            "next": TensorDict(
                {
                    "observation": torch.randn(4, 5, 3),
                    "reward": torch.randn(4, 5, 1),
                    "done": torch.zeros(4, 5, 1, dtype=torch.bool),
                    "terminated": torch.zeros(4, 5, 1, dtype=torch.bool),
                    "truncated": torch.ones(4, 5, 1, dtype=torch.bool),
                },
                batch_size=[4, 5],
            ),
            "collector": {
                "traj_ids": torch.arange(20).reshape(4, 5),
                "policy_version": torch.full((4, 5), 7, dtype=torch.int64),
            },
        },
        batch_size=[4, 5],
    )
    td["deep", "er", "est"] = torch.randn(4, 5, 2, 2, dtype=torch.float16)
    td.set_non_tensor("env_name", "CartPole-v1")
    td.set_non_tensor(("collector", "worker_name"), "w0")
    return td


def test_tensordict_rollout_batch_roundtrip() -> None:
    td = make_batch()
    got = roundtrip(td)
    assert_same_td(got, td)
    assert got.batch_size == torch.Size([4, 5])
    assert got["next", "reward"].shape == (4, 5, 1)
    assert got.get_non_tensor("env_name") == "CartPole-v1"
    assert got.get_non_tensor(("collector", "worker_name")) == "w0"
    assert set(got.keys(include_nested=True, leaves_only=True)) == set(
        td.keys(include_nested=True, leaves_only=True)
    )


@pytest.mark.parametrize(
    "value", ["text", "", "ünïcødé", 0, -(2**63), 2**64 - 1, 1.5, math.inf, True, False, None]
)
def test_tensordict_non_tensor_leaves(value: Any) -> None:
    td = TensorDict({"x": torch.ones(2)}, batch_size=[2])
    td.set_non_tensor("leaf", value)
    leaf = roundtrip(td)._get_str("leaf", None)  # get_non_tensor() turns None into a list
    assert is_non_tensor(leaf)
    assert leaf.data == value
    assert type(leaf.data) is type(value)
    assert leaf.batch_size == torch.Size([2])


@pytest.mark.parametrize("batch_size", [[], [0], [3], [2, 3], [2, 1, 4]], ids=str)
def test_tensordict_batch_sizes(batch_size: list[int]) -> None:
    td = TensorDict(
        {"a": torch.randn(*batch_size, 2),
         "b": {"c": torch.zeros((*batch_size,), dtype=torch.int8)}},
        batch_size=batch_size,
    )
    got = roundtrip(td)
    assert_same_td(got, td)
    assert got["b"].batch_size == torch.Size(batch_size)


def test_empty_tensordicts() -> None:
    for td in (
        TensorDict({}, batch_size=[]),
        TensorDict({}, batch_size=[7, 2]),
        TensorDict({"nested": TensorDict({}, batch_size=[3])}, batch_size=[3]),
    ):
        assert_same_td(roundtrip(td), td)


def test_tensordict_device_and_nested_batch_sizes() -> None:
    inner = TensorDict({"x": torch.randn(2, 3, 5)}, batch_size=[2, 3, 5])
    td = TensorDict({"inner": inner, "y": torch.ones(2, 3)}, batch_size=[2, 3], device="cpu")
    got = roundtrip(td)
    assert_same_td(got, td)
    assert got.device == torch.device("cpu")
    assert got["inner"].batch_size == torch.Size([2, 3, 5])
    assert roundtrip(TensorDict({}, batch_size=[1])).device is None


def test_tensordict_with_non_contiguous_leaves() -> None:
    base = torch.arange(40.0).reshape(4, 10)
    td = TensorDict({"t": base[:, ::3], "c": torch.randn(4, 2, dtype=torch.complex64).conj()},
                    batch_size=[4])
    assert_same_td(roundtrip(td), td)


def test_lazy_stacked_tensordict_is_encoded_dense() -> None:
    tds = [TensorDict({"a": torch.full((2,), float(i))}, batch_size=[]) for i in range(3)]
    stacked = torch.stack(tds, dim=0)
    got = roundtrip(stacked)
    assert got.batch_size == torch.Size([3])
    assert got["a"].tolist() == [[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]]


def test_tensordict_decodes_with_independent_structure() -> None:
    td = make_batch()
    got = decode(encode(td))
    got["extra"] = torch.zeros(4, 5)  # a normal, mutable TensorDict
    assert "extra" not in td.keys()


# ---------------------------------------------------------------- state dicts, numpy, plain


def test_state_dict_roundtrip_loads_into_a_fresh_model() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.LayerNorm(8),
                          nn.Linear(8, 2, bias=False))
    model(torch.randn(5, 4))  # update BatchNorm running stats and num_batches_tracked
    state = model.state_dict()
    got = roundtrip(state)
    assert list(got) == list(state)
    for key, want in state.items():
        assert_same_tensor(got[key], want)
    assert got["1.num_batches_tracked"].shape == ()
    assert got["1.num_batches_tracked"].dtype == torch.int64
    fresh = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.LayerNorm(8),
                          nn.Linear(8, 2, bias=False))
    fresh.load_state_dict(got)
    fresh.eval()
    model.eval()
    x = torch.randn(3, 4)
    assert torch.equal(fresh(x), model(x))


@pytest.mark.parametrize("dtype", NUMPY_DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(), (0,), (4,), (2, 0), (3, 2, 2)], ids=str)
def test_numpy_roundtrip_every_dtype(dtype: np.dtype, shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(0)
    if dtype.kind in "fc":
        array = np.asarray(rng.standard_normal(shape) * 100).astype(dtype)
    else:
        info = np.iinfo(np.uint8 if dtype == np.bool_ else dtype)
        array = np.asarray(rng.integers(
            info.min, info.max, shape, dtype=np.int64 if info.min else np.uint64, endpoint=True
        )).astype(dtype)
        if dtype == np.bool_:
            array = np.asarray(array % 2 == 1)
    got = roundtrip(array)
    assert isinstance(got, np.ndarray)
    assert got.dtype == array.dtype
    assert got.shape == array.shape
    assert got.tobytes() == array.tobytes()


def test_numpy_non_contiguous_and_scalars() -> None:
    base = np.arange(60, dtype=np.int32).reshape(3, 4, 5)
    for array in (base[:, ::2, 1:4], base.T, np.asfortranarray(base), base[::-1]):
        got = roundtrip(array)
        assert got.shape == array.shape
        np.testing.assert_array_equal(got, array)
    got = roundtrip({"f": np.float32(1.5), "i": np.int64(-3), "b": np.bool_(True)})
    assert got == {"f": 1.5, "i": -3, "b": True}


def test_plain_values_with_tensors_inside() -> None:
    t1, t2 = torch.randn(3), torch.arange(4, dtype=torch.int16)
    obj = {
        "name": "batch",
        "blob": b"\x00\xffraw",
        "n": -5,
        "big": 2**64 - 1,
        "x": 0.25,
        "flag": False,
        "none": None,
        "list": [1, t1, {"inner": [t2, "s"]}],
        "tuple": (1, 2),
        "empty": {},
    }
    got = roundtrip(obj)
    assert_same_tensor(got["list"][1], t1)
    assert_same_tensor(got["list"][2]["inner"][0], t2)
    assert got["list"][2]["inner"][1] == "s"
    assert got["tuple"] == [1, 2]  # msgpack has one sequence type
    for key in ("name", "blob", "n", "big", "x", "flag", "none", "empty"):
        assert got[key] == obj[key] and type(got[key]) is type(obj[key])
    assert roundtrip(None) is None
    assert roundtrip([]) == []


def test_mixed_containers_of_everything() -> None:
    td = make_batch()
    obj = {"td": td, "arr": np.arange(3.0), "sd": {"w": torch.ones(2, 2)}, "tds": [td[0], td[1]]}
    got = roundtrip(obj)
    assert_same_td(got["td"], td)
    assert_same_td(got["tds"][1], td[1])
    np.testing.assert_array_equal(got["arr"], np.arange(3.0))
    assert got["sd"]["w"].tolist() == [[1.0, 1.0], [1.0, 1.0]]


def test_encode_message_fields_roundtrip() -> None:
    frames = encode_message({"t": torch.ones(2)}, kind="batch", seq=2**40,
                            meta={"model": "policy", "version": 3, "np": np.int32(4)})
    got = decode_message([bytes(memoryview(f).cast("B")) for f in frames])
    assert isinstance(got, Decoded)
    assert (got.kind, got.seq) == ("batch", 2**40)
    assert got.meta == {"model": "policy", "version": 3, "np": 4}
    assert got.body["t"].tolist() == [1.0, 1.0]
    assert transports.decode(frames)["t"].tolist() == [1.0, 1.0]


def test_ack_flag_roundtrip_and_only_true_counts() -> None:
    assert decode_message(encode_message(1, seq=5, ack=True)).needs_ack is True
    assert decode_message(encode_message(1, seq=5)).needs_ack is False
    for flag in (1, "yes", [True]):
        assert decode_message([header(1, a=flag)]).needs_ack is False


def test_misaligned_frames_are_decoded_correctly() -> None:
    tensor = torch.arange(6, dtype=torch.float64) / 3
    frames = encode(tensor)
    storage = bytearray(len(frames[1]) + 1)
    storage[1:] = bytes(frames[1])
    misaligned = memoryview(storage)[1:]
    got = decode([frames[0], misaligned])
    assert_same_tensor(got, tensor)
    array = np.arange(5, dtype=np.complex128)
    frames = encode(array)
    storage = bytearray(len(frames[1]) + 3)
    storage[3:] = bytes(frames[1])
    np.testing.assert_array_equal(decode([frames[0], memoryview(storage)[3:]]), array)


# ---------------------------------------------------------------- zero copy


@pytest.mark.parametrize("dtype", [torch.float32, torch.bool, torch.complex128, torch.bfloat16])
def test_encode_hands_over_the_tensor_memory(dtype: torch.dtype) -> None:
    tensor = random_tensor(dtype, (64, 16))
    frames = encode({"t": tensor})
    assert len(frames) == 2
    start, length = frame_address(frames[1])
    assert start == tensor.data_ptr()
    assert length == tensor.numel() * tensor.element_size()


def test_size_one_dimension_with_a_stride_is_still_zero_copy() -> None:
    base = torch.arange(12.0).reshape(4, 3)
    element = base[1:2, 0]  # contiguous, shape (1,), stride (3,)
    assert element.is_contiguous() and element.stride() == (3,)
    frames = encode(element)
    assert frame_address(frames[1]) == (element.data_ptr(), 4)
    assert decode(frames).tolist() == [3.0]


def test_encode_of_a_contiguous_slice_starts_at_its_offset() -> None:
    base = torch.arange(100, dtype=torch.int64)
    part = base[10:30]
    frames = encode(part)
    assert frame_address(frames[1]) == (part.data_ptr(), 20 * 8)
    assert part.data_ptr() == base.data_ptr() + 80


def test_encode_hands_over_numpy_memory() -> None:
    array = np.arange(1000, dtype=np.float32).reshape(10, 100)
    frames = encode([array])
    assert frame_address(frames[1]) == (array.ctypes.data, array.nbytes)


def test_encode_of_a_non_contiguous_tensor_copies_once() -> None:
    tensor = torch.arange(20.0).reshape(4, 5).T
    frames = encode(tensor)
    assert frame_address(frames[1])[0] != tensor.data_ptr()
    assert bytes(frames[1]) == raw_bytes(tensor)


def test_encoded_frame_keeps_the_tensor_alive() -> None:
    frames = encode(torch.arange(1000, dtype=torch.int32))
    gc.collect()
    garbage = [torch.full((1000,), -1, dtype=torch.int32) for _ in range(20)]
    assert decode(frames).tolist() == list(range(1000))
    del garbage


def test_local_decode_builds_over_the_frames() -> None:
    tensor = torch.randn(32, 32)
    assert decode(encode(tensor)).data_ptr() == tensor.data_ptr()


@pytest.mark.parametrize("copy_on_send", [False, True], ids=["send-zero-copy", "send-copy"])
def test_decode_from_zmq_frames_builds_over_the_received_memory(
    socket_pair: tuple[zmq.Socket, zmq.Socket], copy_on_send: bool
) -> None:
    td = TensorDict(
        {"obs": torch.randn(256, 64), "act": torch.randint(0, 9, (256,)),
         "next": {"done": torch.zeros(256, 1, dtype=torch.bool)}},
        batch_size=[256],
    )
    frames = send_recv(socket_pair, encode(td), copy=copy_on_send)
    assert all(isinstance(f, zmq.Frame) for f in frames)
    got = decode(frames)
    assert_same_td(got, td)
    leaves = [got["obs"], got["act"], got["next", "done"]]
    for leaf, frame in zip(leaves, frames[1:], strict=True):
        start, length = frame_address(frame)
        assert start <= leaf.data_ptr() < start + length
        assert leaf.data_ptr() + leaf.numel() * leaf.element_size() <= start + length


def test_decoded_tensor_keeps_the_zmq_frame_alive(
    socket_pair: tuple[zmq.Socket, zmq.Socket],
) -> None:
    values = torch.arange(50_000, dtype=torch.float64)
    frames = send_recv(socket_pair, encode({"v": values}), copy=True)
    watcher = weakref.ref(frames[1])
    got = decode(frames)["v"]
    del frames
    gc.collect()
    assert watcher() is not None, "the data frame was freed under a live tensor"
    noise = [torch.full((50_000,), -7.0, dtype=torch.float64) for _ in range(10)]
    assert torch.equal(got, values)
    del noise, got
    gc.collect()
    assert watcher() is None, "the frame outlived every tensor built over it"


def test_zmq_roundtrip_of_every_dtype(socket_pair: tuple[zmq.Socket, zmq.Socket]) -> None:
    body = {str(d): random_tensor(d, (3, 5), seed=i) for i, d in enumerate(TORCH_DTYPES)}
    got = decode(send_recv(socket_pair, encode(body)))
    assert list(got) == list(body)
    for key, want in body.items():
        assert_same_tensor(got[key], want)


# ---------------------------------------------------------------- encode errors


class Custom:
    """An arbitrary user object: never encodable."""


@pytest.mark.parametrize(
    ("make", "pattern"),
    [
        (lambda: torch.eye(3).to_sparse(), "sparse_coo"),
        (lambda: torch.eye(3).to_sparse_csr(), "sparse_csr"),
        (lambda: torch.nested.nested_tensor([torch.ones(2), torch.ones(3)], layout=torch.jagged),
         "jagged"),
        (lambda: torch.ones(2, dtype=torch.float8_e4m3fn), "dtype torch.float8_e4m3fn"),
        (lambda: torch.empty(3, device="meta"), "meta device"),
        (lambda: Custom(), "cannot encode Custom"),
        (lambda: {"x": [1, Custom()]}, "cannot encode Custom"),
        (lambda: {1, 2}, "cannot encode set"),
        (lambda: 1 + 2j, "cannot encode complex"),
        (lambda: 2**64, "cannot encode"),
        (lambda: np.array([object()]), "numpy array of dtype object"),
        (lambda: np.arange(3, dtype=">f4"), "numpy array of dtype >f4"),
        (lambda: np.zeros(2, dtype="datetime64[ns]"), "numpy array of dtype datetime64"),
    ],
    ids=["sparse-coo", "sparse-csr", "jagged", "float8", "meta", "object", "nested-object",
         "set", "complex", "int-overflow", "np-object", "np-big-endian", "np-datetime"],
)
@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
def test_unsupported_objects_raise_type_error(make: Any, pattern: str) -> None:
    with pytest.raises(TypeError, match=pattern):
        encode(make())


def test_tensordict_with_custom_non_tensor_leaf_raises_type_error() -> None:
    td = TensorDict({"x": torch.ones(2)}, batch_size=[2])
    td.set_non_tensor("obj", Custom())
    with pytest.raises(TypeError, match=r"non-tensor entry 'obj' of type Custom"):
        encode(td)
    nested = TensorDict({"inner": td}, batch_size=[2])
    with pytest.raises(TypeError, match="Custom"):
        encode(nested)


def test_non_tensor_stack_raises_type_error_instead_of_losing_data() -> None:
    td = TensorDict({"x": torch.ones(2)}, batch_size=[2])
    td["names"] = NonTensorStack("a", "b")
    with pytest.raises(TypeError, match="NonTensorStack"):
        encode(td)


def test_tensor_in_meta_raises_type_error() -> None:
    with pytest.raises(TypeError, match="meta"):
        encode_message(None, meta={"t": torch.ones(1)})
    with pytest.raises(TypeError, match="meta"):
        encode_message(None, meta={"a": np.ones(2)})


def test_too_deep_to_encode_raises_type_error() -> None:
    with pytest.raises(TypeError):
        encode(nested_list(5000))


# ---------------------------------------------------------------- decode: limits and framing


def test_max_bytes_exceeded_names_the_limit() -> None:
    frames = encode(torch.zeros(1000, dtype=torch.uint8))
    total = sum(memoryview(f).nbytes for f in frames)
    assert decode(frames, max_bytes=total).shape == (1000,)
    with pytest.raises(ProtocolError, match=f"exceeds the limit of {total - 1} bytes"):
        decode(frames, max_bytes=total - 1)
    with pytest.raises(ProtocolError, match="limit of 10 bytes"):
        decode([header("x" * 100)], max_bytes=10)


def test_header_over_the_header_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_codec, "MAX_HEADER_BYTES", 64)
    with pytest.raises(ProtocolError, match=r"header of \d+ bytes exceeds 64"):
        decode([header("x" * 100)])


def test_too_many_frames(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_codec, "MAX_FRAMES", 3)
    frames = encode([torch.ones(1)] * 3)
    with pytest.raises(ProtocolError, match="at most 3"):
        decode(frames)


@pytest.mark.parametrize("version", [0, 2, PROTOCOL_VERSION + 1, "1", 1.0, True, None, [1]])
def test_wrong_protocol_version(version: Any) -> None:
    with pytest.raises(ProtocolError, match="protocol version"):
        decode([header(1, v=version)])


def test_missing_version_field() -> None:
    with pytest.raises(ProtocolError, match="protocol version"):
        decode([header(1, v=...)])


@pytest.mark.parametrize("field", ["k", "s", "m", "b"])
def test_missing_header_field(field: str) -> None:
    with pytest.raises(ProtocolError, match="lacks field"):
        decode([header(1, **{field: ...})])


@pytest.mark.parametrize(
    ("fields", "pattern"),
    [
        ({"k": 5}, "kind must be a string"),
        ({"k": b"data"}, "kind must be a string"),
        ({"s": "0"}, "seq an integer"),
        ({"s": 1.0}, "seq an integer"),
        ({"s": True}, "seq an integer"),
        ({"m": [1]}, "meta must be a map"),
        ({"m": {"t": tensor_ref(1, "float32", [1])}}, "meta must hold plain"),
    ],
)
def test_bad_header_fields(fields: dict[str, Any], pattern: str) -> None:
    with pytest.raises(ProtocolError, match=pattern):
        decode([header(1, **fields), b"\x00" * 4])


@pytest.mark.parametrize(
    "raw",
    [b"", b"\xc1", b"\x85\xa1v", b"not msgpack at all", msgpack.packb([1, 2, 3]),
     msgpack.packb(None), msgpack.packb({1: 2}), header(1)[:-1], header(1) + b"\x00"],
    ids=["empty", "reserved-byte", "truncated-map", "text", "array", "nil", "int-key",
         "truncated", "trailing-byte"],
)
def test_garbage_headers(raw: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode([raw])


@pytest.mark.parametrize("frames", [[], (), None, "abc", b"abc", [object()], [b"", 1]])
def test_not_a_list_of_frames(frames: Any) -> None:
    with pytest.raises(ProtocolError):
        decode(frames)


def test_extra_frame() -> None:
    frames = [*encode({"a": torch.ones(3)}), b"spare"]
    with pytest.raises(ProtocolError, match=r"1 frame\(s\) unaccounted for"):
        decode(frames)
    with pytest.raises(ProtocolError, match="unaccounted"):
        decode([header(None), b""])


def test_missing_frame() -> None:
    frames = encode({"a": torch.ones(3), "b": torch.zeros(2)})
    with pytest.raises(ProtocolError, match=r"references frame 2; message has frames 1..1"):
        decode(frames[:-1])
    with pytest.raises(ProtocolError, match="references frame"):
        decode(frames[:1])


@pytest.mark.parametrize("index", [0, -1, 3, 2**63, "1", None, 1.0, True])
def test_frame_index_out_of_range_or_not_int(index: Any) -> None:
    with pytest.raises(ProtocolError):
        decode([header(tensor_ref(index, "uint8", [1])), b"\x01", b"\x02"])


def test_frame_referenced_twice() -> None:
    ref = tensor_ref(1, "float32", [2])
    with pytest.raises(ProtocolError, match="frame 1 is referenced twice"):
        decode([header([ref, ref]), b"\x00" * 8])
    with pytest.raises(ProtocolError, match="referenced twice"):
        decode([header([ref, array_ref(1, "float32", [2])]), b"\x00" * 8])
    with pytest.raises(ProtocolError, match="referenced twice"):
        decode([header(td_ext([], None, {"a": ref, "b": ref})), b"\x00" * 8])


@pytest.mark.parametrize(
    ("dtype", "shape", "nbytes"),
    [("float32", [3], 11), ("float32", [3], 13), ("float32", [3], 0), ("int64", [2, 2], 16),
     ("complex128", [], 8), ("uint8", [0], 1), ("bool", [2, 0, 3], 6)],
)
def test_shape_times_itemsize_must_match_the_frame(
    dtype: str, shape: list[int], nbytes: int
) -> None:
    with pytest.raises(ProtocolError, match=r"needs \d+ bytes, its frame holds"):
        decode([header(tensor_ref(1, dtype, shape)), b"\x00" * nbytes])
    with pytest.raises(ProtocolError, match="its frame holds"):
        decode([header(array_ref(1, dtype, shape)), b"\x00" * nbytes])


def test_truncated_or_extended_data_frame() -> None:
    frames = [bytes(f) for f in encode(torch.arange(10.0))]
    for data in (frames[1][:-1], frames[1] + b"\x00", frames[1][:4], b""):
        with pytest.raises(ProtocolError, match="its frame holds"):
            decode([frames[0], data])


@pytest.mark.parametrize(
    "dtype", ["float128", "object", "torch.float32", "float8_e4m3fn", "qint8", "", "FLOAT32", 5,
              None, b"float32", ["float32"]],
)
def test_unknown_dtype_name(dtype: Any) -> None:
    with pytest.raises(ProtocolError, match="is not accepted"):
        decode([header(tensor_ref(1, dtype, [1])), b"\x00" * 16])
    with pytest.raises(ProtocolError, match="is not accepted"):
        decode([header(array_ref(1, dtype, [1])), b"\x00" * 16])


def test_numpy_only_and_torch_only_dtypes_are_kept_apart() -> None:
    with pytest.raises(ProtocolError, match="'bfloat16' is not accepted"):
        decode([header(array_ref(1, "bfloat16", [1])), b"\x00\x00"])


@pytest.mark.parametrize(
    "shape", [[-1], [1.0], ["2"], [None], [True, 1], 4, "4", None, {"a": 1}, [2**48], [1] * 33],
)
def test_invalid_shapes(shape: Any) -> None:
    with pytest.raises(ProtocolError):
        decode([header(tensor_ref(1, "uint8", shape)), b"\x00" * 4])


def test_overflowing_shape_with_zero_dimension() -> None:
    with pytest.raises(ProtocolError):
        decode([header(tensor_ref(1, "float32", [2**47, 2**47, 0])), b""])


@pytest.mark.parametrize("payload", [b"\x02", b"\x00\x01\xff", b"\x01\x01\x80"])
def test_bool_bytes_other_than_zero_and_one(payload: bytes) -> None:
    with pytest.raises(ProtocolError, match="bool tensor holds bytes other than 0 and 1"):
        decode([header(tensor_ref(1, "bool", [len(payload)])), payload])
    with pytest.raises(ProtocolError, match="bool array holds bytes other than 0 and 1"):
        decode([header(array_ref(1, "bool", [len(payload)])), payload])
    assert decode([header(tensor_ref(1, "bool", [2])), b"\x00\x01"]).tolist() == [False, True]


@pytest.mark.parametrize(
    "ref",
    [msgpack.ExtType(_codec._EXT_TENSOR, b"\xc1"), msgpack.ExtType(_codec._EXT_TENSOR, b""),
     msgpack.ExtType(_codec._EXT_TENSOR, msgpack.packb([1, "uint8"])),
     msgpack.ExtType(_codec._EXT_TENSOR, msgpack.packb([1, "uint8", [1], 0])),
     msgpack.ExtType(_codec._EXT_TENSOR, msgpack.packb("abc")),
     msgpack.ExtType(_codec._EXT_TENSOR, msgpack.packb(7)),
     msgpack.ExtType(_codec._EXT_NDARRAY, msgpack.packb({"a": 1, "b": 2, "c": 3})),
     msgpack.ExtType(99, b"whatever"), msgpack.ExtType(0, b"")],
    ids=["invalid-msgpack", "empty", "two-items", "four-items", "string", "int", "map",
         "unknown-code", "code-zero"],
)
def test_malformed_extensions(ref: msgpack.ExtType) -> None:
    with pytest.raises(ProtocolError):
        decode([header({"x": ref}), b"\x00"])


def test_malformed_msgpack_timestamp() -> None:
    prefix = b"\x85\xa1v\x01\xa1k\xa4data\xa1s\x00\xa1m\x80\xa1b"
    with pytest.raises(ProtocolError, match="not valid msgpack"):
        decode([prefix + b"\xd4\xff\x00"])  # a timestamp must be 4, 8 or 12 bytes


@pytest.mark.parametrize(
    ("ext", "pattern"),
    [
        (msgpack.ExtType(_codec._EXT_TENSORDICT, b"\xc1"), "not valid msgpack"),
        (msgpack.ExtType(_codec._EXT_TENSORDICT, msgpack.packb({"a": 1})),
         r"\[batch_size, device, entries\]"),
        (td_ext([], None, [1]), r"\[batch_size, device, entries\]"),
        (td_ext(3, None, {}), "invalid TensorDict batch size"),
        (td_ext([-1], None, {}), "invalid TensorDict batch size"),
        (td_ext([1.5], None, {}), "invalid TensorDict batch size"),
        (td_ext([1] * 33, None, {}), "invalid TensorDict batch size"),
        (td_ext([], "cuda:0", {}), "device must be 'cpu'"),
        (td_ext([], 0, {}), "device must be 'cpu'"),
        (td_ext([], None, {"a": 1}), "neither tensor nor TensorDict"),
        (td_ext([], None, {"a": ["x", "y"]}), "neither tensor nor TensorDict"),
        (td_ext([], None, {"a": [[1]]}), "neither tensor nor TensorDict"),
        (td_ext([], None, {"a": [b"raw"]}), "neither tensor nor TensorDict"),
        (td_ext([], None, {b"a": tensor_ref(1, "uint8", [1])}), "keys must be strings"),
        (td_ext([], None, {b"a": ["leaf"]}), "keys must be strings"),
        (td_ext([2], None, {"a": tensor_ref(1, "uint8", [1])}), "does not start with the batch"),
        (td_ext([1], None, {"a": td_ext([2], None, {})}), "does not start with the batch"),
    ],
)
def test_malformed_tensordicts(ext: msgpack.ExtType, pattern: str) -> None:
    with pytest.raises(ProtocolError, match=pattern):
        decode([header(ext), b"\x01"])


@pytest.mark.parametrize("depth", [_codec.MAX_DEPTH + 2, 200, 1000])
def test_depth_bomb_in_body(depth: int) -> None:
    with pytest.raises(ProtocolError, match="nests deeper"):
        decode([header(nested_list(depth))])


@pytest.mark.parametrize("depth", [_codec.MAX_DEPTH + 2, 1000])
def test_depth_bomb_in_meta(depth: int) -> None:
    with pytest.raises(ProtocolError, match="nests deeper"):
        decode([header(None, m={"x": nested_list(depth)})])


def test_depth_bomb_deeper_than_msgpack_allows() -> None:
    raw = b"\x85\xa1v\x01\xa1k\xa4data\xa1s\x00\xa1m\x80\xa1b" + b"\x91" * 100_000 + b"\x90"
    with pytest.raises(ProtocolError, match="not valid msgpack"):
        decode([raw])
    meta_bomb = b"\x85\xa1v\x01\xa1k\xa4data\xa1s\x00\xa1b\xc0\xa1m\x81\xa1x" + b"\x91" * 100_000
    with pytest.raises(ProtocolError):
        decode([meta_bomb + b"\x90"])


@pytest.mark.parametrize("depth", [_codec.MAX_DEPTH + 1, 500])
def test_depth_bomb_of_nested_tensordicts(depth: int) -> None:
    ext = td_ext([], None, {})
    for _ in range(depth):
        ext = td_ext([], None, {"a": ext})
    with pytest.raises(ProtocolError, match="nests deeper"):
        decode([header(ext)])


def test_depth_bomb_inside_a_tensordict_entry() -> None:
    inner_bomb = msgpack.ExtType(
        _codec._EXT_TENSORDICT,
        msgpack.packb([[], None, {}])[:-1] + b"\x81\xa1a" + b"\x91" * 2000 + b"\x90",
    )
    with pytest.raises(ProtocolError):
        decode([header(inner_bomb)])
    with pytest.raises(ProtocolError, match="nests deeper"):
        decode([header(td_ext([], None, {"a": nested_list(300)}))])


def test_legitimate_nesting_up_to_the_limit_decodes() -> None:
    value = nested_list(_codec.MAX_DEPTH)
    assert decode([header(value)]) == value
    td = TensorDict({}, batch_size=[])
    for _ in range(10):
        td = TensorDict({"a": td, "x": torch.ones(())}, batch_size=[])
    assert_same_td(roundtrip(td), td)


def test_a_bad_message_does_not_poison_the_next_one() -> None:
    good = encode({"a": torch.ones(2)})
    with pytest.raises(ProtocolError):
        decode([good[0], b"\x00"])
    assert decode(good)["a"].tolist() == [1.0, 1.0]
