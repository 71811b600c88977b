"""A local env worker's chunks through its shared-memory ring (``_inference.chunk_ring``).

What the trainer relies on: every chunk arrives once, whole, in the order written,
with TorchRL's keys and the policy's outputs; a worker never overwrites a chunk the
trainer has not taken (it waits for room); a slot mid-write or rewritten during
the read is never returned as a chunk; batches are copied once straight out of the
slots, which are the trainer's only store of a local worker's frames.
"""

from __future__ import annotations

import contextlib
import os

import pytest
import torch
from tensordict import TensorDict

from asyncrl._inference.chunk_buffer import ChunkBuffer, gather
from asyncrl._inference.chunk_ring import (
    ChunkReader,
    ChunkRing,
    ChunkWriter,
    TornChunkError,
    chunk_buffers,
    chunk_layout,
)
from asyncrl._inference.local_channels import ring_slots
from asyncrl._inference.outputs import OutputLayout

OBS = ("observation",)
LAYOUT = chunk_layout([(OBS, torch.float32, (3,))],
                      OutputLayout(action=(torch.float32, (1,)),
                                   extras=[(("loc",), torch.float64, (1,))]))


@pytest.fixture
def ring():
    ring = ChunkRing.create(LAYOUT, rows=2, steps=4, slots=3)
    yield ring
    ring.close()


@contextlib.contextmanager
def _ends(ring: ChunkRing, *, flat: bool = True, on_release=None):
    """A worker's buffers and writer, and the trainer's reader, on ``ring``."""
    buffers = chunk_buffers(ring.layout, rows=ring.rows, steps=ring.steps)
    writer = ChunkWriter(ring.names, buffers)
    reader = ChunkReader(ring, flat=flat, on_release=on_release)
    try:
        yield buffers, writer, reader
    finally:
        writer.close()
        reader.close()


def _fill(buffers: dict, number: int) -> None:
    for tensor in buffers.values():
        if tensor.dtype == torch.bool:
            tensor.fill_(number % 2 == 1)
        else:
            tensor.fill_(number)


def test_the_layout_has_torchrls_keys_and_the_policys_outputs() -> None:
    assert list(LAYOUT) == [
        OBS, ("next", "observation"), ("action",), ("loc",), ("done",), ("terminated",),
        ("truncated",), ("next", "reward"), ("next", "done"), ("next", "terminated"),
        ("next", "truncated"), ("collector", "traj_ids"), ("collector", "policy_version"),
        ("collector", "worker_id")]
    assert LAYOUT[("loc",)] == (torch.float64, (1,))
    assert LAYOUT[("collector", "traj_ids")] == (torch.int64, ())


@pytest.mark.parametrize("flat", [True, False])
def test_every_chunk_arrives_once_whole_and_in_order(ring, flat) -> None:
    with _ends(ring, flat=flat) as (buffers, writer, reader):
        got = []
        for number in range(1, 8):  # more chunks than slots: the slots are reused
            assert writer.has_room()
            _fill(buffers, number)
            assert writer.publish() == number
            if number % 2 == 0:  # the trainer takes whatever is there, now and then
                while (chunk := reader.take()) is not None:
                    got.append(chunk)
        while (chunk := reader.take()) is not None:
            got.append(chunk)
        assert len(got) == 7 and reader.take() is None
        for number, chunk in enumerate(got, start=1):
            assert chunk.batch_size == ((8,) if flat else (2, 4))
            assert {tuple(k) if isinstance(k, tuple) else (k,)
                    for k in chunk.keys(include_nested=True, leaves_only=True)} == set(LAYOUT)
            assert chunk["observation"].shape[-1] == 3
            assert (chunk["next", "reward"] == number).all()
            assert (chunk["loc"] == number).all() and chunk["loc"].dtype == torch.float64
            assert (chunk["collector", "worker_id"] == number).all()
            assert (chunk["next", "done"] == (number % 2 == 1)).all()
        # a clone: the next write into its slot does not change a chunk already taken
        _fill(buffers, 99)
        writer.publish()
        assert (got[-1]["next", "reward"] == 7).all()


def test_a_full_ring_has_no_room_until_the_trainer_takes_a_chunk(ring) -> None:
    with _ends(ring) as (buffers, writer, reader):
        for number in range(1, 4):
            _fill(buffers, number)
            writer.publish()
        assert not writer.has_room()
        assert (reader.take()["next", "reward"] == 1).all()
        assert writer.has_room()
        _fill(buffers, 4)
        writer.publish()
        assert not writer.has_room()
        assert [int(reader.take()["next", "reward"][0]) for _ in range(3)] == [2, 3, 4]
        assert reader.take() is None and writer.has_room()


def test_a_slot_mid_write_is_not_taken(ring) -> None:
    with _ends(ring) as (_buffers, writer, reader):
        writer.publish()
        word = ring.block.control(0)
        word[0] += 1  # odd: a writer (killed, say) in the middle of its copies
        assert reader.take() is None
        word[0] += 1  # even again, same chunk number: the write completed
        assert reader.take() is not None


def test_a_chunk_written_between_the_readers_two_loads_is_not_called_torn(ring) -> None:
    # The reader loads the slot's chunk number and its sequence; the worker may write
    # the chunk between the two loads (the trainer's thread descheduled there). Read
    # in the writer's order (number, then sequence), the sequence is that write's:
    # read first, it was the one before, and the whole chunk was refused as torn
    # (seen once under trio: "chunk 557 was rewritten while it was read").
    with _ends(ring) as (buffers, writer, reader):
        real, fired = reader._words[0], []

        class WrittenMeanwhile:  # the write lands right after the reader's first load
            def __getitem__(self, i):
                value = real[i]
                if not fired:
                    fired.append(i)
                    _fill(buffers, 1)
                    writer.publish()
                return value

        reader._words[0] = WrittenMeanwhile()
        frames = ChunkBuffer(chunk_steps=4, capacity=64, trajectories=False)
        while not frames.fill_from([(0, reader)]):
            pass
        assert fired and frames.take(8)["next", "reward"].flatten().tolist() == [1] * 8


def test_a_slot_rewritten_during_the_read_is_refused(ring) -> None:
    # (trajectories are cut from chunks copied out of the ring as they come)
    with _ends(ring, flat=False) as (_buffers, writer, reader):
        writer.publish()
        word = ring.block.control(0)
        view = reader._views[0]

        class Rewritten:  # the slot's writer comes back while the trainer copies it out
            def clone(self):
                word[0] += 2
                return view.clone()

        reader._views[0] = Rewritten()
        frames = ChunkBuffer(chunk_steps=4, capacity=64, trajectories=True)
        with pytest.raises(TornChunkError, match="env worker 7: chunk 1 was rewritten while "
                                                 "it was read"):
            frames.fill_from([(7, reader)])
        assert frames.buffered == 0


def test_a_held_slot_rewritten_before_its_batch_is_copied_is_refused(ring) -> None:
    # Batches are copied straight out of the slots: a slot its writer rewrote while
    # the trainer held it (the writer broke the protocol) is refused, not handed out.
    with _ends(ring) as (_buffers, writer, reader):
        writer.publish()
        frames = ChunkBuffer(chunk_steps=4, capacity=64, trajectories=False)
        assert frames.fill_from([(7, reader)]) == [7]
        ring.block.control(0)[0] += 2
        with pytest.raises(TornChunkError, match="env worker 7: chunk 1 was rewritten while "
                                                 "it was read"):
            frames.take(8)


def test_the_trainer_holds_chunks_in_their_slots_and_copies_each_batch_out_once(ring) -> None:
    # A local worker's chunks are the buffer's frames where they lie (no copy of the
    # trainer's own): its worker has no room until batches took them; each batch is a
    # copy (the slot written again does not change it), and each freed slot rings the
    # worker's room bell.
    freed = []
    with _ends(ring, on_release=lambda: freed.append(1)) as (buffers, writer, reader):
        for number in range(1, 4):  # 3 slots of 8 frames
            _fill(buffers, number)
            writer.publish()
        frames = ChunkBuffer(chunk_steps=4, capacity=24, trajectories=False)
        assert frames.fill_from([(0, reader)]) == [0, 0, 0]
        assert frames.buffered == 24 and frames.full
        assert not writer.has_room() and freed == []  # held in the ring, not copied out
        batch = frames.take(12)  # chunk 1, half of chunk 2
        assert batch.batch_size == (12,)
        assert batch["next", "reward"].flatten().tolist() == [1] * 8 + [2] * 4
        assert writer.has_room() and freed == [1]  # chunk 1's slot only
        _fill(buffers, 4)
        writer.publish()  # into chunk 1's slot
        assert not writer.has_room()
        assert batch["next", "reward"].flatten().tolist() == [1] * 8 + [2] * 4
        assert (batch["loc"][:8] == 1).all() and batch["loc"].dtype == torch.float64
        assert frames.fill_from([(0, reader)]) == [0]
        rest = frames.take(20)
        assert rest["next", "reward"].flatten().tolist() == [2] * 4 + [3] * 8 + [4] * 8
        assert freed == [1] * 4 and writer.has_room() and frames.buffered == 0


def test_a_ring_with_fewer_slots_than_a_batch_needs_keeps_its_worker_going() -> None:
    # 2 slots of 2 frames and a batch of 8 (a ring holds at most MAX_SLOTS chunks): once
    # both slots are held while the buffer has room, the oldest chunk is copied out
    # and its slot freed, so the worker never waits for frames nobody can take.
    ring = ChunkRing.create(LAYOUT, rows=1, steps=2, slots=2)
    try:
        with _ends(ring) as (buffers, writer, reader):
            frames = ChunkBuffer(chunk_steps=2, capacity=16, trajectories=False)
            for number in range(1, 5):
                assert writer.has_room(), number
                _fill(buffers, number)
                writer.publish()
                assert frames.fill_from([(0, reader)]) == [0]
            assert reader.held == 1 and frames.ready(8)
            batch = frames.take(8)
            assert batch["next", "reward"].flatten().tolist() == [1, 1, 2, 2, 3, 3, 4, 4]
            assert reader.held == 0 and reader.taken == 4
    finally:
        ring.close()


def test_a_batch_of_held_and_own_chunks_is_what_torch_cat_gives(ring) -> None:
    # A remote host's chunk (a message: a chunk of its own) between a local worker's
    # held ones, the batch cut across chunks: keys, order, dtypes and values as
    # torch.cat of the pieces.
    with _ends(ring) as (buffers, writer, reader):
        frames = ChunkBuffer(chunk_steps=4, capacity=64, trajectories=False)
        expected = []
        _fill(buffers, 1)
        writer.publish()
        frames.fill_from([(0, reader)])
        expected.append(reader._views[0].clone())
        remote = reader._views[0].clone().reshape(2, 4).apply(
            lambda t: t if t.dtype == torch.bool else t + 10)
        assert frames.add(5, remote, rows=2) is None
        expected.append(remote.reshape(-1))
        _fill(buffers, 2)
        writer.publish()
        frames.fill_from([(0, reader)])
        expected.append(reader._views[1].clone())
        first, second = frames.take(12), frames.take(12)
        want = torch.cat(expected, 0)
        for got, part in ((first, want[:12]), (second, want[12:])):
            assert list(got.keys(include_nested=True, leaves_only=True)) == list(
                part.keys(include_nested=True, leaves_only=True))
            assert got.batch_size == part.batch_size and got.device == part.device
            for key in part.keys(include_nested=True, leaves_only=True):
                assert got[key].dtype == part[key].dtype
                assert torch.equal(got[key], part[key]), key
        assert frames.buffered == 0 and reader.held == 0


def test_chunks_held_in_a_closing_collectors_rings_are_let_go(ring) -> None:
    with _ends(ring) as (_buffers, writer, reader):
        writer.publish()
        frames = ChunkBuffer(chunk_steps=4, capacity=64, trajectories=False)
        frames.add(5, reader._views[0].clone().reshape(2, 4), rows=2)
        frames.fill_from([(0, reader)])
        assert frames.buffered == 16
        frames.let_go()
        assert frames.buffered == 8 and frames.take(8)["next", "reward"].shape == (8, 1)


def test_buffers_of_another_layout_are_refused(ring) -> None:
    buffers = chunk_buffers(ring.layout, rows=ring.rows, steps=ring.steps)
    buffers[OBS] = torch.zeros(2, 4, 5)
    with pytest.raises(ValueError, match=r"chunk buffer \(2, 4, 5\) float32 does not match "
                                         r"the ring's \(2, 4, 3\) float32"):
        ChunkWriter(ring.names, buffers)


def test_a_buffer_with_room_for_some_takes_one_chunk_per_ring_in_turn() -> None:
    # Three workers' rings hold two chunks each (2 frames a chunk); the buffer has room
    # for 8 frames: it takes 0, 1, 2, 0 (not 0, 0, 1, 1: worker 2 would come last each
    # time the room runs out, and stop), then nothing until a batch is taken.
    rings = [ChunkRing.create(LAYOUT, rows=1, steps=2, slots=2) for _ in range(3)]
    pairs = [_ends(ring) for ring in rings]
    try:
        ends = [p.__enter__() for p in pairs]
        for slot, (buffers, writer, _) in enumerate(ends):
            for number in (1, 2):
                _fill(buffers, 10 * slot + number)
                writer.publish()
        frames = ChunkBuffer(chunk_steps=2, capacity=8, trajectories=False)
        order = [(slot, reader) for slot, (_, _, reader) in enumerate(ends)]
        assert frames.fill_from(order) == [0, 1, 2, 0]
        assert frames.full and frames.fill_from(order) == []
        assert frames.take(4)["next", "reward"].flatten().tolist() == [1, 1, 11, 11]
        assert frames.fill_from(order) == [1, 2]  # what is left, in turn
        assert {s: c.chunks for s, c in frames.counts.items()} == {0: 2, 1: 2, 2: 2}
    finally:
        for p in pairs:
            p.__exit__(None, None, None)
        for ring in rings:
            ring.close()



def _resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_a_dropped_batch_gives_its_memory_back() -> None:
    # A batch's large leaves are mappings of their own: once the trainer drops the batch
    # its pages leave the process. (glibc's heap kept them: after one large block is
    # freed, the next ones of that size come from the heap, which holds them when freed.)
    mib = 1 << 20
    warm = torch.empty(24 * mib, dtype=torch.uint8).fill_(1)
    del warm  # glibc's threshold is now 24 MiB: what comes next of that size is heap
    pieces = [TensorDict({"observation": torch.ones(6 * mib, dtype=torch.uint8)},
                         batch_size=[6 * mib]) for _ in range(4)]
    before = _resident_bytes()
    batch = gather(pieces, 24 * mib)
    assert batch["observation"].shape == (24 * mib,) and bool(batch["observation"].all())
    grown = _resident_bytes() - before
    assert grown > 20 * mib
    del batch
    assert _resident_bytes() - before < 4 * mib


def test_a_ring_holds_its_workers_share_of_one_batch_and_one_chunk_more() -> None:
    # The ring is where its worker's frames wait for a batch (held, not copied): its
    # share of one batch, and a slot for the chunk it finishes while a batch is cut.
    # (Two batches' share, 4 slots for benchmarks.atari, left a batch of them unused.)
    assert ring_slots(1024, workers=8, envs=1, chunk_steps=64) == 3  # 8 x 1 env
    assert ring_slots(1024, workers=2, envs=4, chunk_steps=64) == 3  # 2 x 4 envs
    assert ring_slots(1000, workers=3, envs=2, chunk_steps=64) == 4  # 333 frames: 3 chunks
    assert ring_slots(4, workers=2, envs=1, chunk_steps=2) == 2  # at least two
    assert ring_slots(1000, workers=1, envs=1, chunk_steps=8) == 8  # at most MAX_SLOTS
