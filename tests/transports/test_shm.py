"""Shared-memory tensor blocks: layout, attach by name, seqlock, hostile segments, no leaks.

The torn-read test runs the writer in a separate process that hammers versions
(every tensor filled with the version number) while this process reads: every
read that succeeds must hold exactly one version.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from multiprocessing import shared_memory
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from transports import ProtocolError, TransportError
from transports._shm import SharedTensorBlock, TornReadError
from transports._shm_segment import NAME_PREFIX


def tensors(value: float = 0.0) -> dict[str, torch.Tensor]:
    return {
        "layer.weight": torch.full((64, 32), value),
        "layer.bias": torch.full((64,), value, dtype=torch.float64),
        "steps": torch.full((), value, dtype=torch.int64),
        "half": torch.full((3, 5), value, dtype=torch.bfloat16),
        "empty": torch.zeros(0, 4),
    }


def shm_exists(name: str) -> bool:
    """Whether the segment ``name`` can still be attached: a /dev/shm name, or a sealed
    block's memfd still held at ``/proc/<pid>/fd/<n>``."""
    if "_fd" not in name:
        return Path("/dev/shm", name).exists()
    label, number = name.rsplit("_fd", 1)
    pid = label.split("_")[1]
    try:
        return os.readlink(f"/proc/{pid}/fd/{number}") == f"/memfd:{label} (deleted)"
    except OSError:
        return False


@pytest.fixture(params=[True, False], ids=["sealed", "dev_shm"])
def block(request: pytest.FixtureRequest) -> SharedTensorBlock:
    with SharedTensorBlock.create(tensors(), sealed=request.param) as created:
        yield created


def test_write_then_read_from_an_attached_reader(block: SharedTensorBlock) -> None:
    assert block.latest() is None
    slot, seq = block.write(tensors(3.0), version=3)
    reader = SharedTensorBlock.attach(block.name)
    try:
        assert reader.layout == block.layout
        assert reader.latest() == (slot, seq, 3)
        version, out = reader.read(slot, seq)
        assert version == 3
        for key, expected in tensors(3.0).items():
            assert out[key].dtype == expected.dtype and torch.equal(out[key], expected), key
    finally:
        reader.close()


def test_slots_alternate_and_the_previous_version_stays_readable(block: SharedTensorBlock) -> None:
    first = block.write(tensors(1.0), version=1)
    second = block.write(tensors(2.0), version=2)
    assert first[0] != second[0]
    assert block.read(*first)[0] == 1 and block.read(*second)[0] == 2
    third = block.write(tensors(3.0), version=3)  # overwrites the first slot
    assert third[0] == first[0]
    with pytest.raises(TornReadError, match="overwritten"):
        block.read(*first)


def test_a_read_overlapping_a_write_is_reported_torn(block: SharedTensorBlock) -> None:
    slot, seq = block.write(tensors(1.0), version=1)
    out = {k: torch.empty_like(v) for k, v in tensors().items()}

    class Sneaky(dict):  # rewrites the slot while the reader copies
        def __getitem__(self, key: str) -> torch.Tensor:
            if key == "half":
                block.write(tensors(9.0), version=9, slot=slot)
            return super().__getitem__(key)

    with pytest.raises(TornReadError, match="during the read"):
        block.read_into(Sneaky(out), slot, seq)


def test_write_checks_keys_and_shapes(block: SharedTensorBlock) -> None:
    wrong = tensors()
    wrong["layer.bias"] = torch.zeros(65, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"layer\.bias"):
        block.write(wrong, version=1)
    with pytest.raises(KeyError, match="extra"):
        block.write({**tensors(), "extra": torch.zeros(1)}, version=1)
    assert block.matches(tensors()) and not block.matches(wrong)


def test_readers_do_not_unlink_the_segment_when_they_exit(block: SharedTensorBlock) -> None:
    """Python 3.11's resource_tracker would unlink a segment a reader merely attached to."""
    ctx = mp.get_context("spawn")
    proc = ctx.Process(target=_attach_and_exit, args=(block.name,))
    proc.start()
    proc.join(60)
    assert proc.exitcode == 0
    time.sleep(0.2)  # the child's tracker (if any) has exited by now
    assert shm_exists(block.name)
    SharedTensorBlock.attach(block.name).close()


def _attach_and_exit(name: str) -> None:
    reader = SharedTensorBlock.attach(name)
    reader.close()


@pytest.mark.parametrize("sealed", [True, False])
def test_close_and_unlink_are_idempotent_and_remove_the_segment(sealed: bool) -> None:
    created = SharedTensorBlock.create({"w": torch.zeros(4)}, sealed=sealed)
    name = created.name
    assert name.startswith(NAME_PREFIX) and shm_exists(name)
    created.close()
    created.close()
    created.unlink()
    created.unlink()
    assert not shm_exists(name)
    with pytest.raises(TransportError, match="closed"):
        created.write({"w": torch.ones(4)}, version=1)
    with pytest.raises(TransportError, match="does not exist"):
        SharedTensorBlock.attach(name)


def test_close_with_a_live_view_does_not_crash(block: SharedTensorBlock) -> None:
    reader = SharedTensorBlock.attach(block.name)
    view = reader._views[0]["layer.weight"]  # someone kept a view
    reader.close()
    assert float(view.sum()) == 0.0  # still mapped: the mapping goes away with the view


def test_blocks_do_not_pickle(block: SharedTensorBlock) -> None:
    import pickle

    with pytest.raises(TypeError, match="attach"):
        pickle.dumps(block)


@pytest.mark.parametrize("name", ["not_ours", "asyncrl_../etc", 42, NAME_PREFIX + "x" * 300])
def test_attach_refuses_foreign_names(name: object) -> None:
    with pytest.raises(ProtocolError, match="not an asyncrl block name"):
        SharedTensorBlock.attach(name)  # type: ignore[arg-type]


@pytest.mark.parametrize("damage", ["magic", "slots", "layout_len", "offsets", "layout",
                                    "entry_bounds", "dtype", "tiny"])
def test_attach_rejects_malformed_segments(damage: str) -> None:
    name = f"{NAME_PREFIX}test_{os.getpid()}_{damage}"
    good = SharedTensorBlock.create({"a": torch.zeros(8), "b": torch.zeros(2, 2)}, name=name,
                                    sealed=False)
    header = np.frombuffer(good._mm, dtype=np.int64, count=9)
    layout_offset = int(header[2])
    if damage == "magic":
        header[0] = 0
    elif damage == "slots":
        header[5] = 99
    elif damage == "layout_len":
        header[1] = 0
    elif damage == "offsets":
        header[3] = 1 << 40
    elif damage == "layout":
        good._mm[layout_offset] = 0xC1  # never valid msgpack
    elif damage == "entry_bounds":
        header[4] = 64  # slot smaller than its tensors
    elif damage == "dtype":
        raw = bytes(good._mm[layout_offset:layout_offset + int(header[1])])
        patched = raw.replace(b"float32", b"object_", 1)
        good._mm[layout_offset:layout_offset + len(patched)] = patched
    del header
    if damage == "tiny":
        good.close()
        good.unlink()
        tiny = shared_memory.SharedMemory(name=name, create=True, size=16)
        try:
            with pytest.raises(ProtocolError, match="too small"):
                SharedTensorBlock.attach(name)
        finally:
            tiny.close()
            tiny.unlink()
        return
    try:
        with pytest.raises(ProtocolError):
            SharedTensorBlock.attach(name)
    finally:
        good.close()
        good.unlink()


# ------------------------------------------------------------------ torn reads across processes


VERSIONS = 500


def _hammer(name: str, versions: int, ready: Any, done: Any) -> None:
    block = SharedTensorBlock.attach(name)
    try:
        values = {k: torch.empty(s, dtype=d) for k, (d, s) in block.layout.items()}
        ready.set()
        for version in range(1, versions + 1):
            for tensor in values.values():
                tensor.fill_(version)
            block.write(values, version)
    finally:
        done.set()
        block.close()


@pytest.mark.parametrize("slots", [1, 2])
def test_hammering_writer_never_yields_a_torn_snapshot(slots: int) -> None:
    """Every successful read holds one version in every element of every tensor."""
    layout = {"big": torch.zeros(256, 256), "small": torch.zeros(7),
              "ints": torch.zeros(300, dtype=torch.int32)}
    ctx = mp.get_context("spawn")
    with SharedTensorBlock.create(layout, slots=slots) as block:
        ready, done = ctx.Event(), ctx.Event()
        writer = ctx.Process(target=_hammer, args=(block.name, VERSIONS, ready, done))
        writer.start()
        try:
            assert ready.wait(60), "the writer process did not start"
            out = {k: torch.empty_like(v) for k, v in layout.items()}
            good, torn, last = 0, 0, 0
            deadline = time.monotonic() + 30  # a bound, not a speed assertion
            while not done.is_set() and time.monotonic() < deadline:
                latest = block.latest()
                if latest is None:
                    continue
                slot, seq, _ = latest
                try:
                    version = block.read_into(out, slot, seq)
                except TornReadError:
                    torn += 1
                    continue
                for key, tensor in out.items():
                    assert bool((tensor == version).all()), (
                        f"torn snapshot: {key} holds {tensor.unique().tolist()[:5]} "
                        f"but the slot says version {version}")
                assert version >= last  # latest only moves forward
                last = version
                good += 1
        finally:
            writer.join(60)
        assert writer.exitcode == 0
        print(f"slots={slots}: {good} whole snapshots read, {torn} torn reads caught")
        assert good > 0
        final = block.latest()
        assert final is not None and final[2] == VERSIONS
