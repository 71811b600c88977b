"""A local worker's env code attacks its batch segment (issue #43.6): the trainer survives.

The worker runs the user's env code, which can open ``/dev/shm/asyncrl_...`` and
shrink it, or write a slot while the trainer copies it. Before the fix the
trainer copied out of its own mapping of the segment: a shrunk segment killed it
by SIGBUS (no Python error), and a slot rewritten during the copy was delivered
torn. Now the trainer reads through the segment's descriptor (a short read is a
refusal) and checks the slot's seqlock around its copy.

A SIGBUS would kill pytest itself, so the tests that shrink a segment under the
trainer's receive run it in a child process and read its verdict from stdout
(before the fix the child dies by SIGBUS: exit -7). The coordinator-level test
runs in this process: before the fix it took pytest down with it (checked by hand).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import uuid
from pathlib import Path
from typing import Any

import anyio
import pytest
import torch
from tensordict import TensorDict

import asyncrl._coordinator.shared_batches
from asyncrl._coordinator.batch_sink import BatchSink
from asyncrl._coordinator.coordinator import Coordinator, check_specs
from asyncrl._coordinator.shared_batches import SharedBatches, SlotError
from asyncrl._protocol import (
    PROTOCOL,
    Batch,
    BatchSlots,
    Collect,
    Hello,
    Refuse,
    SharedBatch,
    Welcome,
)
from asyncrl._worker.batch_slots import SlotWriter
from asyncrl._worker.simulated import make_share, make_specs
from tests.asyncrl.collectors.test_shared_batches import (
    FRAMES,
    TOKEN,
    differences,
    offered,
    pixel_share,
    recv_kind,
    segments,
    worker,
)
from tests.asyncrl.coordinator.rules import rules, shm_config
from transports import Hub, Link, SharedTensorBlock, SharedTensorFile

ROOT = Path(__file__).resolve().parents[3]


def shrink(name: str, size: int) -> None:
    """What code in the worker's env can do: open the segment by name and truncate it."""
    fd = os.open(f"/dev/shm/{name}", os.O_RDWR)
    try:
        os.ftruncate(fd, size)
    finally:
        os.close(fd)


def in_child(code: str) -> dict[str, Any]:
    """Run ``code`` (which prints one JSON line last) in a fresh interpreter: a SIGBUS
    there is a failed assertion here, not a dead test run."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode != -signal.SIGBUS, "the trainer's receive died by SIGBUS"
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-3000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


# -- a segment shrunk under the trainer ------------------------------------------------------
def test_a_segment_shrunk_after_the_slot_was_marked_written_is_a_refused_batch() -> None:
    result = in_child("""
        import json, os
        from asyncrl._coordinator.shared_batches import SharedBatches
        from tests.asyncrl.collectors.test_shared_batches import (FRAMES, differences,
                                                                   offered, pixel_share, worker)
        from tests.asyncrl.collectors.test_shared_batches_hostile import shrink
        from tests.asyncrl.coordinator.rules import shm_config

        shared = SharedBatches(shm_config(share_frames=[FRAMES, FRAMES]))
        out = {}
        for case, size in (("empty", 0), ("inside the slot", 4096 + 100)):
            bad, honest = worker(0, b"bad"), worker(1, b"honest")
            offer, writer = offered(shared, pixel_share(5), bad)
            _, other = offered(shared, pixel_share(5), honest)
            notice = writer.write(pixel_share(5, seed=1), 3)
            shrink(offer.name, size)  # after held was set: the notice is on its way
            try:
                shared.receive(bad, notice)
                out[case] = "delivered"
            except Exception as exc:
                out[case] = f"{type(exc).__name__}: {exc}"
            # The run goes on: another worker's slot still reads exactly.
            good = shared.receive(honest, other.write(pixel_share(5, seed=2), 4))
            out[case + " then"] = differences(good.frames, pixel_share(5, seed=2))
            for w in (writer, other):
                w.detach()
            shared.forget(bad.peer); shared.forget(honest.peer)
        shared.close()
        print(json.dumps(out))
    """)
    for case in ("empty", "inside the slot"):
        refusal = result[case]
        assert refusal.startswith("SlotError: shared batch in slot 0 refused: "), refusal
        assert "its writer shrank it" in refusal and "asyncrl_" in refusal, refusal
        assert result[case + " then"] == []


def test_a_segment_shrunk_during_the_copy_is_a_refused_batch() -> None:
    result = in_child("""
        import json
        from asyncrl._coordinator import shared_batches
        from tests.asyncrl.collectors.test_shared_batches import (FRAMES, offered,
                                                                   pixel_share, worker)
        from tests.asyncrl.collectors.test_shared_batches_hostile import shrink
        from tests.asyncrl.coordinator.rules import shm_config

        shared = shared_batches.SharedBatches(shm_config(share_frames=[FRAMES]))
        info = worker()
        offer, writer = offered(shared, pixel_share(5), info)
        notice = writer.write(pixel_share(5, seed=1), 0)
        read_into = shared_batches.SharedTensorFile.read_into
        calls = []

        def shrinking(self, destination, slot, key):
            if len(calls) == 2:  # two tensors copied: the env shrinks the file now
                shrink(offer.name, 4096)
            calls.append(key)
            return read_into(self, destination, slot, key)

        shared_batches.SharedTensorFile.read_into = shrinking
        try:
            shared.receive(info, notice)
            out = "delivered"
        except Exception as exc:
            out = f"{type(exc).__name__}: {exc}"
        print(json.dumps({"refusal": out, "calls": len(calls)}))
    """)
    assert result["calls"] == 3, result
    assert result["refusal"].startswith("SlotError: shared batch in slot 0 refused: "), result
    assert "ends at 4096 bytes, inside slot 0" in result["refusal"], result


# -- a slot rewritten while the trainer copies it ---------------------------------------------
def rewrite(block: SharedTensorBlock, slot: int, value: int, request: int) -> None:
    """A write into ``slot`` as the worker's writer frames it (seqlock odd, copy, even)."""
    control = block.control(slot)
    seq = control[0] + control[0] % 2
    control[0] = seq + 1
    for key, view in block.slot_views(slot).items():
        if key != "held":
            view.view(torch.uint8).fill_(value)
    control[1] = request
    control[0] = seq + 2
    block.slot_views(slot)["held"][0] = 1


def test_a_slot_rewritten_during_the_copy_is_refused_naming_the_slot(
        monkeypatch: pytest.MonkeyPatch) -> None:
    sink = BatchSink(shm_config(share_frames=[FRAMES]))
    shared = sink.shared
    info = worker()
    offer, writer = offered(shared, pixel_share(5), info)
    hostile = SharedTensorBlock.attach(offer.name)  # the env's own mapping of the segment
    read_into = SharedTensorFile.read_into
    keys: list[str] = []

    def rewriting(self: SharedTensorFile, destination: torch.Tensor, slot: int,
                  key: str) -> None:
        keys.append(key)
        read_into(self, destination, slot, key)
        if len(keys) == 1:  # the first tensor is copied: the slot is written again
            rewrite(hostile, slot, 0x22, request=0)

    try:
        notice = writer.write(pixel_share(5, seed=1), 0)
        assert notice is not None
        monkeypatch.setattr(asyncrl._coordinator.shared_batches.SharedTensorFile, "read_into",
                            rewriting)
        with pytest.raises(SlotError, match=rf"shared batch in slot 0 of {offer.name} was "
                                            r"rewritten while the trainer copied it "
                                            r"\(sequence number 2 -> 4\); refused"):
            sink.from_slot(info, notice)
        monkeypatch.undo()
        # Nothing was counted: the refused batch never reached the statistics.
        assert sink.counts()["shared_memory_batches"] == 0
        assert info.arrivals.shared_memory_batches == 0
    finally:
        hostile.close()
        writer.detach()
        shared.close()


def filled(value: int, request: int) -> TensorDict:
    """A [2, 5] share whose every byte is ``value`` (a torn copy mixes two values)."""
    share = pixel_share(5)
    for key, leaf in share.items(include_nested=True, leaves_only=True):
        share.set(key, torch.full_like(leaf.view(torch.uint8), value).view(leaf.dtype))
    return share


def test_a_slot_rewritten_over_and_over_is_never_delivered_torn() -> None:
    """A thread rewrites the slot (framed as the worker's writer frames it) while the
    trainer receives it 30 times: every batch delivered is one whole write, never a mix
    (before the fix most of them mixed two writes)."""
    share = TensorDict({"pixels": torch.zeros(8, 64, 4, 84, 84, dtype=torch.uint8),
                        "reward": torch.zeros(8, 64, 1)}, batch_size=[8, 64])
    shared = SharedBatches(shm_config(share_frames=[8 * 64]))
    info = worker()
    offer, writer = offered(shared, share, info)
    hostile = SharedTensorBlock.attach(offer.name)
    stop = threading.Event()

    def rewrite_forever() -> None:
        value = 1
        while not stop.is_set():
            rewrite(hostile, 0, value, request=0)
            value = value % 250 + 1

    delivered, refused = [], 0
    rewrite(hostile, 0, 0xAA, request=0)
    thread = threading.Thread(target=rewrite_forever, daemon=True)
    thread.start()
    try:
        for _ in range(30):
            hostile.slot_views(0)["held"][0] = 1  # the notice says "written"
            try:
                batch = shared.receive(info, SharedBatch(0, offer.name, 0, 64))
            except SlotError as exc:
                assert "slot 0" in str(exc)
                refused += 1
                continue
            delivered.append({int(v) for leaf in batch.frames.values(True, True)
                              for v in leaf.view(torch.uint8).unique()})
    finally:
        stop.set()
        thread.join(10)
        hostile.close()
        writer.detach()
        shared.close()
    mixed = [values for values in delivered if len(values) != 1]
    assert mixed == [], f"{len(mixed)} of {len(delivered)} delivered batches mix writes"
    assert refused + len(delivered) == 30


# -- a coordinator with a local worker that shrinks its segment --------------------------------
@pytest.mark.anyio
async def test_a_worker_that_shrinks_its_segment_is_refused_and_the_run_goes_on(
        caplog: pytest.LogCaptureFixture) -> None:
    before = segments()
    with anyio.fail_after(60):
        async with Hub(f"inproc://shm-{uuid.uuid4().hex}") as hub, \
                Link(hub.endpoint, identity=b"bad") as bad, \
                Link(hub.endpoint, identity=b"honest") as honest:
            sched = Coordinator(hub, *rules(sync=False, share_frames=[FRAMES, FRAMES],
                                            check_specs=check_specs, token=TOKEN, prefetch=1,
                                            shared_memory_batches=True,
                                            on_worker_loss="continue"))
            async with anyio.create_task_group() as tg:
                tg.start_soon(sched.run)
                indexes = {}
                for slot, link in enumerate((bad, honest)):
                    await link.send(Hello(protocol=PROTOCOL, name=f"w{slot}",
                                          host="h", pid=os.getpid(), specs=make_specs(4),
                                          slot=slot, token=TOKEN).to_body(), kind=Hello.KIND)
                    indexes[link] = Welcome.from_body((await recv_kind(link, Welcome.KIND)
                                                       ).body).index
                for link in (bad, honest):  # first batches cross the socket
                    collect = Collect.from_body((await recv_kind(link, Collect.KIND)).body)
                    await link.send(Batch(collect.request, make_share(
                        FRAMES, 4, worker_id=indexes[link])).to_body(), kind=Batch.KIND)
                offer = BatchSlots.from_body((await recv_kind(bad, BatchSlots.KIND)).body)
                for _ in range(2):
                    await sched.next_batch()
                writer = SlotWriter()
                writer.attach(offer)
                collect = Collect.from_body((await recv_kind(bad, Collect.KIND)).body)
                notice = writer.write(make_share(FRAMES, 4, worker_id=indexes[bad], seq=5),
                                      collect.request)
                assert notice is not None
                shrink(offer.name, 0)  # the env's code, after the slot was marked written
                with caplog.at_level(logging.ERROR, logger="asyncrl"):
                    await bad.send(notice.to_body(), kind=SharedBatch.KIND)
                    refuse = Refuse.from_body((await recv_kind(bad, Refuse.KIND)).body)
                assert f"your batch for request {collect.request} was rejected" in refuse.reason
                assert "shared batch in slot 0 refused" in refuse.reason
                assert "its writer shrank it" in refuse.reason
                assert "sent a bad batch" in caplog.text
                assert offer.name not in segments()  # its segment is unlinked
                # The run goes on with the honest worker.
                collect = Collect.from_body((await recv_kind(honest, Collect.KIND)).body)
                await honest.send(Batch(collect.request, make_share(
                    FRAMES, 4, worker_id=indexes[honest], seq=9)).to_body(), kind=Batch.KIND)
                _, batch = await sched.next_batch()
                assert differences(batch, make_share(FRAMES, 4, worker_id=indexes[honest],
                                                     seq=9)) == []
                assert [w.index for w in sched.roster.live_workers] == [indexes[honest]]
                writer.detach()
                tg.cancel_scope.cancel()
    assert segments() - before == set()
