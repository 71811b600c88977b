"""Local workers' batches through shared memory: bit-identical to the wire, hostile notices.

The trainer's :class:`SharedBatches` and the worker's :class:`SlotWriter` meet here
without processes; the last test runs a real coordinator with a peer that holds a
spawn token (a local worker) and lies in its notices.
"""

from __future__ import annotations

import doctest
import glob
import logging
import os
import uuid
from typing import Any

import anyio
import pytest
import torch
from tensordict import TensorDict, TensorDictBase

import asyncrl._coordinator.shared_batches
import asyncrl._protocol.shared_batches
import asyncrl._worker.batch_slots
from asyncrl._coordinator.coordinator import Coordinator, check_specs
from asyncrl._coordinator.records import WorkerInfo
from asyncrl._coordinator.shared_batches import SharedBatches
from asyncrl._protocol import (
    PROTOCOL,
    Batch,
    BatchSlots,
    Collect,
    Hello,
    SharedBatch,
    Welcome,
)
from asyncrl._worker.batch_slots import SlotWriter
from asyncrl._worker.simulated import make_share, make_specs
from tests.asyncrl.coordinator.rules import rules, run_config, shm_config
from transports import Hub, Link, ProtocolError, SharedMemoryFullError, decode, encode

FRAMES = 10
TOKEN = "spawn-token"


def worker(index: int = 0, peer: bytes = b"w0") -> WorkerInfo:
    return WorkerInfo(index=index, peer=peer, name="w", host="h", pid=1)


def pixel_share(steps: int, *, envs: int = 2, total: int = FRAMES, seed: int = 0) -> TensorDict:
    """A [envs, steps] share with uint8 frames, an extra policy key and a bfloat16 entry."""
    gen = torch.Generator().manual_seed(seed)
    shape = (envs, steps)
    frames = torch.randint(0, 256, (*shape, 4, 8, 8), dtype=torch.uint8, generator=gen)
    return TensorDict({
        "pixels": frames,
        "action": torch.randint(0, 6, shape, generator=gen),
        "sample_log_prob": torch.randn(shape, generator=gen),
        "scale": torch.randn((*shape, 3), generator=gen).to(torch.bfloat16),
        "next": TensorDict({"pixels": frames.flip(-1), "reward": torch.randn((*shape, 1),
                                                                              generator=gen),
                            "done": torch.rand((*shape, 1), generator=gen) < 0.1}, shape),
        "collector": TensorDict({"traj_ids": torch.arange(envs * steps).reshape(shape),
                                 "policy_version": torch.full(shape, 3)}, shape),
    }, batch_size=[envs, steps])


def offered(shared: SharedBatches, first: TensorDictBase, info: WorkerInfo
            ) -> tuple[BatchSlots, SlotWriter]:
    shared.admitted(info.peer, local=True)
    offer = shared.offer(info, first)
    assert offer is not None
    writer = SlotWriter()
    writer.attach(BatchSlots.from_body(offer.to_body()))  # as it arrives: through its wire form
    assert writer.attached
    return offer, writer


def wire(frames: TensorDictBase) -> TensorDictBase:
    body = decode(encode(Batch(7, frames).to_body()))
    return Batch.from_body(body).frames


def differences(a: TensorDictBase, b: TensorDictBase) -> list[str]:
    keys_a = sorted(map(str, a.keys(include_nested=True, leaves_only=True)))
    keys_b = sorted(map(str, b.keys(include_nested=True, leaves_only=True)))
    if keys_a != keys_b or a.batch_size != b.batch_size or a.device != b.device:
        return [f"{keys_a} {a.batch_size} {a.device} != {keys_b} {b.batch_size} {b.device}"]
    problems = []
    for key in a.keys(include_nested=True, leaves_only=True):
        x, y = a.get(key), b.get(key)
        if x.dtype != y.dtype or x.shape != y.shape or not torch.equal(
                x.view(torch.uint8), y.view(torch.uint8)):
            problems.append(f"{key}: {x.dtype} {tuple(x.shape)} vs {y.dtype} {tuple(y.shape)}")
    return problems


def segments() -> set[str]:
    return {os.path.basename(p) for p in glob.glob(f"/dev/shm/asyncrl_{os.getpid()}_*")}


# -- the copy is exact --------------------------------------------------------------------
@pytest.mark.parametrize("steps", [5, 3, 0])
def test_a_batch_through_a_slot_is_bit_identical_to_the_wire(steps: int) -> None:
    shared = SharedBatches(shm_config(share_frames=[FRAMES]))
    info = worker()
    _, writer = offered(shared, pixel_share(5), info)
    try:
        for request, seed in enumerate((1, 2, 3)):  # both slots, then the first again
            share = pixel_share(steps, seed=seed)
            notice = writer.write(share, request)
            assert notice is not None and notice.steps == steps
            got = shared.receive(info, SharedBatch.from_body(notice.to_body()))
            assert got.request == request
            assert differences(got.frames, wire(share)) == []
            assert differences(got.frames, share) == []
    finally:
        writer.detach()
        shared.close()


def test_an_async_worker_gets_a_slot_per_batch_it_may_have_unread() -> None:
    shared = SharedBatches(shm_config(share_frames=[FRAMES], prefetch=3))
    info = worker()
    _, writer = offered(shared, pixel_share(5), info)
    try:
        notices = [writer.write(pixel_share(5, seed=i), i) for i in range(4)]  # none read yet
        assert [n.slot for n in notices if n is not None] == [0, 1, 2, 3]
        for i, notice in enumerate(notices):
            assert notice is not None
            assert differences(shared.receive(info, notice).frames, pixel_share(5, seed=i)) == []
    finally:
        writer.detach()
        shared.close()


def test_the_gathered_batch_owns_its_memory() -> None:
    shared = SharedBatches(shm_config(share_frames=[FRAMES]))
    info = worker()
    _, writer = offered(shared, pixel_share(5), info)
    try:
        first = shared.receive(info, writer.write(pixel_share(5, seed=1), 0))  # type: ignore[arg-type]
        for request in (1, 2):  # the slot of the first batch is written again
            shared.receive(info, writer.write(pixel_share(5, seed=9), request))  # type: ignore[arg-type]
        assert differences(first.frames, pixel_share(5, seed=1)) == []
    finally:
        writer.detach()
        shared.close()


def test_a_batch_that_no_longer_fits_goes_back_to_the_wire(caplog: Any) -> None:
    shared = SharedBatches(shm_config(share_frames=[FRAMES]))
    _, writer = offered(shared, pixel_share(5), worker())
    changed = pixel_share(5)
    changed["extra"] = torch.zeros(2, 5)
    with caplog.at_level(logging.WARNING, logger="asyncrl.worker"):
        assert writer.write(changed, 0) is None
    assert not writer.attached
    assert "does not fit the shared-memory layout" in caplog.text
    shared.close()


# -- hostile notices ----------------------------------------------------------------------
@pytest.mark.parametrize(("change", "error"), [
    ({"name": "asyncrl_1_forged"}, r"segment 'asyncrl_1_forged': worker 0's segment is "
                                   r"asyncrl_\d+_\w+; a worker writes only into the segment"),
    ({"slot": 2}, r"slot 2: the segment has slots 0\.\.1"),
    ({"steps": 6}, r"shared batch of 6 steps: worker 0's share has at most 5"),
    ({"slot": 1}, r"slot 1, which the worker has not written"),
])
def test_a_hostile_notice_is_refused_with_what_was_expected(change: dict[str, Any],
                                                            error: str) -> None:
    shared = SharedBatches(shm_config(share_frames=[FRAMES]))
    info = worker()
    _, writer = offered(shared, pixel_share(5), info)
    notice = writer.write(pixel_share(5), 0)
    assert notice is not None
    body = {**notice.to_body(), **change}
    try:
        with pytest.raises(ProtocolError, match=error):
            shared.receive(info, SharedBatch.from_body(body))
        assert shared.receive(info, notice).frames.batch_size == torch.Size([2, 5])  # still fine
    finally:
        writer.detach()
        shared.close()


def test_a_notice_from_a_worker_never_offered_a_segment_is_refused() -> None:
    shared = SharedBatches(shm_config(share_frames=[FRAMES]))
    with pytest.raises(ProtocolError, match=r"worker 3's segment is none"):
        shared.receive(worker(3, b"x"), SharedBatch(0, "asyncrl_1_ab", 0, 1))


@pytest.mark.parametrize(("change", "error"), [
    ({"name": "/etc/passwd"}, "must be an asyncrl segment name"),
    ({"name": "asyncrl_../x"}, "must be an asyncrl segment name"),
    ({"name": 7}, "'name' must be str"),
    ({"slot": 8}, r"'slot' must be an int in 0\.\.7"),
    ({"slot": -1}, r"'slot' must be an int in 0\.\.7"),
    ({"steps": -1}, r"'steps' must be an int in 0\.\."),
    ({"steps": True}, r"'steps' must be an int"),
    ({"request": "1"}, "'request' must be int"),
])
def test_a_malformed_notice_body_names_the_field(change: dict[str, Any], error: str) -> None:
    body = {**SharedBatch(1, "asyncrl_1_ab", 0, 4).to_body(), **change}
    with pytest.raises(ProtocolError, match=error):
        SharedBatch.from_body(body)


@pytest.mark.parametrize(("keys", "error"), [
    ([["a"] * 9], r"'keys\[0\]' must be list of length <= 8, got list of length 9"),
    ([[]], r"'keys\[0\]' must be list of length >= 1, got list of length 0"),
    ([[1]], r"'keys\[0\]\[0\]' must be str, got int"),
    ("k", r"'keys' must be list"),
    ([["x" * 2000]], r"'keys\[0\]\[0\]' must be str of length <= 1024, got str of length 2000"),
])
def test_a_malformed_offer_is_refused(keys: Any, error: str) -> None:
    with pytest.raises(ProtocolError, match=error):
        BatchSlots.from_body({"name": "asyncrl_1_ab", "keys": keys})


# -- lifetime and fallbacks ----------------------------------------------------------------
def test_segments_are_unlinked_when_a_worker_goes_and_at_close() -> None:
    shared = SharedBatches(shm_config(share_frames=[FRAMES, FRAMES]))
    before = segments()
    a, b = worker(0, b"a"), worker(1, b"b")
    offer_a, writer_a = offered(shared, pixel_share(5), a)
    offer_b, writer_b = offered(shared, pixel_share(5), b)
    assert segments() - before == {offer_a.name, offer_b.name}
    shared.forget(a.peer)  # lost
    assert segments() - before == {offer_b.name}
    shared.admitted(b.peer, local=True)  # admitted again: a fresh segment comes later
    assert segments() - before == set()
    offer_b2, _ = offered(shared, pixel_share(5), b)
    assert offer_b2.name != offer_b.name
    shared.close()
    shared.close()  # idempotent
    assert segments() - before == set()
    for writer in (writer_a, writer_b):
        writer.detach()


def test_remote_workers_and_a_disabled_run_stay_on_the_wire() -> None:
    on = SharedBatches(shm_config(share_frames=[FRAMES]))
    on.admitted(b"r", local=False)
    assert on.offer(worker(0, b"r"), pixel_share(5)) is None
    off = SharedBatches(run_config(share_frames=[FRAMES]))
    off.admitted(b"l", local=True)
    assert off.offer(worker(0, b"l"), pixel_share(5)) is None


def test_a_full_dev_shm_falls_back_to_the_wire_with_one_warning(monkeypatch: Any,
                                                                caplog: Any) -> None:
    def full(*args: Any, **kwargs: Any) -> Any:
        raise SharedMemoryFullError("asyncrl_1_ab", needed=30 << 20, free=1 << 20)

    monkeypatch.setattr(asyncrl._coordinator.shared_batches.SharedTensorFile, "create", full)
    shared = SharedBatches(shm_config(share_frames=[FRAMES, FRAMES]))
    with caplog.at_level(logging.WARNING, logger="asyncrl.coordinator"):
        for index, peer in enumerate((b"a", b"b")):
            shared.admitted(peer, local=True)
            assert shared.offer(worker(index, peer), pixel_share(5)) is None
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "needs 30.0 MiB" in warnings[0] and "--shm-size" in warnings[0]
    assert "shared_memory_batches=False" in warnings[0]


def test_a_slot_the_trainer_never_read_sends_that_batch_over_the_wire(monkeypatch: Any,
                                                                       caplog: Any) -> None:
    monkeypatch.setattr(asyncrl._worker.batch_slots, "HELD_WAIT", 0.05)
    shared = SharedBatches(shm_config(share_frames=[FRAMES]))
    _, writer = offered(shared, pixel_share(5), worker())
    assert writer.write(pixel_share(5), 0) is not None
    assert writer.write(pixel_share(5), 1) is not None
    with caplog.at_level(logging.WARNING, logger="asyncrl.worker"):
        assert writer.write(pixel_share(5), 2) is None  # slot 0 is still held
    assert "has not read shared-memory slot 0" in caplog.text
    writer.detach()
    shared.close()


def test_an_offer_of_a_segment_that_does_not_exist_keeps_the_wire(caplog: Any) -> None:
    writer = SlotWriter()
    with caplog.at_level(logging.WARNING, logger="asyncrl.worker"):
        writer.attach(BatchSlots("asyncrl_1_gone", [("x",)]))
    assert not writer.attached
    assert "does not exist" in caplog.text
    assert writer.write(pixel_share(5), 0) is None


# -- a coordinator with a lying local peer ---------------------------------------------------
async def recv_kind(link: Link, *kinds: str) -> Any:
    while True:
        message = await link.recv()
        if message.kind in kinds:
            return message


@pytest.mark.anyio
async def test_hostile_notices_are_dropped_and_the_run_goes_on(caplog: Any) -> None:
    before = segments()
    with anyio.fail_after(60):
        async with Hub(f"inproc://shm-{uuid.uuid4().hex}") as hub, \
                Link(hub.endpoint, identity=b"local") as peer:
            sched = Coordinator(hub, *rules(sync=False, share_frames=[FRAMES],
                                            check_specs=check_specs, token=TOKEN,
                                            shared_memory_batches=True, prefetch=1))
            async with anyio.create_task_group() as tg:
                tg.start_soon(sched.run)
                await peer.send(Hello(protocol=PROTOCOL, name="local", host="h", pid=os.getpid(),
                                      specs=make_specs(4), slot=0, token=TOKEN).to_body(),
                                kind=Hello.KIND)
                index = Welcome.from_body((await recv_kind(peer, Welcome.KIND)).body).index
                collect = Collect.from_body((await recv_kind(peer, Collect.KIND)).body)
                await peer.send(Batch(collect.request, make_share(FRAMES, 4, worker_id=index))
                                .to_body(), kind=Batch.KIND)
                offer = BatchSlots.from_body((await recv_kind(peer, BatchSlots.KIND)).body)
                assert segments() - before == {offer.name}
                _, first = await sched.next_batch()
                writer = SlotWriter()
                writer.attach(offer)
                collect = Collect.from_body((await recv_kind(peer, Collect.KIND)).body)
                good = writer.write(make_share(FRAMES, 4, worker_id=index, seq=5),
                                    collect.request)
                assert good is not None
                with caplog.at_level(logging.WARNING, logger="asyncrl.coordinator"):
                    for change in ({"name": "asyncrl_1_forged"}, {"slot": 1},
                                   {"steps": FRAMES + 1}, {"name": "nope"}):
                        await peer.send({**good.to_body(), **change}, kind=SharedBatch.KIND)
                    await peer.send(good.to_body(), kind=SharedBatch.KIND)
                    _, batch = await sched.next_batch()
                assert batch["collector", "traj_ids"].tolist() == [[5] * FRAMES]
                assert differences(batch, make_share(FRAMES, 4, worker_id=index, seq=5)) == []
                assert differences(first, make_share(FRAMES, 4, worker_id=index)) == []
                dropped = [r.getMessage() for r in caplog.records if "dropped a bad" in
                           r.getMessage()]
                # One line for the four (rate-limited: hostile input writes few lines).
                assert len(dropped) == 1 and "asyncrl_1_forged" in dropped[0], dropped
                assert "a worker writes only into the segment the trainer offered" in dropped[0]
                assert [w.index for w in sched.roster.live_workers] == [index]  # not even refused
                writer.detach()
                tg.cancel_scope.cancel()
    assert segments() - before == set()  # the run's end unlinks it


def test_doctests() -> None:
    for module in (asyncrl._coordinator.shared_batches, asyncrl._worker.batch_slots,
                   asyncrl._protocol.shared_batches):
        assert doctest.testmod(module).failed == 0
