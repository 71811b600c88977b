"""SharedTensorFile: a block its creator reads through the descriptor, whatever the writer does.

The writer attaches with SharedTensorBlock (the same format) and may shrink the
file or punch holes in it; the creator gets a ProtocolError or zeros, never a
SIGBUS. Nothing here maps the segment in the test process after it was shrunk.
"""

from __future__ import annotations

import ctypes
import doctest
import os
from collections.abc import Iterator

import pytest
import torch

import transports._shm_file
from transports import ProtocolError, SharedTensorBlock, SharedTensorFile


@pytest.fixture
def pair() -> Iterator[tuple[SharedTensorFile, SharedTensorBlock]]:
    block = SharedTensorFile.create({"x": torch.zeros(3, 5, 2, dtype=torch.int16),
                                     "held": torch.zeros(1, dtype=torch.int64)}, slots=2)
    writer = SharedTensorBlock.attach(block.name)
    yield block, writer
    writer.close()
    block.close()
    block.unlink()


def test_a_slot_reads_whole_or_its_first_entries_along_dim_1(
        pair: tuple[SharedTensorFile, SharedTensorBlock]) -> None:
    block, writer = pair
    values = torch.arange(30, dtype=torch.int16).view(3, 5, 2)
    writer.slot_views(1)["x"].copy_(values)
    whole = torch.empty(3, 5, 2, dtype=torch.int16)
    block.read_into(whole, 1, "x")
    assert torch.equal(whole, values)
    first = torch.empty(3, 2, 2, dtype=torch.int16)
    block.read_into(first, 1, "x")
    assert torch.equal(first, values[:, :2])
    region = torch.zeros(3, 4, 2, dtype=torch.int16)[:, 1:3]  # rows of a bigger batch
    block.read_into(region, 1, "x")
    assert torch.equal(region, values[:, :2])
    with pytest.raises(ValueError, match=r"x: destination torch.float32 \[3, 2, 2\] does not "
                                         r"fit the block's torch.int16 \[3, 5, 2\]"):
        block.read_into(torch.empty(3, 2, 2), 1, "x")


def test_control_and_words_are_the_writers(pair: tuple[SharedTensorFile, SharedTensorBlock]
                                            ) -> None:
    block, writer = pair
    control = writer.control(1)
    control[0], control[1] = 4, 77
    writer.slot_views(1)["held"][0] = 1
    assert block.slot_state(1) == (4, 77)
    assert block.read_word(1, "held") == 1
    block.write_word(1, "held", 0)
    assert int(writer.slot_views(1)["held"][0]) == 0
    with pytest.raises(ProtocolError, match=r"slot 2 out of range for a block of 2 slots"):
        block.slot_state(2)


def test_a_shrunk_segment_is_a_short_read_naming_the_slot(
        pair: tuple[SharedTensorFile, SharedTensorBlock]) -> None:
    block, writer = pair
    writer.close()  # this process must not touch its mapping past the new end
    fd = os.open(f"/dev/shm/{block.name}", os.O_RDWR)
    try:
        os.ftruncate(fd, 100)
    finally:
        os.close(fd)
    with pytest.raises(ProtocolError, match=rf"segment {block.name} ends at 100 bytes, inside "
                                            r"slot 1 \(x needs bytes up to \d+; the segment "
                                            r"was made \d+ bytes\): its writer shrank it"):
        block.read_into(torch.empty(3, 5, 2, dtype=torch.int16), 1, "x")
    with pytest.raises(ProtocolError, match=r"inside slot 0 \(control needs"):
        block.slot_state(0)
    block.write_word(1, "held", 1)  # grows the file again: never a fault
    assert block.read_word(1, "held") == 1


def test_a_punched_hole_reads_as_zeros(pair: tuple[SharedTensorFile, SharedTensorBlock]) -> None:
    block, writer = pair
    writer.slot_views(0)["x"].fill_(7)
    writer.close()
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/dev/shm/{block.name}", os.O_RDWR)
    try:
        keep_size_punch_hole = 0x01 | 0x02
        if libc.fallocate(fd, keep_size_punch_hole, ctypes.c_long(0),
                          ctypes.c_long(os.fstat(fd).st_size)) != 0:
            pytest.skip(f"fallocate(PUNCH_HOLE) refused here (errno {ctypes.get_errno()})")
    finally:
        os.close(fd)
    out = torch.ones(3, 5, 2, dtype=torch.int16)
    block.read_into(out, 0, "x")
    assert int(out.abs().sum()) == 0


def test_close_and_unlink_are_idempotent_and_it_does_not_pickle() -> None:
    block = SharedTensorFile.create({"x": torch.zeros(2)}, slots=1)
    with pytest.raises(TypeError, match="does not pickle"):
        block.__reduce__()
    block.close()
    block.close()
    block.unlink()
    block.unlink()
    assert block.closed and not os.path.exists(f"/dev/shm/{block.name}")


def test_doctests() -> None:
    assert doctest.testmod(transports._shm_file).failed == 0
