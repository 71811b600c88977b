"""A local env worker's chunks through its shared-memory ring (``_inference.chunk_ring``).

What the trainer relies on: every chunk arrives once, whole, in the order written,
with TorchRL's keys and the policy's outputs; a worker never overwrites a chunk the
trainer has not taken (it waits for room); a slot mid-write or rewritten during
the read is never returned as a chunk.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from asyncrl._inference.chunk_buffer import ChunkBuffer
from asyncrl._inference.chunk_ring import (
    ChunkReader,
    ChunkRing,
    ChunkWriter,
    TornChunkError,
    chunk_buffers,
    chunk_layout,
)
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
def _ends(ring: ChunkRing, *, flat: bool = True):
    """A worker's buffers and writer, and the trainer's reader, on ``ring``."""
    buffers = chunk_buffers(ring.layout, rows=ring.rows, steps=ring.steps)
    writer, reader = ChunkWriter(ring.names, buffers), ChunkReader(ring, flat=flat)
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


def test_a_slot_rewritten_during_the_read_is_refused(ring) -> None:
    with _ends(ring) as (_buffers, writer, reader):
        writer.publish()
        word = ring.block.control(0)
        view = reader._views[0]

        class Rewritten:  # the slot's writer comes back while the trainer copies it out
            def clone(self):
                word[0] += 2
                return view.clone()

        reader._views[0] = Rewritten()
        frames = ChunkBuffer(chunk_steps=4, capacity=64, trajectories=False)
        with pytest.raises(TornChunkError, match="env worker 7: chunk 1 was rewritten while "
                                                 "it was read"):
            frames.fill_from([(7, reader)])
        assert frames.buffered == 0


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

