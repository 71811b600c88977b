"""Versions streamed in chunks (``ZmqWeightSyncScheme(chunk_bytes=...)``): exact, checked, whole.

A chunked version is applied only once every chunk arrived, at a step
boundary; a chunk that does not continue its stream exactly (index, count,
version, key, offset, size, frame) fails the stream with a clear error in the
last chunk's ack and leaves the model as it was; a stream cut off halfway
leaves nothing applied.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import pytest
import torch
from torch import nn

from asyncrl._protocol import WeightChunk, WeightMeta
from asyncrl.testing import fill_parameters
from asyncrl.weights import (
    WEIGHTS_KIND,
    SharedMemWeightSyncScheme,
    StreamedWeightReceiver,
    WeightApplier,
    WeightSyncScheme,
    ZmqWeightSyncScheme,
)
from asyncrl.weights._chunks import chunk_bodies, plan_chunks
from asyncrl.weights._strategy import flat_tensors
from transports import LocalHub, Message, PeerLostError, ProtocolError

pytestmark = pytest.mark.anyio
WAIT = 20
CHUNK = 40  # bytes: the 232-byte net below goes in 6 chunks, cutting tensors in two


def net(fill: float) -> nn.Module:
    module = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2))
    fill_parameters(module, fill)
    return module


def values(module: nn.Module) -> set[float]:
    return {float(v) for p in module.parameters() for v in p.detach().reshape(-1)}


def stream(model: nn.Module, version: int, chunk_bytes: int = CHUNK) -> list[Message]:
    """The chunk messages a trainer sends for ``model`` as ``version`` (bodies copied)."""
    flat = flat_tensors(model)
    return [Message(b"", WEIGHTS_KIND, 100 * version + chunk.index,
                    [t.clone() for t in chunk_bodies(flat, chunk)],
                    WeightMeta("policy", version, chunk=chunk).to_meta(), chunk.last)
            for chunk in plan_chunks(flat, chunk_bytes)]


def receiver_at_version_1() -> tuple[StreamedWeightReceiver, nn.Module]:
    model = net(0.0)
    receiver = ZmqWeightSyncScheme(chunk_bytes=CHUNK).init_on_worker("policy", model=model)
    assert isinstance(receiver, StreamedWeightReceiver)
    for message in stream(net(1.0), 1):
        receiver.on_message(message)
    assert receiver.apply_pending() and receiver.version == 1 and values(model) == {1.0}
    assert [ack.version for ack in receiver.take_acks()] == [1]
    return receiver, model


def test_a_chunked_version_is_applied_only_once_complete_and_by_a_buffer_swap() -> None:
    receiver, model = receiver_at_version_1()
    messages = stream(net(2.0), 2)
    assert len(messages) == 6 and [m.needs_ack for m in messages] == [False] * 5 + [True]
    for message in messages[:-1]:
        receiver.on_message(message)
        assert not receiver.has_pending and values(model) == {1.0}  # nothing applied early
    receiver.on_message(messages[-1])
    assert receiver.pending_version == 2 and values(model) == {1.0}  # waits for a boundary
    pointers = {model[0].weight.data_ptr()}
    assert receiver.apply_pending() and values(model) == {2.0}
    for version in (3, 4, 5):  # the parameters alternate between two buffers: no allocation
        pointers.add(model[0].weight.data_ptr())
        for message in stream(net(float(version)), version):
            receiver.on_message(message)
        assert receiver.apply_pending() and values(model) == {float(version)}
    assert len(pointers) == 2
    assert [ack.version for ack in receiver.take_acks()] == [2, 3, 4, 5]


def test_zero_copy_false_copies_into_the_models_own_tensors() -> None:
    model = net(0.0)
    receiver = ZmqWeightSyncScheme(chunk_bytes=CHUNK, zero_copy=False).init_on_worker(
        "policy", model=model)
    pointer = model[0].weight.data_ptr()
    for version in (1, 2):
        for message in stream(net(float(version)), version):
            receiver.on_message(message)
        assert receiver.apply_pending() and values(model) == {float(version)}
    assert model[0].weight.data_ptr() == pointer


def _drop(index: int) -> Callable[[list[Message]], list[Message]]:
    return lambda ms: [m for m in ms if m.meta["chunk"]["index"] != index]


def _meta(index: int, change: Callable[[dict[str, Any]], None]
          ) -> Callable[[list[Message]], list[Message]]:
    def tamper(messages: list[Message]) -> list[Message]:
        change(messages[index].meta)
        return messages
    return tamper


def _body(index: int, frame: torch.Tensor) -> Callable[[list[Message]], list[Message]]:
    def tamper(messages: list[Message]) -> list[Message]:
        messages[index].body[0] = frame
        return messages
    return tamper


def _part(index: int, field: int, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(meta: dict[str, Any]) -> None:
        meta["chunk"]["parts"][0][field] = value
    return change


HOSTILE = {
    "a lost chunk": (_drop(2), "expected chunk 2 of 6"),
    "reordered chunks": (lambda ms: [ms[0], ms[2], ms[1], *ms[3:]], "expected chunk 1 of 6"),
    "another version mid-stream": (_meta(2, lambda m: m.update(version=3)),
                                   "no stream of that version"),
    "a changed count": (_meta(1, lambda m: m["chunk"].update(count=7)), "expected chunk 1 of 6"),
    "a wrong key": (_meta(1, _part(1, 0, "1.weight")), "expected '0.weight' from byte 40"),
    "a wrong offset": (_meta(1, _part(1, 1, 44)), "expected '0.weight' from byte 40"),
    "a size past the tensor": (_meta(1, _part(1, 2, 200)), "at most 88 bytes"),
    "a frame of the wrong size": (_body(1, torch.zeros(39, dtype=torch.uint8)),
                                  "must be 40 bytes"),
    "a frame of another dtype": (_body(1, torch.zeros(10)), "must be 40 bytes (uint8)"),
    "a layout of other shapes": (_meta(0, lambda m: m["chunk"]["layout"][0].__setitem__(
        2, [4, 8])), "shape"),
    "a layout with an unknown key": (_meta(0, lambda m: m["chunk"]["layout"][0].__setitem__(
        0, "0.other")), "0.other"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_chunk_fails_its_stream_clearly_and_leaves_the_model_whole(case: str) -> None:
    tamper, expected = HOSTILE[case]
    receiver, model = receiver_at_version_1()
    for message in tamper(stream(net(2.0), 2)):
        receiver.on_message(message)
    assert not receiver.apply_pending()
    assert receiver.version == 1 and values(model) == {1.0}
    acks = receiver.take_acks()
    assert [ack.version for ack in acks] == [None]
    assert expected in str(acks[0].error), str(acks[0].error)
    for message in stream(net(3.0), 3):  # the next stream is taken as usual
        receiver.on_message(message)
    assert receiver.apply_pending() and values(model) == {3.0}


@pytest.mark.parametrize("meta", [
    {"index": -1, "count": 2, "parts": []},
    {"index": 2, "count": 2, "parts": []},
    {"index": 0, "count": 0, "parts": []},
    {"index": 1, "count": 2, "parts": [["w", 0]]},
    {"index": 1, "count": 2, "parts": [["w", -1, 4]]},
    {"index": 1, "count": 2, "parts": [["", 0, 4]]},
    {"index": 1, "count": 2, "parts": [], "layout": [["w", "float32", [2]]]},
    {"index": 0, "count": 2, "parts": []},
    {"index": 0, "count": 2, "parts": [], "layout": [["w", "float32", "2"]]},
    {"index": 0, "count": 2, "parts": [["w", 0, 1]] * 5000},
    "chunk",
])
def test_malformed_chunk_meta_is_a_protocol_error(meta: Any) -> None:
    with pytest.raises(ProtocolError, match="chunk"):
        WeightChunk.from_meta(meta)


def test_a_stream_cut_off_halfway_leaves_no_half_applied_version() -> None:
    receiver, model = receiver_at_version_1()
    for message in stream(net(2.0), 2)[:4]:  # the trainer died after 4 chunks of 6
        receiver.on_message(message)
    assert not receiver.apply_pending() and receiver.version == 1 and values(model) == {1.0}
    assert receiver.take_acks() == []  # only the last chunk asks for an ack
    for message in stream(net(3.0), 3):  # a new stream replaces the unfinished one
        receiver.on_message(message)
    assert receiver.apply_pending() and values(model) == {3.0}


def test_a_scheme_without_chunks_refuses_them_by_name() -> None:
    receiver = SharedMemWeightSyncScheme().init_on_worker("policy", model=net(0.0))
    receiver.on_message(stream(net(1.0), 1)[-1])
    [ack] = receiver.take_acks()
    assert "came in chunks" in str(ack.error) and "ZmqWeightSyncScheme" in str(ack.error)


def test_chunk_bytes_is_configuration() -> None:
    scheme = ZmqWeightSyncScheme(chunk_bytes=1 << 20, zero_copy=False)
    again = WeightSyncScheme.from_config(scheme.to_config())
    assert isinstance(again, ZmqWeightSyncScheme)
    assert (again.chunk_bytes, again.zero_copy) == (1 << 20, False)
    with pytest.raises(ValueError, match="chunk_bytes"):
        ZmqWeightSyncScheme(chunk_bytes=-1)


async def test_sender_to_applier_through_the_codec_in_chunks() -> None:
    hub = LocalHub(encode=True)  # every message encoded and decoded, as over a socket
    trainer, worker = net(0.0), net(0.0)
    applier = WeightApplier(hub.connect(b"w0", deliver=lambda m: applier.deliver(m)))
    applier.add(ZmqWeightSyncScheme(chunk_bytes=CHUNK).init_on_worker("policy", model=worker))
    sender = ZmqWeightSyncScheme(chunk_bytes=CHUNK).init_on_sender(
        "policy", hub=hub, model=trainer, workers={0: b"w0"})
    with anyio.fail_after(WAIT):
        for version in (1, 2, 3):
            fill_parameters(trainer, float(version))
            await sender.send_async()
            fill_parameters(trainer, -1.0)  # send_async returned: the snapshot is complete
            await applier.flush_acks()
            assert await sender.wait_ack(timeout=WAIT) == {0: version}
            assert values(worker) == {float(version)}
    assert sender.chunks_sent == 18 and applier.receivers["policy"].chunks_received == 18
    small = ZmqWeightSyncScheme().init_on_sender("policy", hub=LocalHub(), model=trainer,
                                                 workers={})
    assert small._plan(trainer.state_dict()) is None  # under chunk_bytes: one message


async def test_a_worker_lost_mid_stream_fails_the_send_and_keeps_its_version() -> None:
    hub = LocalHub(encode=True)
    worker = net(0.0)
    receiver = ZmqWeightSyncScheme(chunk_bytes=CHUNK).init_on_worker("policy", model=worker)
    seen = []

    def deliver(message: Message) -> None:
        seen.append(message.meta["chunk"]["index"])
        receiver.on_message(message)
        if message.meta["version"] == 2 and len(seen) == 6 + 3:
            hub.lose(b"w0")  # gone after 3 chunks of version 2

    link = hub.connect(b"w0", deliver=deliver)
    trainer = net(1.0)
    sender = ZmqWeightSyncScheme(chunk_bytes=CHUNK).init_on_sender(
        "policy", hub=hub, model=trainer, workers={0: b"w0"})
    with anyio.fail_after(WAIT):
        await sender.send_async()
        receiver.apply_pending()
        await receiver.flush_acks(link)
        assert await sender.wait_ack(timeout=WAIT) == {0: 1}
        fill_parameters(trainer, 2.0)
        await sender.send_async()
        with pytest.raises(PeerLostError):
            await sender.wait_ack(timeout=WAIT)
    assert seen == [0, 1, 2, 3, 4, 5, 0, 1, 2]
    assert not receiver.apply_pending() and receiver.version == 1 and values(worker) == {1.0}


@pytest.mark.parametrize(("anyio_backend", "sync", "in_place"), [
    ("asyncio", True, False), ("trio", True, False), ("asyncio", False, False),
    ("trio", False, False), ("asyncio", True, True), ("trio", False, True)],
    ids=["sync-asyncio", "sync-trio", "async-asyncio", "async-trio", "sync-asyncio-in-place",
         "async-trio-in-place"])
async def test_frames_keep_exact_versions_across_chunked_updates(sync: bool,
                                                                 in_place: bool) -> None:
    """Worker processes stepping while 1-byte chunks of each version arrive (async mode),
    into a receive buffer or (``in_place``) into the model while the rollout waits."""
    from asyncrl import MultiCollector
    from asyncrl.testing import CountingEnv, ValuePolicy, collect_with_updates, version_problems

    policy = ValuePolicy(0.0)
    with anyio.fail_after(120):  # two worker processes on a loaded machine: not a speed bound
        async with MultiCollector([CountingEnv] * 2, policy, sync=sync, frames_per_batch=16,
                                  total_frames=16 * 14,
                                  weight_sync_schemes={"policy": ZmqWeightSyncScheme(
                                      chunk_bytes=1, in_place=in_place)},
                                  ) as collector:
            sender = collector.weight_sender()
            batches, known = await collect_with_updates(collector, policy, sync=sync)
            await collector.update_policy_weights()  # the last one: applied by every worker
            state = await collector.state_dict()  # (in place: waits for a whole model)
    assert version_problems(batches, known) == []
    seen = {int(v) for b in batches for v in b["collector", "policy_version"].reshape(-1)}
    assert len(seen) >= 3
    assert sender.chunks_sent >= 4 * 2 * 3  # 4 one-byte chunks per version per worker
    last = float(next(iter(policy.parameters())).detach())
    assert sorted(state) == ["worker0", "worker1"]
    assert {float(v) for t in leaves(state) for v in t.reshape(-1)} == {last}, state


def leaves(tree: Any) -> list[torch.Tensor]:
    if isinstance(tree, torch.Tensor):
        return [tree]
    return [leaf for value in tree.values() for leaf in leaves(value)]
